"""A model folder without serve.yaml (``servekit serve --model-dir``): the format its files say,
and the one-line refusal of a folder that cannot be served (app/servekit/config/model_dir.py)."""

from __future__ import annotations

import contextlib
import json
import pickle
import subprocess
import sys
import time
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


def _estimator_bytes() -> bytes:
    """A real scikit-learn model as joblib writes it (the bytes KServe's storage would bring)."""
    import io

    import joblib
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    data = np.arange(40, dtype=np.float64).reshape(10, 4)
    buffer = io.BytesIO()
    joblib.dump(LogisticRegression().fit(data, [0, 1] * 5), buffer)
    return buffer.getvalue()


@pytest.mark.slow  # starts servekit serve
@pytest.mark.parametrize(
    ("cut", "words", "workers"),
    [
        (0.5, "model.joblib could not be read as a joblib or pickle file: EOFError", 1),
        (None, "holds a dict, which has no predict method", 1),
        (0.5, "model.joblib could not be read as a joblib or pickle file: EOFError", 2),
    ],
)
def test_a_model_that_does_not_load_stops_the_pod(
    tmp_path: Path, cut: float | None, words: str, workers: int
) -> None:
    """A file that passes the format checks but does not load (truncated; not an estimator)
    stops ``--model-dir`` after its load failed: one line naming the folder's files, exit 1,
    readiness never true while it ran; with a supervisor and its workers too."""
    import httpx
    from servers import start_server

    data = _estimator_bytes()
    body = data[: int(len(data) * cut)] if cut is not None else PICKLE
    folder = _folder(tmp_path, {"model.joblib": body, "README.md": b"iris"})
    argv = [
        sys.executable, "-m", "servekit", "serve", "--model-dir", str(folder),
        "--model-name", "iris", "--host", "127.0.0.1", "--http-port", "0", "--no-grpc",
        "--workers", str(workers),
    ]  # fmt: skip
    if workers > 1:  # the workers never listen: the supervisor's exit is what there is to see
        process = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
        assert process.returncode == 1, process.stdout + process.stderr
        assert "listening" not in process.stdout
        (line,) = [e for e in process.stderr.splitlines() if "did not load" in e]
        assert "files: README.md, model.joblib" in line and words in line, line
        assert "Traceback" not in process.stderr and str(tmp_path) not in line
        return
    server = start_server(tmp_path / "serve.yaml", command=argv, wait_ready=False)
    answers: list[int] = []
    try:
        with server.http_client(timeout=5.0) as client:
            deadline = time.monotonic() + 60
            while server.alive() and time.monotonic() < deadline:
                with contextlib.suppress(httpx.TransportError):
                    answers.append(client.get("/v2/health/ready").status_code)
    finally:
        code = server.stop()
    assert code == 1, server.log()
    assert 200 not in answers
    log = server.log()
    assert "Traceback" not in log
    (line,) = [entry for entry in log.splitlines() if "ERROR" in entry]
    assert "files: README.md, model.joblib" in line and words in line
    assert str(tmp_path) not in line


def test_folder_files_names_the_files_never_the_path(tmp_path: Path) -> None:
    from servekit.config.model_dir import folder_files

    folder = _folder(tmp_path, {"model.joblib": PICKLE, "1/model.onnx": b"\x08"})
    assert folder_files(folder) == "1/, model.joblib"
    assert folder_files(folder / "model.joblib") == "model.joblib"
    assert folder_files(tmp_path / "gone") == "unreadable"
