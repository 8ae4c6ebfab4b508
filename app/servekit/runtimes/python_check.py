"""What ``servekit validate`` learns of a Python model without serving it: whether ``serve``
would load it (the module imports, the entrypoint exists, its metadata can be derived).

The model is built exactly as the server builds it (:func:`servekit.runtimes.python.build`,
one instance, its module found beside serve.yaml), so validate and serve cannot disagree: a
``predict(x)`` with neither type hints nor declared inputs is refused here with the message
serve would log, instead of "OK" followed by a model that never becomes ready. A class's
``load()`` runs, as it would at start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servekit.runtimes.base import LoadError

if TYPE_CHECKING:
    from servekit.config.compiler import ModelPlan, ServePlan


def python_problems(plan: ServePlan) -> dict[str, str]:
    """Model name -> why serve would refuse it, for each Python model that would fail to load."""
    problems: dict[str, str] = {}
    models = [m for m in plan.models if m.implementation == "python" and m.problem is None]
    if models:
        from servekit.runtimes.python import import_root

        import_root(plan.base_dir)  # where serve imports them from
    for model in models:
        try:
            _build(model)
        except LoadError as exc:
            problems[model.name] = str(exc)
        except Exception as exc:  # the model's own code failed: said, not a traceback
            problems[model.name] = f"{type(exc).__name__}: {exc}"
    return problems


def _build(model: ModelPlan) -> None:
    from servekit.runtimes import python

    built = python.build(
        model.entrypoint,
        model.parameters,
        1,
        model.inputs,
        model.outputs,
        name=model.name,
        batching=model.config is not None and model.config.dynamic_batching is not None,
        grps_message=model.config is not None and model.config.grps_message,
        max_batch_size=model.max_batch_size,
    )
    built.close()
