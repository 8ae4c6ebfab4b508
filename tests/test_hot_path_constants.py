"""What the inference hot path works out once instead of per request (issue 28, item 1, round
2) gives the answers the per-request way gave: the serving version kept per model follows
state changes, the compiled input checks accept exactly what the general checks accept, and
small float tensors are range- and finiteness-checked without numpy reductions, NaN and
infinities included."""

from __future__ import annotations

import numpy as np
import pytest

from servekit.codecs import v2_json
from servekit.datatypes import lookup
from servekit.errors import InvalidArgument, ServeError, Unavailable
from servekit.models.repository import ModelEntry, ModelRepository, State, VersionEntry
from servekit.services.execution.inputs import check_request
from servekit.services.prepared import PreparedVersion
from servekit.services.stats import VersionStats
from servekit.types import InferRequest, ModelSignature, RequestedOutput, Tensor, TensorSpec


class _Plan:
    """The two fields of a ModelPlan the version lookup reads."""

    def __init__(self, default_version: int | None = None) -> None:
        self.name = "m"
        self.default_version = default_version
        self.problem = ""


def _repository(entry: ModelEntry) -> ModelRepository:
    repository = ModelRepository.__new__(ModelRepository)
    repository._models = {"m": entry}
    repository.downloads = {}
    return repository


def test_the_kept_serving_version_follows_state_changes() -> None:
    versions = {n: VersionEntry(n, State.READY) for n in (1, 2, 3)}
    versions[3].state = State.LOADING
    entry = ModelEntry(_Plan(), versions)  # type: ignore[arg-type]
    repository = _repository(entry)
    assert repository.resolve("m", None)[1] is versions[2]
    assert repository.resolve("m", None)[1] is versions[2]  # the kept answer
    versions[3].state = State.READY  # a higher version becomes ready: it serves
    assert repository.resolve("m", "")[1] is versions[3]
    versions[3].state = State.UNAVAILABLE  # and falls back when it goes down
    assert repository.resolve("m", None)[1] is versions[2]
    versions[2].state = State.UNLOADING
    assert repository.resolve("m", None)[1] is versions[1]
    versions[1].state = State.UNAVAILABLE
    with pytest.raises(Unavailable, match="is not ready"):
        repository.resolve("m", None)
    versions[1].state = State.READY
    assert repository.resolve("m", "1")[1] is versions[1]  # a named version: as before


def test_a_default_version_is_kept_only_while_ready() -> None:
    versions = {n: VersionEntry(n, State.READY) for n in (1, 2)}
    repository = _repository(ModelEntry(_Plan(default_version=1), versions))  # type: ignore[arg-type]
    assert repository.resolve("m", None)[1] is versions[1]
    versions[1].state = State.UNAVAILABLE  # the default down: refused, never version 2
    with pytest.raises(Unavailable, match="version 1 is unavailable"):
        repository.resolve("m", None)
    versions[1].state = State.READY
    assert repository.resolve("m", None)[1] is versions[1]


SIGNATURE = ModelSignature(
    inputs=(TensorSpec("a", "FP32", (-1, 4)), TensorSpec("b", "INT64", (-1,))),
    outputs=(TensorSpec("y", "FP32", (-1, 2)), TensorSpec("z", "FP32", (-1,))),
)


def _tensor(name: str, datatype: str, shape: tuple[int, ...]) -> Tensor:
    return Tensor(name, datatype, shape, np.zeros(shape, dtype=lookup(datatype).dtype))


CASES = [
    [_tensor("a", "FP32", (2, 4)), _tensor("b", "INT64", (2,))],  # the common request
    [_tensor("b", "INT64", (1,)), _tensor("a", "FP32", (1, 4))],  # another order
    [_tensor("a", "FP32", (2, 4))],  # one missing
    [_tensor("a", "FP32", (2, 4)), _tensor("a", "FP32", (2, 4))],  # one given twice
    [_tensor("a", "FP32", (2, 4)), _tensor("c", "INT64", (2,))],  # an unknown one
    [_tensor("a", "FP64", (2, 4)), _tensor("b", "INT64", (2,))],  # wrong datatype
    [_tensor("a", "FP32", (2, 5)), _tensor("b", "INT64", (2,))],  # wrong fixed dimension
    [_tensor("a", "FP32", (8,)), _tensor("b", "INT64", (2,))],  # wrong rank
    [_tensor("a", "FP32", (9, 4)), _tensor("b", "INT64", (9,))],  # over maxBatchSize
]


def _general(request: InferRequest, batch: int) -> object:
    try:
        feed, wanted, classes, rows = check_request(request, SIGNATURE, batch)
    except ServeError as exc:
        return type(exc), exc.message
    return feed, wanted, classes, rows, [s.name for s in wanted]


@pytest.mark.parametrize("inputs", CASES)
@pytest.mark.parametrize(
    "outputs", [None, [RequestedOutput("z")], [RequestedOutput("nope")]], ids=str
)
@pytest.mark.parametrize("batch", [0, 8])
def test_compiled_checks_agree_with_the_general_checks(
    inputs: list[Tensor], outputs: list[RequestedOutput] | None, batch: int
) -> None:
    request = InferRequest("m", inputs, outputs=outputs)
    prepared = PreparedVersion(SIGNATURE, batch, VersionStats(), 1)
    general = _general(request, batch)
    try:
        fast = prepared.check(request)
    except ServeError as exc:  # only from the outputs, worded by the general code
        fast = (type(exc), exc.message)
    if fast is None:  # the general way is taken: nothing to compare
        return
    assert isinstance(general, tuple) and isinstance(fast, tuple)
    if len(general) == 2:  # refused: refused the same way
        assert fast == general
        return
    assert fast[0].keys() == general[0].keys()  # type: ignore[union-attr]
    assert all(fast[0][k] is general[0][k] for k in general[0])  # type: ignore[index]
    assert fast[1:] == general[1:]


def test_compiled_checks_take_the_common_request() -> None:
    request = InferRequest("m", CASES[0])
    assert PreparedVersion(SIGNATURE, 8, VersionStats(), 1).check(request) is not None
    for inputs in CASES[2:]:  # every refusal is left to the general way, which words it
        assert (
            PreparedVersion(SIGNATURE, 8, VersionStats(), 1).check(InferRequest("m", inputs))
            is None
        )


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_small_float_tensors_read_as_the_general_way_reads_them(datatype: str) -> None:
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(12) * 1000).tolist()
    kind = lookup(datatype)
    array = v2_json.json_data_to_array("x", kind, (3, 4), values)
    expected = np.array(values, dtype=np.float64).astype(kind.dtype).reshape(3, 4)
    assert array.dtype == kind.dtype and np.array_equal(array, expected)


def test_non_finite_and_out_of_range_small_tensors_take_the_general_way() -> None:
    fp32, fp16 = lookup("FP32"), lookup("FP16")
    body = b'{"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1.0, NaN, 2.0]}]}'
    request = v2_json.decode_request(v2_json.loads(body), "m", None)
    assert np.isnan(request.inputs[0].data[1]) and request.inputs[0].data[2] == 2.0
    middle_inf = v2_json.json_data_to_array("x", fp32, (3,), [1.0, float("inf"), 2.0])
    assert np.isinf(middle_inf[1])
    with pytest.raises(InvalidArgument, match="x"):
        v2_json.json_data_to_array("x", fp16, (2,), [1.0, 1e6])  # finite, too large for FP16
    huge = v2_json.json_data_to_array("x", lookup("FP64"), (2,), [1.7e308, 1.7e308])
    assert np.all(np.isfinite(huge))  # a sum that overflows is not a non-finite value


def test_outputs_with_non_finite_values_are_named_in_json() -> None:
    for values in ([1.0, np.nan, 2.0], [np.inf, 0.0], [-np.inf], [3.4e38, 3.4e38]):
        array = np.array(values, dtype=np.float32)
        data = v2_json.output_json_data(Tensor("y", "FP32", array.shape, array))
        if np.all(np.isfinite(array)):  # as it is: orjson writes the float32 values
            assert isinstance(data, np.ndarray) and np.array_equal(data, array)
            continue
        names = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
        assert data == [v if np.isfinite(v) else names[str(v)] for v in array.tolist()]
