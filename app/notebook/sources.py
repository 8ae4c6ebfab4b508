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
from pathlib import Path
from typing import Any

import orjson

from app.config import ModelConfig, TensorOverride

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
    single file is ``version``.
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
    if numbered:
        return {
            f"{int(folder.name)}/{file.relative_to(folder).as_posix()}": file.read_bytes()
            for folder in numbered
            for file in sorted(folder.rglob("*"))
            if file.is_file()
        }
    files = {
        f"{version}/{file.relative_to(path).as_posix()}": file.read_bytes()
        for file in sorted(path.rglob("*"))
        if file.is_file()
    }
    if not files:
        raise FileNotFoundError(f"no model file in {path}")
    return files


def load_parameters(config: ModelConfig, files: Mapping[str, bytes]) -> dict[str, str]:
    """Parameters of ``POST /v2/repository/models/{name}/load`` (files base64, as over REST)."""
    params = {"config": config_json(config)}
    for key, content in files.items():
        params[f"file:{key}"] = base64.b64encode(content).decode("ascii")
    return params
