"""A model folder without serve.yaml (``servekit serve --model-dir``): the format its files say,
and the one-line refusal of a folder that cannot be served (app/servekit/config/model_dir.py)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from servekit.cli import main
from servekit.config.compiler import compile_plan
from servekit.config.loader import load_config
from servekit.config.model_dir import ModelDirError, model_dir_config, model_dir_config_file

PICKLE = pickle.dumps({"a": 1})


def _folder(tmp_path: Path, files: dict[str, bytes]) -> Path:
    folder = tmp_path / "models"
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def _format(folder: Path, given: str | None = None) -> str:
    entry = model_dir_config(folder, "m", given)["models"][0]
    return str(entry["modelFormat"]["name"])


@pytest.mark.parametrize(
    ("files", "fmt"),
    [
        ({"model.joblib": PICKLE}, "sklearn"),
        ({"model.pkl": PICKLE}, "sklearn"),
        ({"model.bst": b"binf\x00\x00"}, "xgboost"),
        ({"model.json": b'{"learner": {}}'}, "xgboost"),
        ({"model.ubj": b"{L\x00"}, "xgboost"),
        ({"model.txt": b"tree\nversion=v4\n"}, "lightgbm"),
        ({"model.bst": b"tree\nversion=v4\n"}, "lightgbm"),  # KServe's lgbserver's name
        ({"MLmodel": b"flavors: {}\n", "model.pkl": PICKLE, "requirements.txt": b""}, "mlflow"),
        ({"model.onnx": b"\x08\x07"}, "onnx"),
        ({"1/model.onnx": b"\x08\x07", "2/model.onnx": b"\x08\x07"}, "onnx"),
        ({"iris.joblib": PICKLE}, "sklearn"),
    ],
)
def test_the_files_tell_the_format(tmp_path: Path, files: dict[str, bytes], fmt: str) -> None:
    assert _format(_folder(tmp_path, files)) == fmt


def test_a_single_file_is_the_model(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"model.bst": b"binf"})
    config = model_dir_config(folder / "model.bst", "iris")
    assert config["models"][0]["modelFormat"] == {"name": "xgboost"}
    assert config["models"][0]["storageUri"] == str(folder / "model.bst")


def test_mlserver_settings_name_format_and_file(tmp_path: Path) -> None:
    settings = {
        "name": "iris",
        "implementation": "mlserver_xgboost.XGBoostModel",
        "parameters": {"uri": "./model.bst", "version": "v0.1.0"},
    }
    folder = _folder(
        tmp_path, {"model-settings.json": json.dumps(settings).encode(), "model.bst": b"binf"}
    )
    config = model_dir_config(folder, "iris")
    assert config["models"][0]["modelFormat"] == {"name": "xgboost"}
    assert config["models"][0]["storageUri"] == str((folder / "model.bst").resolve())


def test_the_given_format_settles_two(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"model.joblib": PICKLE, "model.txt": b"tree\n"})
    assert _format(folder, "lightgbm") == "lightgbm"
    assert _format(_folder(tmp_path, {"model.bst": b"binf"}), "lightgbm") == "lightgbm"


@pytest.mark.parametrize(
    ("files", "given", "words"),
    [
        ({"notes.txt": b"hi", "data/x.csv": b"1"}, None, "no model file servekit recognises"),
        ({}, None, "files: none"),
        ({"model.joblib": PICKLE, "model.txt": b"tree"}, None, "several formats (lightgbm, sk"),
        ({"model.joblib": b"garbage"}, None, "model.joblib in the model folder is not a joblib"),
        ({"model.joblib": PICKLE}, "onnx", "no onnx model file in the model folder"),
        ({"model.joblib": PICKLE}, "tensorflow", "--model-format 'tensorflow' is not one"),
        ({"model-settings.json": b"{"}, None, "model-settings.json in the model folder cannot"),
        ({"model-settings.json": b'{"implementation": "models.MyModel"}'}, None, "models.MyM"),
        ({"model-settings.json": b'{"implementation": "mlserver_sklearn.SKLearnModel", '
          b'"parameters": {"uri": "../../etc/passwd"}}'}, None, "is not a file of the model"),
    ],
)  # fmt: skip
def test_a_bad_folder_is_one_line_naming_its_files(
    tmp_path: Path, files: dict[str, bytes], given: str | None, words: str
) -> None:
    folder = _folder(tmp_path, files)
    folder.mkdir(exist_ok=True)
    with pytest.raises(ModelDirError) as caught:
        model_dir_config(folder, "m", given)
    text = str(caught.value)
    assert words in text
    assert "\n" not in text and str(tmp_path) not in text
    for name in files:
        if "settings" not in name and "/" not in name and given is None:
            assert name in text


def test_the_config_file_compiles_to_the_plan_of_a_serve_yaml_entry(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"model.joblib": PICKLE})
    path = model_dir_config_file(folder, "isvc-sklearn")
    plan = compile_plan(load_config(path), path.parent)
    (model,) = plan.models
    assert (model.name, model.format_name, model.implementation) == (
        "isvc-sklearn",
        "sklearn",
        "sklearn",
    )
    assert [v.path for v in model.versions] == [folder / "model.joblib"]


def test_serve_refuses_a_bad_folder_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path, {"readme.md": b"x"})
    assert main(["serve", "--model-dir", str(folder), "--model-name", "iris"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("servekit: no model file servekit recognises") and "readme.md" in err
    assert err.count("\n") == 1 and str(tmp_path) not in err
