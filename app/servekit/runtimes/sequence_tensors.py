"""The tensors a sequence model (serve.yaml ``sequenceBatching``) has beyond what clients
see: its control inputs and implicit state, which the server fills and keeps
(app/servekit/services/sequences/).

A Python model declares its tensors in serve.yaml, so the control and state tensors are added
to what it declares (it receives them in its inputs dict and returns the new state among its
outputs); a model file (ONNX) has them already. Either way the signature clients see, in
metadata, configuration and the request check, leaves them out.
"""

from __future__ import annotations

from dataclasses import replace

from servekit.config.schema import TensorOverride
from servekit.config.sequences import SequenceBatching
from servekit.types import ModelSignature


def declared_with_sequence(
    inputs: tuple[TensorOverride, ...] | None,
    outputs: tuple[TensorOverride, ...] | None,
    sequence: SequenceBatching,
    max_batch_size: int,
) -> tuple[tuple[TensorOverride, ...] | None, tuple[TensorOverride, ...] | None]:
    """A Python model's declared inputs and outputs with its control and state tensors."""
    if inputs is None:  # tensors from predict's annotations: it names the controls itself
        return inputs, outputs
    batch = [-1] if max_batch_size > 0 else []
    have = {t.name for t in inputs}
    extra_in = [
        TensorOverride(name=c.name, datatype=c.control[0].datatype, shape=[*batch, 1])
        for c in sequence.control_inputs
        if c.name not in have
    ]
    extra_in += [
        TensorOverride(name=s.input_name, datatype=s.datatype, shape=[*batch, *s.dims])
        for s in sequence.state
        if s.input_name not in have
    ]
    have_out = {t.name for t in outputs or ()}
    extra_out = [
        TensorOverride(name=s.output_name, datatype=s.datatype, shape=[*batch, *s.dims])
        for s in sequence.state
        if s.output_name not in have_out
    ]
    return (*inputs, *extra_in), (*(outputs or ()), *extra_out)


def visible(signature: ModelSignature, sequence: SequenceBatching) -> ModelSignature:
    """``signature`` without the tensors the server fills and keeps."""
    hidden_in, hidden_out = sequence.hidden_inputs(), sequence.hidden_outputs()
    return replace(
        signature,
        inputs=tuple(s for s in signature.inputs if s.name not in hidden_in),
        outputs=tuple(s for s in signature.outputs if s.name not in hidden_out),
        default_outputs=None
        if signature.default_outputs is None
        else tuple(n for n in signature.default_outputs if n not in hidden_out),
    )
