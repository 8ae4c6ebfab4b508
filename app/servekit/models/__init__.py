"""Model management: the repository of loaded model versions, the storage of pushed files, the
parsing of pushed configs and the checks on ONNX files. Above runtimes and config, below the
services that answer requests.

For model code: ``servekit.models.infer(name, inputs, version=None)`` (and ``infer_async``)
calls another served model in process (app/servekit/models/calls.py)."""

from servekit.models.calls import infer, infer_async

__all__ = ["infer", "infer_async"]
