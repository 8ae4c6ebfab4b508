"""Which files an ONNX model makes onnxruntime read besides itself, and where they may lie.

An ONNX model may keep tensors outside the model file ("external data"): such a tensor names a
``location`` relative to the model file, and onnxruntime opens that file when it creates a
session. A model is data chosen by whoever wrote it (a client, when it was pushed), so its
locations must stay inside the model's own folder: no absolute path, no ``..``, no link leading
out, and not onnxruntime's in-memory marker (``*/_ORT_MEM_ADDR_/*``, which reads process
memory). Recent onnxruntime releases refuse some of these themselves; servekit checks all of them
before any session exists, whatever onnxruntime version is installed, and says why.

The model is parsed with the ``onnx`` package, which never loads external data by itself. The
tensors are walked here because onnx keeps its own walker private; the walk covers every place
a tensor can sit: initializers, sparse initializers, node attributes, subgraphs and functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import onnx

from servekit.errors import InvalidArgument

ORT_MEMORY_MARKER = "_ORT_MEM_ADDR_"


def parse(data: bytes) -> onnx.ModelProto | None:
    """The model in ``data``, or None when it is not ONNX (external data is not loaded)."""
    try:
        return onnx.load_model_from_string(data)
    except Exception:  # protobuf raises DecodeError, RuntimeWarning-like errors and more
        return None


def parse_file(path: Path) -> onnx.ModelProto | None:
    """The model in file ``path`` without its external data, or None when it is not ONNX."""
    try:
        return onnx.load_model(str(path), load_external_data=False)
    except Exception:
        return None


def external_locations(model: onnx.ModelProto) -> list[str]:
    """Every external-data ``location`` the model's tensors name (sorted, each once)."""
    found = set()
    for tensor in _all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
            entries = {e.key: e.value for e in tensor.external_data}
            found.add(entries.get("location", ""))
    return sorted(found)


def location_problem(location: str, folder: Path | None = None) -> str | None:
    """Why ``location`` may not be read by a model in ``folder`` (None: it may).

    Without ``folder`` only the name itself is checked (a pushed model, before its files are
    written); with it, links are followed too.
    """
    shown = repr(location[:200])
    if not location or "\x00" in location:
        return "names an empty location" if not location else f"location {shown} holds NUL"
    if location.startswith("*") or ORT_MEMORY_MARKER in location:
        return f"location {shown} is onnxruntime's in-memory marker, not a file"
    path = PurePosixPath(location)
    if path.is_absolute() or Path(location).is_absolute():
        return f"location {shown} is an absolute path"
    if ".." in path.parts or "\\" in location:
        return f"location {shown} leaves the model's folder ('..' or '\\')"
    if folder is not None:
        root = folder.resolve()
        if not (folder / location).resolve().is_relative_to(root):
            return f"location {shown} leads outside the model's folder through a link"
    return None


def check_model_file(path: Path) -> str | None:
    """Why the model file at ``path`` may not be given to onnxruntime (None: it may), phrased
    to follow the file's name. Only what was checked here reaches onnxruntime: a file the onnx
    package cannot parse is refused rather than handed over unchecked."""
    model = parse_file(path)
    if model is None:
        return "is not a valid ONNX model (protobuf parsing failed)"
    for location in external_locations(model):
        problem = location_problem(location, path.parent)
        if problem is not None:
            return (
                f"has external data that may not be read: {problem} (it must be a file in the "
                "model's own folder)"
            )
    return None


def check_pushed(files: list[tuple[PurePosixPath, bytes]]) -> None:
    """A pushed ONNX model brings, per version folder, one .onnx file that parses as an ONNX
    model and the external data files that model references: nothing else, so a push cannot
    leave other bytes (a pickle, a script) on the server's disk. Checked before anything is
    written."""
    versions: dict[str, dict[PurePosixPath, bytes]] = {}
    for path, data in files:
        versions.setdefault(path.parts[0], {})[path] = data
    for version, items in sorted(versions.items()):
        models = [p for p in items if len(p.parts) == 2 and p.suffix == ".onnx"]
        if len(models) != 1:
            named = ", ".join(f"file:{p}" for p in models) or "none"
            raise InvalidArgument(
                f"version {version}: push exactly one .onnx model file directly in the version "
                f"folder, e.g. file:{version}/model.onnx (got {named})"
            )
        model_path = models[0]
        model = parse(items[model_path])
        if model is None or not model.HasField("graph"):
            raise InvalidArgument(
                f"file:{model_path} is not a valid ONNX model (it does not parse as one); only "
                "ONNX models can be pushed as files"
            )
        others = sorted(p for p in items if p != model_path)
        wanted = set()
        for location in external_locations(model):
            problem = location_problem(location)
            if problem is not None:
                raise InvalidArgument(
                    f"file:{model_path} has external data that may not be read: {problem} (it "
                    "must be a file pushed beside the model)"
                )
            wanted.add(PurePosixPath(version, location))
        extra = [p for p in others if p not in wanted]
        if extra:
            raise InvalidArgument(
                f"file:{extra[0]} is not part of the model: a pushed ONNX model brings its .onnx "
                "file and the external data files it references, nothing else"
            )
        missing = sorted(wanted.difference(items))
        if missing:
            raise InvalidArgument(
                f"file:{model_path} references external data that was not pushed: "
                f"{', '.join(f'file:{p}' for p in missing)}"
            )


def _all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for attribute in node.attribute:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors
        sparse = [attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []
        for item in [*sparse, *attribute.sparse_tensors]:
            yield item.values
            yield item.indices
        if attribute.HasField("g"):
            yield from _graph_tensors(attribute.g)
        for graph in attribute.graphs:
            yield from _graph_tensors(graph)
