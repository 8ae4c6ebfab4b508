"""Check serve.yaml's pipelines (Triton's ensembles) against the models they run.

A pipeline is refused, with the YAML line of what is wrong, when a step names a model that is
not served, when pipelines run one another in a cycle, when a step's input comes from no
pipeline input or step output, when a pipeline output is made by no step, when two steps (or a
step and the request) make the same tensor, when its steps wait on each other's outputs, when a
pipeline input goes nowhere, and when the datatypes serve.yaml declares on both ends of a
tensor differ. What only a loaded model file can tell (an ONNX model's own datatypes) is
checked when the step runs: the step's error names it
(app/servekit/services/composition/pipelines.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servekit.config.loader import ConfigIssue, line_in_file
from servekit.config.schema import ModelConfig, PipelineStep

PIPELINE_RUNTIME = "ensemble"
"""Runtime and implementation name of a pipeline's plan (app/servekit/runtimes/pipeline.py)."""


def pipeline_issues(models: Sequence[ModelConfig], path: Path | None) -> list[ConfigIssue]:
    """Every problem of every pipeline in ``models`` (empty: all can be served)."""
    by_name = {m.name: m for m in models}
    issues: list[ConfigIssue] = []
    for index, model in enumerate(models):
        if model.pipeline is not None:
            issues.extend(_Checker(index, model, by_name, path).issues())
    issues.extend(_cycles(models, path))
    return issues


def step_version_issues(
    models: Sequence[ModelConfig], loaded: Mapping[str, set[int] | None], path: Path | None
) -> list[ConfigIssue]:
    """A step naming a version its model's version policy does not load: the pipeline would
    never be READY (``servekit validate``). ``loaded``: each model's versions the policy loads
    (None: not known before serving, as for remote storage)."""
    issues = []
    for index, model in enumerate(models):
        for j, step in enumerate(model.pipeline or ()):
            versions = loaded.get(step.model)
            if step.version is None or versions is None or step.version in versions:
                continue
            where = ["models", index, "pipeline", j, "version"]
            shown = ", ".join(str(v) for v in sorted(versions)) or "none"
            issues.append(
                ConfigIssue(
                    f"models[{index}].pipeline[{j}].version",
                    line_in_file(path, where),
                    f"step {j} runs model {step.model!r} version {step.version}, which its "
                    f"version policy does not load (it loads: {shown}); the pipeline would "
                    "never be ready",
                )
            )
    return issues


def step_order(steps: Sequence[PipelineStep], inputs: Sequence[str]) -> list[int] | None:
    """Indexes of ``steps`` in an order where each step's inputs are the pipeline's ``inputs``
    or earlier steps' outputs (None: some steps wait on each other)."""
    available = set(inputs)
    order: list[int] = []
    waiting = list(range(len(steps)))
    while waiting:
        ready = [i for i in waiting if set(steps[i].inputs.values()) <= available]
        if not ready:
            return None
        for i in ready:
            order.append(i)
            available.update(steps[i].outputs.values())
        waiting = [i for i in waiting if i not in ready]
    return order


class _Checker:
    """The checks of one pipeline, each issue at its line."""

    def __init__(
        self, index: int, model: ModelConfig, by_name: dict[str, ModelConfig], path: Path | None
    ) -> None:
        self.index = index
        self.model = model
        self.by_name = by_name
        self.path = path
        self.found: list[ConfigIssue] = []

    def add(self, loc: list[Any], message: str) -> None:
        where = ["models", self.index, *loc]
        shown = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where[2:])
        line = line_in_file(self.path, where)
        self.found.append(ConfigIssue(f"models[{self.index}]{shown}", line, message))

    def issues(self) -> list[ConfigIssue]:
        steps = self.model.pipeline or []
        name = self.model.name
        declared = {t.name: t.datatype for t in self.model.inputs or ()}
        types: dict[str, str | None] = dict(declared)  # tensor -> datatype, where known
        made_by: dict[str, int] = {}
        for j, step in enumerate(steps):
            target = self.by_name.get(step.model)
            if step.model == name:
                self.add(["pipeline", j, "model"], f"pipeline {name!r} cannot run itself")
            elif target is None:
                known = ", ".join(sorted(n for n in self.by_name if n != name)) or "none"
                self.add(
                    ["pipeline", j, "model"],
                    f"step {j} runs model {step.model!r}, which serve.yaml does not serve "
                    f"(models: {known})",
                )
            elif target.load == "onDemand":
                self.add(
                    ["pipeline", j, "model"],
                    f"step {j} runs model {step.model!r}, which is load: onDemand; a "
                    "pipeline's steps load at start (a pipeline is ready when they are)",
                )
            for own, tensor in step.outputs.items():
                if tensor in declared:
                    self.add(
                        ["pipeline", j, "outputs", own],
                        f"tensor {tensor!r} is a pipeline input; step {j} cannot make it too",
                    )
                elif tensor in made_by:
                    self.add(
                        ["pipeline", j, "outputs", own],
                        f"tensor {tensor!r} is made by step {made_by[tensor]} already",
                    )
                else:
                    made_by[tensor] = j
                    types[tensor] = _declared(target, "outputs", own)
                self._check_name(j, target, "outputs", own)
        self._check_flow(steps, declared, made_by, types)
        return self.found

    def _check_flow(
        self,
        steps: list[PipelineStep],
        declared: dict[str, str | None],
        made_by: dict[str, int],
        types: dict[str, str | None],
    ) -> None:
        used: set[str] = set()
        for j, step in enumerate(steps):
            target = self.by_name.get(step.model)
            for own, tensor in step.inputs.items():
                used.add(tensor)
                self._check_name(j, target, "inputs", own)
                if tensor not in types:
                    self.add(
                        ["pipeline", j, "inputs", own],
                        f"step {j} input {own!r} takes tensor {tensor!r}, which is no pipeline "
                        "input and no step's output (unmapped)",
                    )
                    continue
                want, have = _declared(target, "inputs", own), types[tensor]
                if want is not None and have is not None and want != have:
                    self.add(
                        ["pipeline", j, "inputs", own],
                        f"step {j} input {own!r} of model {step.model!r} is {want}, but tensor "
                        f"{tensor!r} is {have}",
                    )
        for k, output in enumerate(self.model.outputs or ()):
            if output.name not in made_by:
                self.add(["outputs", k, "name"], f"no step makes pipeline output {output.name!r}")
                continue
            have = types.get(output.name)
            if have is not None and output.datatype != have:
                maker = made_by[output.name]
                self.add(
                    ["outputs", k, "datatype"],
                    f"pipeline output {output.name!r} is {output.datatype}, but step {maker} "
                    f"makes it {have}",
                )
        for k, given in enumerate(self.model.inputs or ()):
            if given.name not in used:
                self.add(["inputs", k, "name"], f"no step takes pipeline input {given.name!r}")
        all_there = all(set(s.inputs.values()) <= types.keys() for s in steps)
        if all_there and step_order(steps, list(declared)) is None:
            self.add(["pipeline"], "its steps wait on each other's outputs (a cycle)")

    def _check_name(self, j: int, target: ModelConfig | None, kind: str, own: str) -> None:
        """A step naming a tensor its model does not have, when serve.yaml lists them all
        (Python models and pipelines; an ONNX model's file is read when it loads)."""
        if target is None or not _lists_all(target):
            return
        names = [t.name for t in (target.inputs if kind == "inputs" else target.outputs) or ()]
        if names and own not in names:
            self.add(
                ["pipeline", j, kind, own],
                f"model {target.name!r} has no {kind[:-1]} {own!r}; its {kind} are "
                f"{', '.join(names)}",
            )


def _lists_all(model: ModelConfig) -> bool:
    return model.pipeline is not None or model.model_format.name.lower() == "python"


def _declared(model: ModelConfig | None, kind: str, name: str) -> str | None:
    """The datatype serve.yaml declares for tensor ``name`` of ``model``, if it does."""
    if model is None:
        return None
    for tensor in (model.inputs if kind == "inputs" else model.outputs) or ():
        if tensor.name == name:
            return tensor.datatype
    return None


def _cycles(models: Sequence[ModelConfig], path: Path | None) -> list[ConfigIssue]:
    """Pipelines that run one another round in a circle (a pipeline running itself is
    reported by its own checks)."""
    runs = {
        m.name: {s.model for s in m.pipeline or () if s.model != m.name}
        for m in models
        if m.pipeline is not None
    }
    issues: list[ConfigIssue] = []
    for index, model in enumerate(models):
        if model.pipeline is None:
            continue
        trail = _path_back(model.name, runs)
        if trail is not None:
            line = line_in_file(path, ["models", index, "pipeline"])
            circle = " -> ".join([model.name, *trail])
            issues.append(
                ConfigIssue(
                    f"models[{index}].pipeline", line, f"pipelines run each other: {circle}"
                )
            )
    return issues


def _path_back(start: str, runs: dict[str, set[str]]) -> list[str] | None:
    """A chain of pipelines from ``start``'s steps back to ``start``, if there is one."""
    stack: list[tuple[str, list[str]]] = [(m, [m]) for m in sorted(runs.get(start, ()))]
    seen: set[str] = set()
    while stack:
        current, trail = stack.pop()
        if current == start:
            return trail
        if current in seen:
            continue
        seen.add(current)
        stack.extend((m, [*trail, m]) for m in sorted(runs.get(current, ())))
    return None
