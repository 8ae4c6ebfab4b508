"""What the dataplane works out once per loaded version, so that a request does not.

Every inference request used to look up its version's statistics by (name, version), turn
the version number into text for the answer, and check its inputs against the metadata by
walking the signature's specs with a generator per shape. A :class:`PreparedVersion` is built
with the version's executor (``DataPlane._build_executor``) and holds the results: the
statistics object, the version's text, its request kind's handler (if any), and the input
checks compiled by app/servekit/services/execution/inputs.py (``CompiledInputs``: one tuple
per input, datatype, rank, fixed dimensions), the one module that checks inputs, fast path and
general way.
"""

from __future__ import annotations

from collections.abc import Callable

from servekit.services.execution.inputs import Checked, CompiledInputs
from servekit.services.kinds import Handler
from servekit.services.stats import VersionStats
from servekit.types import InferRequest, ModelSignature


class PreparedVersion:
    """The per-request constants of one loaded version (see the module docstring)."""

    __slots__ = ("check", "handler", "signature", "stats", "tabular", "version_text")

    def __init__(
        self,
        signature: ModelSignature,
        max_batch_size: int,
        stats: VersionStats,
        version: int,
        share_outputs: bool = False,
        handler: Handler | None = None,
    ) -> None:
        """``share_outputs``: the runtime never changes the output-name list it is given
        (``CompiledInputs``). ``handler``: the request kind that answers this version's
        requests (kinds.py; None: a plain model call)."""
        self.handler = handler
        self.signature = signature
        """The signature the checks were compiled from (a request whose runtime reports
        another takes the general way)."""
        self.stats = stats
        self.version_text = str(version)
        self.tabular = signature.tabular is not None
        self.check: Callable[[InferRequest], Checked | None] = CompiledInputs(
            signature, max_batch_size, share_outputs
        ).check
        """The checked request, or None: take the general way (``CompiledInputs.check``,
        kept as its bound method so a request makes one call)."""
