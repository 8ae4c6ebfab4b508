#!/usr/bin/env python
"""Generate the Python protobuf / gRPC code for servekit (the ONE generation step).

Usage (from anywhere; paths are resolved relative to the repository root)::

    python scripts/gen_protos.py           # regenerate app/servekit/protos/
    python scripts/gen_protos.py --check   # CI drift check, exit 1 on any difference

Inputs are every ``proto/*.proto``:

* ``grpc_service.proto`` + ``model_config.proto`` -- the KServe V2 / Triton
  ``inference`` package (``inference.GRPCInferenceService``), wire compatible
  with Triton's clients (verified against tritonclient by
  ``tests/test_proto_compat.py``);
* ``grps.proto`` -- the grps interface, package ``grps.protos.v1``.

For each ``X.proto`` the output directory ``app/servekit/protos/`` receives
``X_pb2.py`` (messages), ``X_pb2.pyi`` (type stubs, for mypy) and
``X_pb2_grpc.py`` (stubs / servicers), plus ``_pool.py`` and ``__init__.py``.
The compiler is ``grpc_tools.protoc`` from grpcio-tools (pinned together with
grpcio; the generated code asserts a protobuf runtime >= the gencode version it
was built for, currently 6.33.5, and the ``*_pb2_grpc.py`` files assert
grpcio >= the grpcio-tools version). Regenerate after bumping grpcio-tools.

Post-processing applied to protoc's output (all of it is mechanical, so the
``--check`` mode simply regenerates into a temporary directory and compares):

1. Imports between our own modules are made relative: protoc writes
   ``import model_config_pb2 as model__config__pb2`` (top-level module), which
   only works with the output directory on ``sys.path``; we rewrite it to
   ``from . import model_config_pb2 as model__config__pb2`` so the modules work
   as ``servekit.protos.grpc_service_pb2``. Same in the ``.pyi`` stubs and
   the ``*_pb2_grpc.py`` files.
2. The module name handed to ``_builder.BuildTopDescriptorsAndMessages`` is
   the full dotted name, so message classes get a correct ``__module__``
   (repr, pickling).
3. **Private descriptor pool** (the coexistence problem, see below): every
   ``_descriptor_pool.Default()`` is replaced with ``_POOL`` imported from
   ``app/servekit/protos/_pool.py``.

Why a private descriptor pool
-----------------------------
tritonclient's ``tritonclient/grpc/service_pb2.py`` / ``model_config_pb2.py``
register the files ``grpc_service.proto`` / ``model_config.proto`` (package
``inference``) in protobuf's process-wide *default* descriptor pool, and our
tests (and users) import tritonclient.grpc in the same process as servekit.
Measured with protobuf 6.33.6:

* upb backend (the default): adding a file whose name is already in the pool
  succeeds only if the serialized FileDescriptorProto is byte-for-byte
  identical (it then returns the *existing* descriptor); any difference --
  even declaration order, or a field tritonclient adds in a later release --
  raises ``TypeError: Couldn't build proto file into descriptor pool:
  duplicate file name grpc_service.proto``. (The pure-python backend instead
  silently keeps whichever definition was imported first.)
* renaming our files (e.g. ``servekit/v2/grpc_service.proto``) does not help
  on either backend: the pool rejects the second definition of the same
  symbols (upb: ``duplicate symbol 'inference.DataType'``; python:
  ``Conflict register for file ...``).

Today our descriptors happen to be byte-identical to tritonclient 2.73's
(tests/test_proto_compat.py checks field-for-field equality), so sharing the
default pool would work by accident, but then whichever copy is imported
first would silently win and any divergence would crash one import order.

Message full names must stay ``inference.ModelInferRequest`` etc. (they are
part of the gRPC method paths and of reflection / Any type URLs), so the
default pool can hold only one of the two definitions. Therefore our
generated modules register their files in a private
``google.protobuf.descriptor_pool.DescriptorPool`` (``POOL`` in
``servekit.protos``). This is fully supported by protobuf (builder and
message_factory work with any pool) and changes nothing on the wire: the
binary encoding depends only on field numbers and types, and gRPC method paths
(``/inference.GRPCInferenceService/ModelInfer``) are string literals in the
``*_pb2_grpc.py`` files. Consequences for users of the generated code:

* our classes are distinct from tritonclient's classes with the same full
  name (``our.ModelInferRequest is not tritonclient's``); convert between them
  with ``SerializeToString()`` / ``FromString()`` whenever needed;
* anything that looks types up *by name* in the default pool will not find
  ours: e.g. gRPC server reflection must be given the pool explicitly,
  ``grpc_reflection.v1alpha.reflection.enable_server_reflection(names, server,
  pool=servekit.protos.POOL)``; ``json_format`` and ``text_format`` work
  unchanged on message instances.

Caveat, pure-python protobuf backend only (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=
python; never the default where upb wheels exist): protobuf's own
``internal/builder.py`` registers every generated class in the default symbol
database, and in that backend this copies the descriptors into the default
pool. The process then works (both import orders are tested) but whichever
module is imported first supplies the descriptors, and in the ours-first order
also the classes, for both. That is harmless while the definitions are
identical to tritonclient's, which tests/test_proto_compat.py enforces.

The proto files keep their plain names (``grpc_service.proto``,
``model_config.proto``, ``grps.proto``) inside the private pool, matching the
names Triton clients see through reflection.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "app" / "servekit" / "protos"
PACKAGE = "servekit.protos"

INIT_PY = '''\
"""Generated protobuf / gRPC modules. DO NOT EDIT: run ``python scripts/gen_protos.py``.

All modules here register their descriptors in the private pool ``POOL``
(not protobuf's default pool), so they coexist with tritonclient's copies of
the same ``inference.*`` messages; see scripts/gen_protos.py for details.
"""

from ._pool import POOL

__all__ = ["POOL"]
'''

POOL_PY = '''\
"""Private descriptor pool of servekit's generated protos. DO NOT EDIT (scripts/gen_protos.py)."""

from google.protobuf import descriptor_pool as _descriptor_pool

POOL = _descriptor_pool.DescriptorPool()
'''

NOTICE = "# Post-processed by scripts/gen_protos.py (relative imports, private descriptor pool).\n"


def _protoc(out: Path, protos: list[Path]) -> None:
    """Run grpc_tools.protoc on ``protos`` writing python, pyi and grpc outputs to ``out``."""
    import grpc_tools
    from grpc_tools import protoc

    wkt = Path(grpc_tools.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--proto_path={wkt}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(p.relative_to(PROTO_DIR)) for p in protos],
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}: {' '.join(args)}")


def _postprocess(out: Path, modules: set[str]) -> None:
    """Rewrite protoc output in ``out`` in place (see module docstring)."""
    names = "|".join(sorted(re.escape(m) for m in modules))
    # `import foo_pb2 as foo__pb2` -> `from . import foo_pb2 as foo__pb2`
    import_re = re.compile(rf"^import ({names})( as \w+)?$", re.MULTILINE)
    # `from foo_pb2 import X` (not emitted today, handled for safety)
    from_re = re.compile(rf"^from ({names}) import ", re.MULTILINE)

    for path in sorted(out.iterdir()):
        if path.suffix not in (".py", ".pyi"):
            continue
        text = path.read_text(encoding="utf-8")
        text = import_re.sub(lambda m: f"from . import {m.group(1)}{m.group(2) or ''}", text)
        text = from_re.sub(lambda m: f"from .{m.group(1)} import ", text)
        if path.name.endswith("_pb2.py"):
            mod = path.stem
            if "_descriptor_pool.Default()" not in text:
                raise SystemExit(
                    f"{path.name}: protoc output changed shape (no _descriptor_pool.Default())"
                )
            text = text.replace("_descriptor_pool.Default()", "_POOL")
            anchor = "from google.protobuf.internal import builder as _builder\n"
            if anchor not in text:
                raise SystemExit(f"{path.name}: protoc output changed shape (no builder import)")
            text = text.replace(anchor, anchor + "from ._pool import POOL as _POOL\n", 1)
            text = text.replace(
                f"BuildTopDescriptorsAndMessages(DESCRIPTOR, '{mod}', _globals)",
                f"BuildTopDescriptorsAndMessages(DESCRIPTOR, '{PACKAGE}.{mod}', _globals)",
            )
        if not text.startswith(NOTICE):
            lines = text.splitlines(keepends=True)
            # keep a leading coding line first
            head = 1 if lines and lines[0].startswith("# -*- coding") else 0
            text = "".join(lines[:head]) + NOTICE + "".join(lines[head:])
        path.write_text(text, encoding="utf-8")

    (out / "__init__.py").write_text(INIT_PY, encoding="utf-8")
    (out / "_pool.py").write_text(POOL_PY, encoding="utf-8")


def generate(out: Path) -> list[str]:
    """Generate all code into the (empty) directory ``out``; return the file names."""
    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files in {PROTO_DIR}")
    _protoc(out, protos)
    _postprocess(out, {p.stem + "_pb2" for p in protos} | {p.stem + "_pb2_grpc" for p in protos})
    return sorted(p.name for p in out.iterdir() if p.is_file())


def _tracked(directory: Path) -> dict[str, str]:
    if not directory.is_dir():
        return {}
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in sorted(directory.iterdir())
        if p.is_file() and p.suffix in (".py", ".pyi")
    }


def check() -> int:
    """Regenerate into a temp dir and compare with OUT_DIR; return the exit code."""
    with tempfile.TemporaryDirectory(prefix="servekit-protos-") as tmp:
        generate(Path(tmp))
        fresh = _tracked(Path(tmp))
    current = _tracked(OUT_DIR)
    problems: list[str] = []
    for name in sorted(fresh.keys() | current.keys()):
        if name not in current:
            problems.append(f"missing: {name}")
        elif name not in fresh:
            problems.append(f"stale (not generated any more): {name}")
        elif fresh[name] != current[name]:
            diff = difflib.unified_diff(
                current[name].splitlines(keepends=True),
                fresh[name].splitlines(keepends=True),
                f"committed/{name}",
                f"regenerated/{name}",
                n=1,
            )
            problems.append(f"differs: {name}\n" + "".join(list(diff)[:40]))
    rel = OUT_DIR.relative_to(ROOT)
    if problems:
        print(
            f"{rel} is out of date with proto/ (run: python scripts/gen_protos.py):",
            file=sys.stderr,
        )
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print(f"{rel} is up to date ({len(fresh)} files).")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory; exit 1 if it differs from the committed code",
    )
    args = parser.parse_args(argv)
    if args.check:
        return check()
    with tempfile.TemporaryDirectory(prefix="servekit-protos-") as tmp:
        files = generate(Path(tmp))
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        # Replace the directory's contents atomically-ish: drop stale generated files first.
        for p in OUT_DIR.iterdir():
            if p.is_file() and p.suffix in (".py", ".pyi"):
                p.unlink()
            elif p.is_dir() and p.name == "__pycache__":
                shutil.rmtree(p)
        for name in files:
            shutil.copyfile(Path(tmp) / name, OUT_DIR / name)
    print(f"generated {len(files)} files into {OUT_DIR.relative_to(ROOT)}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
