"""grps requests, run: select the model, decode the message, infer; and the metadata answers.

:func:`predict` (and :func:`start_stream`, its streaming twin) is the select -> decode -> infer
sequence both grps adapters (HTTP and gRPC) run, so that the two surfaces cannot drift apart.
The protobuf work (decoding, replies, YAML texts) is the codecs' (:mod:`servekit.codecs.grps`,
:mod:`servekit.codecs.grps_reply`); the adapters encode the responses with
``grps_reply.encode_response``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from servekit.codecs import grps_reply
from servekit.codecs.grps_reply import GrpsMessage
from servekit.errors import NotFound, unknown_model
from servekit.services.catalog import Catalog
from servekit.services.dataplane import DataPlane
from servekit.types import InferResponse


async def predict(
    dataplane: DataPlane,
    message: GrpsMessage,
    *,
    query_model: str = "",
    ndarray: object = None,
    arrived: float | None = None,
) -> tuple[str, InferResponse]:
    """Run one grps request; return the kind of its data and the model's response.
    ``arrived`` is as for :meth:`DataPlane.infer`."""
    name, version = select_model(dataplane, message.model or query_model)
    signature = dataplane.signature_of(name, version)
    kind, request = grps_reply.decode_call(message, name, version, signature, ndarray)
    return kind, await dataplane.infer(request, arrived=arrived)


def start_stream(
    dataplane: DataPlane,
    message: GrpsMessage,
    *,
    query_model: str = "",
    ndarray: object = None,
    arrived: float | None = None,
) -> tuple[str, AsyncGenerator[InferResponse, None]]:
    """Start one grps streaming request: the kind of its data and the model's responses (one
    per result of a decoupled model, else one). Selection and decoding fail here, before
    anything streams; the model's own failures surface while iterating."""
    name, version = select_model(dataplane, message.model or query_model)
    signature = dataplane.signature_of(name, version)
    kind, request = grps_reply.decode_call(message, name, version, signature, ndarray)
    return kind, dataplane.infer_stream(request, arrived=arrived)


def readiness(dataplane: DataPlane) -> GrpsMessage:
    """SUCCESS when ready; FAILURE with code 503 and the reason otherwise."""
    return grps_reply.readiness(dataplane.not_ready_reason())


def server_metadata(dataplane: DataPlane, catalog: Catalog) -> str:
    return grps_reply.server_metadata_text(
        dataplane.server_metadata(),
        live=dataplane.live(),
        ready=dataplane.ready(),
        online=dataplane.online,
        default_model=dataplane.default_model(),
        models=catalog.index(),
    )


def model_metadata(dataplane: DataPlane, selector: str) -> str:
    """``selector`` is name or name-version (empty: the default model)."""
    name, version = select_model(dataplane, selector)
    return grps_reply.model_metadata_text(dataplane.model_metadata(name, version))


# -- model selection ----------------------------------------------------------------------------
def select_model(dataplane: DataPlane, model: str) -> tuple[str, str | None]:
    """``name`` or ``name-version`` -> (name, version); empty -> the first model of serve.yaml."""
    if not model:
        default = dataplane.default_model()
        if default is None:
            raise NotFound("serve.yaml lists no model to use by default; name one as name-version")
        return default, None
    names = dataplane.model_names()
    if model in names:  # a name that itself contains '-' wins over a name-version split
        return model, None
    name, dash, version = model.rpartition("-")
    if dash and name in names:
        return name, version or None
    raise unknown_model(model, detail=f"expected name or name-version of {', '.join(names)}")
