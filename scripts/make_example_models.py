"""Build the example models under models/ (committed; rerun to reproduce them byte for byte).

python scripts/make_example_models.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx

# The builders live with the tests (tests/onnx_builders.py): they are a tool, not servekit.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import onnx_builders

ROOT = Path(__file__).resolve().parent.parent / "models"


def save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    print(f"wrote {path.relative_to(ROOT.parent)} ({path.stat().st_size} bytes)")


def main() -> None:
    # Two versions of the same 16 -> 64 -> 4 perceptron, differing in their weights.
    save(onnx_builders.mlp(seed=1), ROOT / "mlp" / "1" / "model.onnx")
    save(onnx_builders.mlp(seed=2), ROOT / "mlp" / "2" / "model.onnx")
    save(onnx_builders.add_sub(), ROOT / "add_sub" / "model.onnx")
    save(onnx_builders.identity("BYTES", ["n"]), ROOT / "text_identity.onnx")


if __name__ == "__main__":
    main()
