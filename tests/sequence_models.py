"""Stateful (sequence-batched) models, and a serve.yaml standing in for the model repository
of Triton's sequence example programs (tests/triton_examples/).

``simple_sequence`` is the model those programs are written against, Triton's
docs/examples/model_repository/simple_sequence: INT32 ``INPUT`` [-1, 1] in, ``OUTPUT`` out,
``maxBatchSize: 8``, control inputs START and READY (int32 0/1), and
``OUTPUT = READY * (INPUT + START)`` (its ONNX graph: Add, Mul, Cast). The programs check
exactly that: 1 for the first request of a sequence whose first value is 0, then each value
as sent. The same model answers the integer and the string correlation IDs the programs send.

``accumulate`` keeps Triton's accumulate semantics (the qa "sequence" backend: START sets the
running sum to the input, every other request adds to it, the sum is the output) with
implicit state: the server keeps ``ACC_IN``/``ACC_OUT`` per sequence, the model keeps nothing.
``slow_accumulate`` is the same with two instances and a pause in each call, so requests of
several sequences queue and must still run in order on the instance of their sequence.
``one_slot`` has one slot (no batching, one instance) and a short idle bound.
"""

from __future__ import annotations

from pathlib import Path

MODULE_NAME = "sequence_user_models"

MODULE = '''
import itertools
import time

import numpy as np

_INSTANCES = itertools.count()


class SimpleSequence:
    """Triton's docs example simple_sequence: OUTPUT = READY * (INPUT + START)."""

    def predict(self, inputs):
        return {"OUTPUT": inputs["READY"] * (inputs["INPUT"] + inputs["START"])}


class Accumulate:
    """The running sum of a sequence's inputs (START: the sum starts over at the input),
    kept in the server's implicit state; also which instance ran it and the CORRID given."""

    def __init__(self, pause_s=0.0):
        self.instance = next(_INSTANCES)
        self.pause_s = float(pause_s)

    def predict(self, inputs):
        if self.pause_s:
            time.sleep(self.pause_s)
        start = inputs["START"].astype(bool)  # [rows, 1], or [1] without batching
        total = np.where(start, 0, inputs["ACC_IN"]) + inputs["INPUT"]
        return {
            "OUTPUT": total,
            "ACC_OUT": total,
            "INSTANCE": np.full(total.shape, self.instance, np.int32),
            "SEEN_ID": inputs["CORRID"].astype(np.uint64).reshape(total.shape),
            "SEEN_END": inputs["END"].astype(np.int32).reshape(total.shape),
        }
'''

_CONTROLS = """
      controlInputs:
        - {name: START, control: [{kind: CONTROL_SEQUENCE_START, int32FalseTrue: [0, 1]}]}
        - {name: READY, control: [{kind: CONTROL_SEQUENCE_READY, int32FalseTrue: [0, 1]}]}"""

_ACCUMULATE = """
      controlInputs:
        - {name: START, control: [{kind: CONTROL_SEQUENCE_START, int32FalseTrue: [0, 1]}]}
        - {name: END, control: [{kind: CONTROL_SEQUENCE_END, int32FalseTrue: [0, 1]}]}
        - {name: READY, control: [{kind: CONTROL_SEQUENCE_READY, int32FalseTrue: [0, 1]}]}
        - {name: CORRID, control: [{kind: CONTROL_SEQUENCE_CORRID, dataType: TYPE_UINT64}]}
      state: [{inputName: ACC_IN, outputName: ACC_OUT, dataType: TYPE_INT32, dims: [1]}]
    inputs: [{name: INPUT, datatype: INT32, shape: [-1, 1]}]
    outputs:
      - {name: OUTPUT, datatype: INT32, shape: [-1, 1]}
      - {name: INSTANCE, datatype: INT32, shape: [-1, 1]}
      - {name: SEEN_ID, datatype: UINT64, shape: [-1, 1]}
      - {name: SEEN_END, datatype: INT32, shape: [-1, 1]}"""

EXAMPLES_CONFIG = f"""
models:
  - name: simple_sequence
    modelFormat: {{name: python}}
    entrypoint: {MODULE_NAME}:SimpleSequence
    maxBatchSize: 8
    sequenceBatching:{_CONTROLS}
    inputs: [{{name: INPUT, datatype: INT32, shape: [-1, 1]}}]
    outputs: [{{name: OUTPUT, datatype: INT32, shape: [-1, 1]}}]
"""
"""serve.yaml standing in for the example programs' model repository."""

CONFIG = (
    EXAMPLES_CONFIG
    + f"""
  - name: accumulate
    modelFormat: {{name: python}}
    entrypoint: {MODULE_NAME}:Accumulate
    maxBatchSize: 8
    sequenceBatching:{_ACCUMULATE}
  - name: slow_accumulate
    modelFormat: {{name: python}}
    entrypoint: {MODULE_NAME}:Accumulate
    parameters: {{pause_s: 0.01}}
    instances: 2
    maxBatchSize: 4
    sequenceBatching:
      oldest: {{maxCandidateSequences: 2}}{_ACCUMULATE}
  - name: one_slot
    modelFormat: {{name: python}}
    entrypoint: {MODULE_NAME}:Accumulate
    sequenceBatching:
      maxSequenceIdleMicroseconds: 200000{_ACCUMULATE.replace("-1, ", "")}
"""
)
"""Every model of this module (the fast tests)."""


def write_project(folder: Path, config: str = CONFIG) -> Path:
    """The models and serve.yaml in ``folder``; returns serve.yaml's path."""
    (folder / f"{MODULE_NAME}.py").write_text(MODULE)
    path = folder / "serve.yaml"
    path.write_text(config)
    return path
