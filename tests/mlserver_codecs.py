"""MLServer's codecs and types, imported without MLServer's server.

``import mlserver`` runs its package ``__init__``, which imports its gRPC server, whose
generated protos register the same ``inference.*`` message names as servekit's in protobuf's
default descriptor pool: in one process with servekit's protos that import fails ("duplicate
symbol 'inference.ServerLiveRequest'"). The codecs and the request/response types need none of
it, so the package is entered here with its folder on ``__path__`` but without running its
``__init__``; the modules are MLServer's own, unmodified (pip ``mlserver==1.7.1``).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

if "mlserver" not in sys.modules:
    spec = importlib.util.find_spec("mlserver")
    assert spec is not None and spec.origin is not None, "pip install mlserver (test extra)"
    package = types.ModuleType("mlserver")
    package.__path__ = [str(Path(spec.origin).parent)]
    sys.modules["mlserver"] = package

from mlserver.codecs import (
    Base64Codec,
    DatetimeCodec,
    NumpyCodec,
    NumpyRequestCodec,
    PandasCodec,
    StringCodec,
)
from mlserver.types import (
    InferenceRequest,
    InferenceResponse,
    RequestInput,
    RequestOutput,
)

__all__ = [
    "Base64Codec",
    "DatetimeCodec",
    "InferenceRequest",
    "InferenceResponse",
    "NumpyCodec",
    "NumpyRequestCodec",
    "PandasCodec",
    "RequestInput",
    "RequestOutput",
    "StringCodec",
]
