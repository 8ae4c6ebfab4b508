"""serve.yaml's ``sequenceBatching:``: Triton's ModelSequenceBatching in camelCase.

A stateful model (a tracker, a streaming recogniser, an accumulator) sees the requests of one
sequence, named by the client's correlation ID, on one instance and in order; the server
tells it where a sequence starts and ends through control inputs (START, END, READY, CORRID)
and may keep a per-sequence state tensor for it (``state``, Triton's implicit state). What
runs it is app/servekit/services/sequences/; this module only declares and checks.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from servekit.config.schema_base import Section
from servekit.datatypes import from_config_name, lookup

ControlKind = Literal[
    "CONTROL_SEQUENCE_START",
    "CONTROL_SEQUENCE_READY",
    "CONTROL_SEQUENCE_END",
    "CONTROL_SEQUENCE_CORRID",
]

CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
"""The datatypes a CORRID control may have (Triton's)."""

DEFAULT_IDLE_MICROSECONDS = 1_000_000
"""Triton's default ``max_sequence_idle_microseconds`` (1 s)."""
DEFAULT_CLIENT_SLOT_SHARE = 0.5
"""The share of a model's sequence slots one client address may hold by default (half)."""


class SequenceControl(Section):
    """One control signal (Triton's ModelSequenceBatching.Control): which event, and the
    values the tensor takes when it is false and true (CORRID: the datatype of the ID)."""

    kind: ControlKind
    """CONTROL_SEQUENCE_START (first request of a sequence), _END (last), _READY (this row
    holds a request: always true in servekit, which never runs empty slots) or _CORRID (the
    correlation ID itself)."""
    int32_false_true: list[int] | None = Field(None, min_length=2, max_length=2)
    """The INT32 values for false and true, e.g. [0, 1]."""
    fp32_false_true: list[float] | None = Field(None, min_length=2, max_length=2)
    """The FP32 values for false and true."""
    bool_false_true: list[bool] | None = Field(None, min_length=2, max_length=2)
    """The BOOL values for false and true."""
    data_type: str | None = None
    """CORRID only: TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING."""

    @model_validator(mode="after")
    def _one_form(self) -> SequenceControl:
        lists = [self.int32_false_true, self.fp32_false_true, self.bool_false_true]
        given = sum(1 for x in lists if x is not None)
        if self.kind == "CONTROL_SEQUENCE_CORRID":
            if given or self.data_type not in CORRID_TYPES:
                raise ValueError(
                    f"a CORRID control gives dataType, one of {', '.join(CORRID_TYPES)}, and "
                    "no false/true values"
                )
        elif given != 1 or self.data_type is not None:
            raise ValueError(
                f"{self.kind} gives exactly one of int32FalseTrue, fp32FalseTrue, "
                "boolFalseTrue (the tensor's values for false and true)"
            )
        return self

    @property
    def datatype(self) -> str:
        """The V2 datatype of the control tensor."""
        if self.data_type is not None:
            return from_config_name(self.data_type).name
        if self.int32_false_true is not None:
            return "INT32"
        return "FP32" if self.fp32_false_true is not None else "BOOL"

    def value(self, flag: bool) -> int | float | bool:
        """The tensor's value for ``flag`` (START, END, READY)."""
        for pair in (self.int32_false_true, self.fp32_false_true, self.bool_false_true):
            if pair is not None:
                return pair[int(flag)]
        raise ValueError(f"{self.kind} has no false/true values")


class ControlInput(Section):
    """An input of the model the server fills (Triton's ModelSequenceBatching.ControlInput):
    clients never send it, and metadata does not show it."""

    name: str
    """The model's input name (e.g. START)."""
    control: list[SequenceControl] = Field(min_length=1, max_length=1)
    """The one signal this input carries."""


class SequenceState(Section):
    """Implicit state (Triton's ModelSequenceBatching.State): the model reads the state of
    its sequence from ``inputName`` and writes the next one to ``outputName``; the server keeps
    it between the requests of the sequence (zeros at START). Neither tensor is seen by
    clients."""

    input_name: str
    """The input the state arrives in."""
    output_name: str
    """The output the model returns the updated state in."""
    data_type: str
    """Triton's name (TYPE_INT32, TYPE_FP32, ...) or the V2 datatype."""
    dims: list[Annotated[int, Field(ge=1, le=1 << 24)]] = Field(min_length=1)
    """Shape of one sequence's state, without the batch dimension (fixed sizes)."""

    @property
    def datatype(self) -> str:
        """The V2 datatype of the state tensors."""
        return from_config_name(self.data_type).name


class DirectStrategy(Section):
    """Each sequence holds one batch slot of one instance (maxBatchSize slots per instance,
    one without batching) until it ends or goes idle; more sequences wait for a slot."""

    max_queue_delay_microseconds: int = Field(0, ge=0, le=1_000_000)
    """Accepted for Triton compatibility: servekit runs a batch as soon as its instance is
    free, so it never waits for slots to fill."""
    minimum_slot_utilization: float = Field(0.0, ge=0.0, le=1.0)
    """Accepted for Triton compatibility (see maxQueueDelayMicroseconds)."""


class OldestStrategy(Section):
    """Each instance takes up to maxCandidateSequences sequences; a batch holds the next
    request of its oldest sequences with one waiting."""

    max_candidate_sequences: int = Field(ge=1, le=1 << 20)
    """Sequences one instance holds at a time; more wait for one to end or go idle."""
    preferred_batch_size: list[Annotated[int, Field(ge=1, le=1 << 31)]] = []
    """Accepted for Triton compatibility: a batch takes every sequence with a request
    waiting, up to maxBatchSize."""
    max_queue_delay_microseconds: int = Field(0, ge=0, le=1_000_000)
    """Accepted for Triton compatibility: a batch leaves as soon as its instance is free."""
    preserve_ordering: bool = False
    """Accepted for Triton compatibility: responses of a sequence always come in order."""


class SequenceBatching(Section):
    """Sequence batching (Triton's ModelSequenceBatching): requests carrying a correlation ID
    (`sequence_id`, with `sequence_start` / `sequence_end`) are routed to one instance per
    sequence and run in order."""

    direct: DirectStrategy | None = None
    """The default strategy: one batch slot per sequence."""
    oldest: OldestStrategy | None = None
    """Batch the next requests of the oldest sequences of each instance."""
    max_sequence_idle_microseconds: int = Field(DEFAULT_IDLE_MICROSECONDS, ge=1, le=1 << 62)
    """A sequence without a request for this long is ended and frees its slot; its next
    request without START is refused. Default 1000000 (1 s), as Triton."""
    client_slot_share: float = Field(DEFAULT_CLIENT_SLOT_SHARE, gt=0.0, le=1.0)
    """servekit's own: the share of the model's sequence slots (slots per instance times
    instances) one client address may hold, counting its sequences that hold a slot or wait
    for one, and at least one; a new sequence beyond it is answered 429 / RESOURCE_EXHAUSTED,
    so one client cannot take every slot. The address is the connection's peer (behind a
    proxy, the proxy's: set 1 there). Default 0.5 (half); 1: no bound per client."""
    control_inputs: list[ControlInput] = []
    """Inputs the server fills for each request: START, END, READY, CORRID."""
    state: list[SequenceState] = []
    """Implicit state tensors the server keeps per sequence."""

    @model_validator(mode="after")
    def _consistent(self) -> SequenceBatching:
        if self.direct is not None and self.oldest is not None:
            raise ValueError("give one strategy: direct or oldest")
        names = [c.name for c in self.control_inputs]
        names += [s.input_name for s in self.state]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"input(s) {', '.join(twice)} given twice in sequenceBatching")
        kinds = [c.control[0].kind for c in self.control_inputs]
        again = sorted({k for k in kinds if kinds.count(k) > 1})
        if again:
            raise ValueError(f"control {', '.join(again)} given twice")
        for state in self.state:
            lookup(state.datatype)  # an unknown datatype is refused here, with its name
        return self

    def control(self, kind: ControlKind) -> tuple[str, SequenceControl] | None:
        """The input carrying ``kind``, if the model has one."""
        for item in self.control_inputs:
            if item.control[0].kind == kind:
                return item.name, item.control[0]
        return None

    def hidden_inputs(self) -> frozenset[str]:
        """Inputs the server fills (controls and state): clients neither see nor send them."""
        return frozenset([c.name for c in self.control_inputs] + [s.input_name for s in self.state])

    def hidden_outputs(self) -> frozenset[str]:
        """Outputs the server keeps (state): clients neither see nor get them."""
        return frozenset(s.output_name for s in self.state)

    def slots(self, max_batch_size: int) -> int:
        """Sequences one instance holds at a time."""
        if self.oldest is not None:
            return self.oldest.max_candidate_sequences
        return max(1, max_batch_size)

    def per_client(self, slots: int) -> int | None:
        """Sequences one client address may have in progress, of the model's ``slots`` in all
        (``clientSlotShare``; None: no bound)."""
        if self.client_slot_share >= 1.0:
            return None
        return max(1, int(slots * self.client_slot_share))
