"""Runtime selection by KServe's rules and the thread budget, through compile_plan.

Each case is a real serve.yaml in a temporary folder (model files exist, their content does not
matter: compiling never loads a model), compiled the way ``servekit serve`` compiles it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servekit.config.compiler import BUILTIN_RUNTIMES, ServePlan, compile_plan, resolve_options
from servekit.config.loader import ConfigError, load_config
from servekit.config.schema import RuntimeOptions


def compiled(tmp_path: Path, text: str) -> ServePlan:
    (tmp_path / "m.onnx").write_bytes(b"not loaded here")
    file = tmp_path / "serve.yaml"
    file.write_text(text)
    return compile_plan(load_config(file), tmp_path, file)


def refused(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        compiled(tmp_path, text)
    return str(info.value).splitlines()


def model(name: str = "m", fmt: str = "{name: onnx}", extra: str = "") -> str:
    return f"  - name: {name}\n    modelFormat: {fmt}\n    storageUri: m.onnx\n{extra}"


def runtime(name: str, formats: str, implementation: str = "onnxruntime", extra: str = "") -> str:
    return (
        f"  - name: {name}\n    implementation: {implementation}\n"
        f"    supportedModelFormats: {formats}\n{extra}"
    )


def runtime_of(plan: ServePlan, name: str = "m") -> str:
    found = plan.model(name)
    assert found is not None
    return found.runtime


def test_builtin_onnxruntime_is_auto_selected(tmp_path: Path) -> None:
    plan = compiled(tmp_path, "models:\n" + model() + model("v1", "{name: onnx, version: '1'}"))
    assert runtime_of(plan) == runtime_of(plan, "v1") == "onnxruntime"
    assert plan.model("m").implementation == "onnxruntime"  # type: ignore[union-attr]
    assert {r.name for r in plan.runtimes} == {r.name for r in BUILTIN_RUNTIMES}


def test_format_names_match_case_insensitively(tmp_path: Path) -> None:
    assert runtime_of(compiled(tmp_path, "models:\n" + model(fmt="{name: ONNX}"))) == "onnxruntime"


def test_model_format_version_must_be_supported(tmp_path: Path) -> None:
    (line,) = refused(tmp_path, "models:\n" + model(fmt="{name: onnx, version: '2'}"))
    assert line.startswith(f"{tmp_path / 'serve.yaml'}:3: models[0].modelFormat: ")
    assert "no runtime with autoSelect supports format onnx version 2" in line


def test_unknown_format_has_no_candidate(tmp_path: Path) -> None:
    (line,) = refused(tmp_path, "models:\n" + model(fmt="{name: tensorflow}"))
    assert "no runtime with autoSelect supports format tensorflow" in line
    assert "name one with `runtime:`" in line


def test_runtime_format_without_version_supports_any(tmp_path: Path) -> None:
    text = (
        "runtimes:\n"
        + runtime("ort-any", "[{name: onnx, autoSelect: true, priority: 5}]")
        + "models:\n"
        + model(fmt="{name: onnx, version: '17'}")
        + model("plain")
    )
    plan = compiled(tmp_path, text)
    assert runtime_of(plan) == runtime_of(plan, "plain") == "ort-any"


def test_highest_priority_wins(tmp_path: Path) -> None:
    text = (
        "runtimes:\n"
        + runtime("low", "[{name: onnx, autoSelect: true, priority: 2}]")
        + runtime("high", "[{name: onnx, autoSelect: true, priority: 3}]")
        + runtime("not-auto", "[{name: onnx, priority: 9}]")
        + "models:\n"
        + model()
    )
    assert runtime_of(compiled(tmp_path, text)) == "high"


def test_tie_at_the_top_names_the_candidates(tmp_path: Path) -> None:
    text = (
        "runtimes:\n"
        + runtime("a", "[{name: onnx, version: '1', autoSelect: true}]")
        + runtime("b", "[{name: onnx, autoSelect: true}]")
        + "models:\n"
        + model()
        + model("fine", extra="    runtime: b\n")
    )
    (line,) = refused(tmp_path, text)
    assert ":10: models[0].modelFormat:" in line  # the built-in onnxruntime has priority 1 too
    assert "auto-selectable by several runtimes of priority 1: a, b, onnxruntime" in line


def test_one_format_entry_of_several_decides(tmp_path: Path) -> None:
    text = (
        "runtimes:\n"
        + runtime("multi", "[{name: python}, {name: onnx, autoSelect: true, priority: 4}]")
        + "models:\n"
        + model()
    )
    assert runtime_of(compiled(tmp_path, text)) == "multi"


def test_explicit_runtime_need_not_be_auto_selectable(tmp_path: Path) -> None:
    text = "runtimes:\n" + runtime("manual", "[{name: onnx}]") + "models:\n"
    text += model(extra="    runtime: manual\n")
    assert runtime_of(compiled(tmp_path, text)) == "manual"


def test_explicit_runtime_must_exist(tmp_path: Path) -> None:
    (line,) = refused(tmp_path, "models:\n" + model(extra="    runtime: triton\n"))
    assert line.startswith(f"{tmp_path / 'serve.yaml'}:5: models[0].runtime: ")
    known = "lightgbm, mlflow, onnxruntime, python, sklearn, xgboost"
    assert f"runtime 'triton' is not defined; known runtimes: {known}" in line


def test_explicit_runtime_must_support_format_and_version(tmp_path: Path) -> None:
    text = "models:\n" + model(extra="    runtime: python\n")
    text += model("v2", "{name: onnx, version: '2'}", "    runtime: onnxruntime\n")
    lines = refused(tmp_path, text)
    assert len(lines) == 2  # every model's problem at once
    assert "models[0].runtime: runtime 'python' does not support format onnx" in lines[0]
    assert (
        "models[1].runtime: runtime 'onnxruntime' does not support format onnx version 2"
        in (lines[1])
    )


def test_declared_runtime_replaces_the_builtin(tmp_path: Path) -> None:
    text = (
        "runtimes:\n"
        + runtime(
            "onnxruntime",
            "[{name: onnx, autoSelect: true}]",
            extra="    options: {intraOpThreads: 3, graphOptimizationLevel: basic}\n",
        )
        + "models:\n"
        + model(fmt="{name: onnx, version: '9'}")  # the built-in only knew version 1
    )
    plan = compiled(tmp_path, text)
    assert runtime_of(plan) == "onnxruntime"
    assert [r.name for r in plan.runtimes].count("onnxruntime") == 1
    options = plan.model("m").options  # type: ignore[union-attr]
    assert (options.intra_op_threads, options.graph_optimization_level) == (3, "basic")


# --- thread budget -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "instances", "expected"), [(8, 1, 8), (8, 3, 2), (8, 8, 1), (2, 5, 1), (1, 1, 1)]
)
def test_default_threads_share_the_cores(cores: int, instances: int, expected: int) -> None:
    options = resolve_options(RuntimeOptions(), None, cores, instances)
    assert options.intra_op_threads == expected
    assert options.inter_op_threads == 1
    assert options.graph_optimization_level == "all"
    assert options.execution_providers == ("CPUExecutionProvider",)


def test_explicit_options_win_and_model_overrides_runtime() -> None:
    runtime_opts = RuntimeOptions(intra_op_threads=4, inter_op_threads=2, execution_providers=["X"])
    assert resolve_options(runtime_opts, None, 64, 64).intra_op_threads == 4
    model_opts = RuntimeOptions(intra_op_threads=1, graph_optimization_level="disable")
    merged = resolve_options(runtime_opts, model_opts, 64, 1)
    assert merged.intra_op_threads == 1  # the model's own
    assert merged.inter_op_threads == 2  # kept from the runtime
    assert merged.execution_providers == ("X",)
    assert merged.graph_optimization_level == "disable"


def test_compiled_budget_counts_every_instance(tmp_path: Path) -> None:
    text = (
        "runtimes:\n"
        + runtime("tuned", "[{name: onnx}]", extra="    options: {interOpThreads: 2}\n")
        + "models:\n"
        + model("a", extra="    instances: 2\n")
        + model("b", extra="    instances: 3\n    runtimeOptions: {intraOpThreads: 7}\n")
        + model("c", extra="    runtime: tuned\n")
    )
    plan = compiled(tmp_path, text)
    share = max(1, (os.cpu_count() or 1) // 6)
    a, b, c = (plan.model(n) for n in "abc")
    assert a is not None and b is not None and c is not None
    assert (a.instances, a.options.intra_op_threads) == (2, share)
    assert (b.instances, b.options.intra_op_threads) == (3, 7)
    assert (c.options.intra_op_threads, c.options.inter_op_threads) == (share, 2)
