"""A ``torch.nn.Module`` exported to ONNX bytes in memory, for ``add_model(name, module, ...)``.

The export is ``torch.onnx.export(..., dynamo=True)``: torch.export captures the module on the
example input and onnxscript translates the graph (``pip install "servekit[torch]"`` brings both
torch and onnxscript). The TorchScript exporter (``dynamo=False``) still exists in torch 2.13
but warns that it is deprecated and will be removed, so servekit does not build on it.

What the caller gets, whatever the module:

- inputs named ``input`` (one) or ``input0``, ``input1``, ... (several), outputs ``output`` or
  ``output0``, ... unless ``input_names`` / ``output_names`` say otherwise;
- the first dimension of every input and output free (``-1``, the batch), unless
  ``dynamic_batch=False``: the model then takes exactly the example's shapes;
- the module exported in eval mode (dropout off, batch norm on its running statistics), and put
  back in the mode it was in afterwards, so a notebook that goes on training is not surprised.

torch is imported only when a module is handed over; whether an object is one is told from its
class's ancestry, so a missing torch or onnxscript is an error that names the extra instead of
a silent fall-through to "not a model".
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

EXTRA = 'pip install "servekit[torch]"'
"""What a missing torch or onnxscript asks for (torch and onnxscript, see pyproject.toml)."""


def is_torch_module(source: object) -> bool:
    """An instance of ``torch.nn.Module`` (or a subclass), told without importing torch."""
    return any(
        cls.__name__ == "Module" and cls.__module__ == "torch.nn.modules.module"
        for cls in type(source).__mro__
    )


def to_onnx(
    module: Any,
    example: Any,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_batch: bool = True,
) -> bytes:
    """ONNX bytes of ``module`` run on ``example``: a tensor or numpy array (one input), or a
    tuple or list of them (one per positional argument of ``forward``)."""
    torch = _import_torch()
    if example is None:
        raise ValueError(
            "a torch.nn.Module is exported by running it once on an example input: pass "
            "example=torch.randn(1, ...) (or a tuple of tensors for several inputs)"
        )
    examples = _examples(torch, module, example)
    inputs = _names("input", input_names, len(examples), "input_names")
    shapes = tuple({0: "batch"} for _ in examples) if dynamic_batch else None
    training = bool(module.training)
    module.eval()
    try:
        with _quiet_exporter():
            program = torch.onnx.export(
                module,
                examples,
                input_names=inputs,
                dynamic_shapes=shapes,
                dynamo=True,
                verbose=False,
            )
    finally:
        module.train(training)
    _rename_outputs(program, output_names)
    data: bytes = program.model_proto.SerializeToString()
    return data


def _import_torch() -> Any:
    """torch, once onnxscript (the exporter's translator, imported by torch only inside the
    export) is known to be there too: a missing one is said before anything slow runs."""
    try:
        torch = importlib.import_module("torch")
        importlib.import_module("onnxscript")
    except ModuleNotFoundError as exc:
        raise ImportError(f"serving a torch.nn.Module needs {exc.name}: {EXTRA}") from None
    return torch


def _examples(torch: Any, module: Any, example: Any) -> tuple[Any, ...]:
    """The example as a tuple of tensors; numpy arrays become tensors, and a float array takes
    the module's floating dtype (numpy's float64 default would not match float32 weights)."""
    items = tuple(example) if isinstance(example, tuple | list) else (example,)
    if not items:
        raise ValueError("example is empty: give one tensor per input of the module")
    floating = next(
        (p.dtype for p in module.parameters() if p.is_floating_point()), torch.get_default_dtype()
    )
    tensors = []
    for index, item in enumerate(items):
        if isinstance(item, torch.Tensor):
            tensors.append(item)
            continue
        try:
            tensor = torch.as_tensor(item)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(
                f"example[{index}] must be a torch.Tensor or a numpy array, got "
                f"{type(item).__name__} ({exc})"
            ) from None
        tensors.append(tensor.to(floating) if tensor.is_floating_point() else tensor)
    return tuple(tensors)


def _names(stem: str, given: Sequence[str] | None, count: int, what: str) -> list[str]:
    """The caller's names, checked against the count, or ``stem`` / ``stem0``, ``stem1``, ..."""
    if given is None:
        return [stem] if count == 1 else [f"{stem}{i}" for i in range(count)]
    names = [given] if isinstance(given, str) else list(given)
    if len(names) != count:
        raise ValueError(f"{what} has {len(names)} name(s) for {count} tensor(s): {names}")
    if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != count:
        raise ValueError(f"{what} must be distinct non-empty strings, got {names}")
    return names


def _rename_outputs(program: Any, output_names: Sequence[str] | None) -> None:
    """Name the graph's outputs (the exporter names them after torch's internal nodes).

    Done on the exported graph (onnx_ir values: renaming one renames every use) because how
    many outputs there are is known only once the module has been captured.
    """
    outputs = list(program.model.graph.outputs)
    for value, name in zip(
        outputs, _names("output", output_names, len(outputs), "output_names"), strict=True
    ):
        value.name = name


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence what torch's exporter says about itself, not about the module: deprecations
    inside torch (FutureWarning/DeprecationWarning raised from torch's own code), the note that
    axes sharing one symbol keep one name, and the log line about torchvision's operators being
    skipped when torchvision is not installed. Warnings about the module's code stay visible."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    hush = _DropTorchvisionNote()
    registration.addFilter(hush)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.")
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.")
            # torch's pytree deprecates LeafSpec and its exporter still copies one; the warning
            # is attributed to copyreg (the copy), not to torch, hence matched by its text.
            warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)`")
            warnings.filterwarnings("ignore", message=r"# The axis name: ")
            yield
    finally:
        registration.removeFilter(hush)


class _DropTorchvisionNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("torchvision is not installed")
