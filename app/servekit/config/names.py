"""Model and server names as Kubernetes resource names, and finding a model by either name.

KServe passes an InferenceService's name (a DNS-1035 label) where servekit expects a model name,
so ``servekit serve --only`` accepts both; the exports name resources the same way.
"""

from __future__ import annotations

import re

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def k8s_label(name: str) -> str:
    """A model or server name as a Kubernetes resource name (a DNS-1035 label).

    ``add_sub`` becomes ``add-sub``. ``servekit serve --only`` accepts either form, so the
    InferenceService name KServe passes as ``{{.Name}}`` finds the model it was made from.
    ValueError when no label can stand for ``name``.
    """
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if label and not label[0].isalpha():
        label = f"m-{label}"
    if not _DNS_LABEL.match(label) or len(label) > 63:
        raise ValueError(
            f"{name!r} cannot be a Kubernetes name (letters, digits and '-', at most 63 "
            "characters, starting with a letter); rename it in serve.yaml"
        )
    return label


def find_model(names: list[str], wanted: str) -> str | None:
    """The model ``wanted`` names: exactly, or by its Kubernetes name (``add-sub``)."""
    if wanted in names:
        return wanted
    for name in names:
        try:
            if k8s_label(name) == wanted:
                return name
        except ValueError:
            continue
    return None
