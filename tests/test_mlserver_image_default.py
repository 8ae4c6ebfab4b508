"""What servekit's image serves with no CONFIG (its command is ``servekit serve --host 0.0.0.0``
in /srv): /srv/serve.yaml, or, where the environment is MLServer's (KServe's kserve-mlserver
runtime), the MLServer folder ``$MLSERVER_MODELS_DIR`` (/mnt/models) as MLServer's image would
(app/servekit/config/mlserver_project.py ``default_config``). In process; the image itself runs
kserve-mlserver's cases in tests/test_kserve_image_e2e.py."""

from __future__ import annotations

from pathlib import Path

from servekit.config import mlserver_project

KSERVE_ENV = {  # kserve-mlserver.yaml's env and what KServe's SetMlServerDefaults adds
    "MLSERVER_MODEL_IMPLEMENTATION": "mlserver_sklearn.SKLearnModel",
    "MLSERVER_HTTP_PORT": "8080",
    "MLSERVER_GRPC_PORT": "9000",
    "MLSERVER_MODEL_NAME": "isvc-sklearn-v2-runtime",
    "MLSERVER_MODEL_URI": "/mnt/models",
}


def test_without_mlservers_environment_serve_yaml_is_served() -> None:
    assert mlserver_project.default_config({}) == "serve.yaml"
    assert mlserver_project.default_config({"MLSERVER_HTTP_PORT": "8080"}) == "serve.yaml"


def test_kserve_mlservers_environment_serves_the_models_folder() -> None:
    assert mlserver_project.default_config(KSERVE_ENV) == "/mnt/models"
    assert mlserver_project.default_config({"MLSERVER_MODELS_DIR": "/models"}) == "/models"
    moved = {**KSERVE_ENV, "MLSERVER_MODELS_DIR": "/srv/mlserver"}
    assert mlserver_project.default_config(moved) == "/srv/mlserver"


def test_the_folder_kserve_fills_is_a_project_by_the_environment(tmp_path: Path) -> None:
    """KServe's storage initializer leaves only the model file: the environment names it."""
    (tmp_path / "model.joblib").write_bytes(b"\x80\x04N.")  # a pickle (read when loaded)
    assert not mlserver_project.is_project(tmp_path, {})
    assert mlserver_project.is_project(tmp_path, KSERVE_ENV)
    env = {**KSERVE_ENV, "MLSERVER_MODEL_URI": str(tmp_path)}
    config = mlserver_project.load(tmp_path, env)
    (model,) = config.models
    assert model.name == "isvc-sklearn-v2-runtime"
    assert model.model_format.name == "sklearn"
    assert Path(tmp_path, model.storage_uri).resolve() == tmp_path / "model.joblib"
    assert (config.server.http_port, config.server.grpc_port) == (8080, 9000)
    (tmp_path / "serve.yaml").write_text("models: []\n")  # a serve.yaml is served as itself
    assert not mlserver_project.is_project(tmp_path, KSERVE_ENV)
