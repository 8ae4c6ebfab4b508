"""Turn what ``add_model`` is given into a repository load request (Triton's extension, seed 004).

A model file travels as a ``file:<version>/<name>`` parameter (base64 over REST) next to a
``config`` parameter holding the serve.yaml entry of the model as JSON. The entry is validated
here first, so a misspelled option fails in the notebook with pydantic's message instead of as
an HTTP 400 later.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from servekit.config.schema import ModelConfig, TensorOverride
from servekit.formats import onnx_files

TensorsSpec = Iterable[Mapping[str, Any] | tuple[str, str, list[int]] | TensorOverride]


def is_file_source(source: object) -> bool:
    """Sources that go through the repository load API: paths, ONNX bytes, onnx.ModelProto."""
    return isinstance(source, str | os.PathLike | bytes | bytearray | memoryview) or _is_proto(
        source
    )


def _is_proto(source: object) -> bool:
    return callable(getattr(source, "SerializeToString", None)) and hasattr(source, "graph")


def tensors(spec: TensorsSpec | None) -> list[dict[str, Any]] | None:
    """Inputs/outputs given as dicts, ``(name, datatype, shape)`` tuples or TensorOverride."""
    if spec is None:
        return None
    out: list[dict[str, Any]] = []
    for item in spec:
        if isinstance(item, TensorOverride):
            out.append(item.model_dump(exclude_none=True))
        elif isinstance(item, tuple):
            name, datatype, shape = item
            out.append({"name": name, "datatype": datatype, "shape": list(shape)})
        else:
            out.append(dict(item))
    return out


def model_config(
    name: str, model_format: str, fields: Mapping[str, Any], **source: Any
) -> ModelConfig:
    """Validate one model's settings (snake_case or camelCase keys) as a serve.yaml entry."""
    data: dict[str, Any] = {"name": name, "model_format": {"name": model_format}, **source}
    for key, value in fields.items():
        if value is not None:
            data[key] = value
    return ModelConfig.model_validate(data)


def config_json(config: ModelConfig) -> str:
    """The ``config`` load parameter: the serve.yaml entry without its storage location."""
    body = config.model_dump(
        mode="json", by_alias=True, exclude_unset=True, exclude={"storage_uri", "entrypoint"}
    )
    return orjson.dumps(body).decode()


def model_files(source: object, version: int) -> dict[str, bytes]:
    """``<version>/<file name>`` -> content for a path, ONNX bytes or an onnx.ModelProto.

    A folder of numbered version folders sends every version it holds; any other folder or a
    single file is ``version``. From a folder only .onnx files and the external-data files they
    reference are sent.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        return {f"{version}/model.onnx": bytes(source)}
    if _is_proto(source):
        data: bytes = source.SerializeToString()  # type: ignore[attr-defined]
        return {f"{version}/model.onnx": data}
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"expected a path, ONNX bytes or an onnx.ModelProto, got {source!r}")
    path = Path(os.fspath(source)).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}")
    if path.is_file():
        return {f"{version}/model.onnx": path.read_bytes()}
    numbered = [p for p in path.iterdir() if p.is_dir() and p.name.isdigit()]
    folders = {int(folder.name): folder for folder in numbered} or {version: path}
    files = {
        f"{number}/{name}": content
        for number, folder in folders.items()
        for name, content in _model_folder_files(folder).items()
    }
    if not files:
        raise FileNotFoundError(f"no .onnx file in {path}")
    return files


def _model_folder_files(folder: Path) -> dict[str, bytes]:
    """The .onnx files of one version folder and the external-data files they reference: what
    the server accepts in a push (a README or a notebook beside the model stays here)."""
    out: dict[str, bytes] = {}
    for model in sorted(folder.glob("*.onnx")):
        out[model.name] = model.read_bytes()
        proto = onnx_files.parse(out[model.name])
        for location in onnx_files.external_locations(proto) if proto is not None else ():
            data = folder / location
            if data.is_file() and data.resolve().is_relative_to(folder.resolve()):
                out[PurePosixPath(location).as_posix()] = data.read_bytes()
    return out


def load_parameters(config: ModelConfig, files: Mapping[str, bytes]) -> dict[str, str]:
    """Parameters of ``POST /v2/repository/models/{name}/load`` (files base64, as over REST)."""
    params = {"config": config_json(config)}
    for key, content in files.items():
        params[f"file:{key}"] = base64.b64encode(content).decode("ascii")
    return params
