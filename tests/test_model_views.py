"""The frozen model views adapters get (servekit.services.ModelView) and the dashboard's pages
built from them, in process: states, the version an unversioned request reaches, metadata per
ready version.

Regression (issue 23, item 3): the dashboard read the state names off the order of the
repository's State enum, so every READY version counted as UNAVAILABLE and the model page lost
its metadata; the browser tests caught it, this test catches it in the fast tier."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_builders
import pytest
from inprocess import Serve

from servekit.dashboard import views
from servekit.services.views import READY, STATES, UNAVAILABLE

pytestmark = pytest.mark.anyio


def write_versions(folder: Path, versions: tuple[int, ...] = (1, 2)) -> None:
    for version in versions:
        path = folder / "models" / "mlp" / str(version) / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(onnx_builders.mlp(seed=version), str(path))


SERVED = """models:
  - {name: mlp, modelFormat: {name: onnx}, storageUri: models/mlp, versionPolicy: {all: {}}}
  - {name: broken, modelFormat: {name: onnx}, storageUri: models/nothing-here}
"""


async def test_views_say_what_serves(serve: Serve, tmp_path: Path) -> None:
    write_versions(tmp_path)
    services = await serve(SERVED)
    catalog = services.catalog
    mlp = catalog.model("mlp")
    assert [(v.number, v.state) for v in mlp.versions] == [(1, READY), (2, READY)]
    assert mlp.serving_version == 2 and mlp.ready_versions() == [1, 2]
    assert all(v.platform == "onnxruntime_onnx" for v in mlp.versions)
    assert {m.name for m in catalog.models()} == {"mlp", "broken"}
    broken = catalog.model("broken")
    assert broken.serving_version is None and broken.reason

    assert views.model_state(mlp) == READY and not views.model_failed(mlp)
    assert views.model_state(broken) == UNAVAILABLE and views.model_failed(broken)
    rows = {(r["name"], r["version"]): r for r in views.index_rows(catalog)}
    assert rows["mlp", "2"]["serves_unversioned"] and not rows["mlp", "1"]["serves_unversioned"]
    assert rows["mlp", "1"]["state"] == READY and rows["broken", ""]["state"] == UNAVAILABLE

    detail = views.model_detail(services.dataplane, catalog, "mlp")
    assert detail["state"] == READY and detail["serving_version"] == 2
    assert set(detail["metadata"]) == {"1", "2"}  # metadata of every ready version
    overview = views.overview(views.Sources(services.dataplane, services.control, catalog))
    assert overview["models_by_state"][READY] == 1
    assert overview["models_by_state"][UNAVAILABLE] == 1
    assert overview["versions_by_state"][READY] == 2
    assert set(overview["models_by_state"]) == set(STATES)
