"""``servekit init`` and ``servekit infer``: a first project, and a first request to it.

``init`` writes a commented serve.yaml and a typed starter Python model that ``servekit serve``
serves as written, so the first five minutes need no documentation; ``infer`` sends one V2
request from the shell (``--json`` inputs by name, or ``--data`` numbers for a one-input model)
and prints the outputs as JSON. One command group of app/servekit/cli/ (its ``__init__``
registers them with :func:`register` and hands the parsed arguments to :func:`run`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

COMMANDS = ("init", "infer")

SERVE_YAML = """\
# serve.yaml: what `servekit serve` serves. Every key: `servekit schema`; checks: `servekit
# validate`. Environment variables override it (SERVEKIT_SERVER__HTTPPORT=9000).
server:
  host: 127.0.0.1   # this machine only; 0.0.0.0 opens it to the network (then set a token:
                    # SERVEKIT_TOKEN=... servekit serve, see docs/security.md)
  httpPort: 8000    # REST (KServe V2 / Open Inference Protocol) and the dashboard at /
  grpcPort: 8001    # gRPC (KServe V2); null turns gRPC off
models:
  # A Python function: model.py beside this file, its predict function. Its type hints give
  # the model's inputs and outputs (datatype and shape), which clients read as its metadata.
  - name: starter
    modelFormat: {name: python}
    entrypoint: model:predict
  # An ONNX file (a folder of versions models/NAME/1/model.onnx works too):
  # - name: my-onnx-model
  #   modelFormat: {name: onnx}
  #   storageUri: models/my-onnx-model
"""

MODEL_PY = '''\
"""A starter model for servekit: a linear score of three features.

Replace the body with your own model (load weights at import time, or make a class with
load() and predict()). The type hints are the model's metadata: three FP32 features per row
in, one FP32 score per row out. Try it:

    servekit serve
    servekit infer http://127.0.0.1:8000 starter --data 1,2,3
"""

from typing import Annotated

import numpy as np
from numpy.typing import NDArray

WEIGHTS = np.array([0.5, -0.25, 1.0], dtype=np.float32)
BIAS = np.float32(0.1)


def predict(
    features: Annotated[NDArray[np.float32], (-1, 3)],
) -> Annotated[NDArray[np.float32], (-1,)]:
    """One score per row of ``features`` (rows: a batch; columns: the three features)."""
    return features @ WEIGHTS + BIAS
'''

STARTER_FILES = {"serve.yaml": SERVE_YAML, "model.py": MODEL_PY}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the subcommands of :data:`COMMANDS` to ``servekit``'s parser."""
    init = sub.add_parser(
        "init", help="write a commented serve.yaml and a starter Python model into FOLDER"
    )
    init.add_argument(
        "folder", nargs="?", default=".", help="where to write them (created if missing)"
    )
    infer = sub.add_parser("infer", help="call a model of a running server and print its outputs")
    infer.add_argument("url", help="the server's HTTP URL, e.g. http://127.0.0.1:8000")
    infer.add_argument("model", help="the model's name")
    given = infer.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--json",
        metavar="JSON",
        help="inputs by name, e.g. '{\"features\": [[1, 2, 3]]}' (or a whole V2 request body "
        'with "inputs")',
    )
    given.add_argument(
        "--data",
        metavar="N,N,...",
        help="numbers for a model with one input, shaped by its metadata (e.g. 1,2,3)",
    )
    infer.add_argument("--version", help="the model version (default: the server's choice)")
    infer.add_argument("--token", help="bearer token (default: $SERVEKIT_TOKEN)")


def run(args: argparse.Namespace) -> int:
    from servekit.errors import ServeError

    try:
        if args.command == "init":
            return _init(Path(args.folder))
        return _infer(args)
    except (ConnectionError, ServeError, ValueError, OSError) as exc:
        print(f"servekit: {exc}", file=sys.stderr)
        return 1


def _init(folder: Path) -> int:
    """Write the starter files; refuse (changing nothing) if any of them exists already."""
    existing = [name for name in STARTER_FILES if (folder / name).exists()]
    if existing:
        names = " and ".join(existing)
        print(
            f"servekit: {folder / existing[0]} exists: not overwriting {names} "
            "(init writes a new project; pick an empty folder: servekit init FOLDER)",
            file=sys.stderr,
        )
        return 1
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in STARTER_FILES.items():
        (folder / name).write_text(text, encoding="utf-8")
    where = "" if folder == Path(".") else f"cd {folder} && "
    print(
        f"servekit: wrote {folder / 'serve.yaml'} and {folder / 'model.py'}\n"
        f"  serve it:   {where}servekit serve\n"
        "  call it:    servekit infer http://127.0.0.1:8000 starter --data 1,2,3\n"
        "  dashboard:  http://127.0.0.1:8000/"
    )
    return 0


def _infer(args: argparse.Namespace) -> int:
    from servekit.client import connect

    server = connect(args.url, token=args.token)
    try:
        if args.json is not None:
            inputs = _json_inputs(args.json)
        else:
            inputs = _data_inputs(server.metadata(args.model, args.version), args.data)
        outputs = server.infer(args.model, inputs, version=args.version)
    finally:
        server.close()
    print(json.dumps({name: _plain(array) for name, array in outputs.items()}))
    return 0


def _json_inputs(text: str) -> dict[str, Any]:
    """``{"name": values, ...}``, or a V2 body's ``inputs`` list (name, shape, data)."""
    import numpy as np

    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--json is not JSON: {exc.msg} (at character {exc.pos})") from None
    if not isinstance(given, dict) or not given:
        raise ValueError('--json takes an object of inputs by name, e.g. {"x": [[1, 2, 3]]}')
    if "inputs" not in given:
        return given
    inputs: dict[str, Any] = {}
    for entry in given["inputs"] if isinstance(given["inputs"], list) else [None]:
        if not isinstance(entry, dict) or not {"name", "shape", "data"} <= entry.keys():
            raise ValueError('--json: each of "inputs" needs "name", "shape" and "data"')
        try:
            inputs[str(entry["name"])] = np.reshape(np.asarray(entry["data"]), entry["shape"])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"--json: input {entry['name']!r}: {exc}") from None
    return inputs


def _data_inputs(metadata: dict[str, Any], text: str) -> dict[str, Any]:
    """``1,2,3`` as the model's one input, in its shape (the one variable dimension takes
    what the numbers leave; a model declaring ``[-1, 3]`` gets ``[[1, 2, 3]]``)."""
    import numpy as np

    declared = metadata.get("inputs", [])
    if len(declared) != 1:
        names = ", ".join(t["name"] for t in declared)
        raise ValueError(
            f"--data fills one input, and this model takes {len(declared)} ({names}): "
            "use --json '{\"NAME\": [...], ...}'"
        )
    try:
        values = [float(v) if "." in v or "e" in v.lower() else int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError("--data takes comma-separated numbers, e.g. 1,2,3") from None
    name, shape = declared[0]["name"], [int(d) for d in declared[0].get("shape", [-1])]
    fixed = int(np.prod([d for d in shape if d >= 0])) if shape else 1
    variable = [i for i, d in enumerate(shape) if d < 0]
    if variable and fixed and len(values) % fixed == 0:
        rows = len(values) // fixed
        shape = [rows if i == variable[0] else max(d, 1) for i, d in enumerate(shape)]
    if int(np.prod(shape)) != len(values):
        raise ValueError(
            f"--data: {len(values)} number(s) do not fill input {name!r} "
            f"of shape {declared[0].get('shape')}"
        )
    return {name: np.reshape(np.asarray(values), shape).tolist()}


def _plain(array: Any) -> Any:
    """An output as JSON: nested lists, bytes as text."""
    values = array.tolist() if hasattr(array, "tolist") else array

    def text(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if isinstance(value, list):
            return [text(v) for v in value]
        return value

    return text(values)
