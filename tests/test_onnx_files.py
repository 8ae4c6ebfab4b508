"""app/servekit/formats/onnx_files.py: every tensor that can name external data is found, and
every location
that would leave the model's folder is refused (before onnxruntime sees the model)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data
from repo_helpers import external_data_model

from servekit.errors import InvalidArgument
from servekit.formats import onnx_files


def _external(name: str, location: str) -> TensorProto:
    tensor = numpy_helper.from_array(np.zeros(2, np.float32), name)
    set_external_data(tensor, location)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def test_locations_are_found_wherever_a_tensor_can_sit() -> None:
    sub_graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=_external("c", "in_subgraph.bin"))],
        "sub",
        [],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])],
    )
    nodes = [
        helper.make_node("Constant", [], ["a"], value=_external("a", "in_attribute.bin")),
        helper.make_node("If", ["cond"], ["b"], then_branch=sub_graph, else_branch=sub_graph),
    ]
    sparse = onnx.SparseTensorProto()
    sparse.values.CopyFrom(_external("sv", "sparse_values.bin"))
    sparse.indices.CopyFrom(numpy_helper.from_array(np.array([0], np.int64), "si"))
    sparse.dims.append(2)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])],
        [_external("w", "initializer.bin")],
        sparse_initializer=[sparse],
    )
    function = helper.make_function(
        "local",
        "f",
        [],
        ["d"],
        [helper.make_node("Constant", [], ["d"], value=_external("d", "in_function.bin"))],
        [helper.make_opsetid("", 17)],
    )
    model = helper.make_model(graph, functions=[function])
    assert onnx_files.external_locations(model) == [
        "in_attribute.bin",
        "in_function.bin",
        "in_subgraph.bin",
        "initializer.bin",
        "sparse_values.bin",
    ]


@pytest.mark.parametrize(
    ("location", "fragment"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute path"),
        ("../w.bin", "'..'"),
        ("a/../../w.bin", "'..'"),
        ("a\\..\\w.bin", "'\\'"),
        ("*/_ORT_MEM_ADDR_/*", "in-memory marker"),
        ("w\x00.bin", "NUL"),
    ],
)
def test_locations_that_leave_the_folder(location: str, fragment: str) -> None:
    problem = onnx_files.location_problem(location)
    assert problem is not None and fragment in problem


def test_a_link_leading_out_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outside.bin").write_bytes(b"x")
    folder = tmp_path / "model" / "1"
    folder.mkdir(parents=True)
    (folder / "inside.bin").write_bytes(b"x")
    (folder / "link.bin").symlink_to(tmp_path / "outside.bin")
    assert onnx_files.location_problem("inside.bin", folder) is None
    assert onnx_files.location_problem("sub/missing.bin", folder) is None  # onnxruntime says
    problem = onnx_files.location_problem("link.bin", folder)
    assert problem is not None and "link" in problem


def test_check_model_file(tmp_path: Path) -> None:
    good, weights = external_data_model("w.bin")
    (tmp_path / "good.onnx").write_bytes(good)
    (tmp_path / "w.bin").write_bytes(weights)
    assert onnx_files.check_model_file(tmp_path / "good.onnx") is None
    (tmp_path / "bad.onnx").write_bytes(external_data_model("../w.bin")[0])
    problem = onnx_files.check_model_file(tmp_path / "bad.onnx")
    assert problem is not None and "'..'" in problem
    (tmp_path / "garbage.onnx").write_bytes(b"\x00" * 64)
    assert "not a valid ONNX model" in (
        onnx_files.check_model_file(tmp_path / "garbage.onnx") or ""
    )


def test_check_pushed_accepts_the_model_and_its_data_only() -> None:
    model, weights = external_data_model("sub/w.bin")
    ok = [(PurePosixPath("1/model.onnx"), model), (PurePosixPath("1/sub/w.bin"), weights)]
    onnx_files.check_pushed(ok)
    with pytest.raises(InvalidArgument, match="not part of the model"):
        onnx_files.check_pushed([*ok, (PurePosixPath("1/x.pkl"), b"x")])
    with pytest.raises(InvalidArgument, match="not pushed"):
        onnx_files.check_pushed(ok[:1])
    with pytest.raises(InvalidArgument, match="exactly one"):
        onnx_files.check_pushed([*ok, (PurePosixPath("1/other.onnx"), model)])
    # Each version folder is judged on its own: version 2's file is not version 1's data.
    with pytest.raises(InvalidArgument, match="not part of the model"):
        onnx_files.check_pushed(
            [*ok, (PurePosixPath("2/model.onnx"), model), (PurePosixPath("2/w.bin"), weights)]
        )
