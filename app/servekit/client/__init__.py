"""servekit's client: what talks to a running server over the wire, and nothing of a server.

``servekit.connect(url)`` returns a :class:`RemoteServer` (HTTP with the binary tensor
extension; ``add_model`` converts scikit-learn and PyTorch models to ONNX here, before anything
is sent); the benchmark drives a model over HTTP and gRPC. The notebook's in-process server
(:mod:`servekit.notebook`) and the dashboard's Benchmark button *use* this client for what goes
over the wire. It imports codecs, protos, config and the foundation only (never Litestar, the
server or the services): pyproject.toml's import-linter contracts hold that line.
"""

from __future__ import annotations

from servekit.client.remote import RemoteServer, connect, valid_token

__all__ = ["RemoteServer", "connect", "valid_token"]
