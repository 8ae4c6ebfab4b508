"""The code blocks of README.md and docs/*.md, as tests/test_docs_blocks.py runs them.

Sybil (a well-kept library for testing the examples in documentation) lexes the Markdown: its
fenced-block lexer finds every block with its info string, also inside lists and quotes, and
strips the indentation a list item gives it. What a block needs besides its text is said by a
marker, an HTML comment on the line just above the fence (invisible on GitHub and in the site):

    <!-- docs-test: server -->

The markers (docs/development.md lists them for writers) are in ``MARKERS``; several may share
one comment, separated by ``;``. A marker names what the test provides; none of them skips.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sybil import Document
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

RUN = {"python", "bash", "sh", "yaml"}
"""Fences whose blocks are code and run."""
NOT_CODE = {"text", "console", "json", "output", ""}
"""Fences that show output, illustrations or data: never run (an unlabelled fence included)."""

MARKERS = {
    "file": "file NAME: the block is the file NAME, written into the page's folder before any "
    "block of the page runs (a Python file is compiled too)",
    "server": "a real `servekit serve` of the repository's serve.yaml runs while the block does; "
    "the block's localhost:8000 / 127.0.0.1:8000 / host:8000 (and 8001) name it",
    "serve": "a serve.yaml block that is also served, in the page's folder: every model READY",
    "loader": "a serve.yaml block naming files the reader brings (their own model, a remote "
    "store): checked by the loader `servekit validate` runs first, not for its files",
    "setup": "setup NAME: Python run before the block in its namespace (SETUPS in "
    "tests/test_docs_blocks.py)",
    "slow": "a Python block that starts a server itself: run in the slow tier",
    "exit": "exit N: a shell block that must exit with status N (a command documented to fail)",
    "git": "the page's folder is a git repository with its files committed (a clone)",
}
_MARKER = re.compile(r"^[ \t]*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->[ \t]*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is (page and the fence's line), its language, its text (as
    Sybil hands it: dedented), the line its text starts on, and its markers."""

    page: str
    line: int
    language: str
    source: str
    source_line: int
    markers: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def slow(self) -> bool:
        """Runs in the slow tier: a shell (a process), or a block that needs a server."""
        if self.language in ("bash", "sh"):
            return True
        if self.language == "yaml":  # validated in process; serving it is test_served's
            return False
        return bool({"server", "setup", "slow"} & self.markers.keys())


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block of the Markdown page ``path``, in order."""
    text = path.read_text(encoding="utf-8")
    document = Document(text, str(path))
    lexer = FencedCodeBlockLexer(language=r"[^\n]*")
    lines = text.split("\n")
    page = str(path.relative_to(ROOT))
    found = []
    for region in lexer(document):
        line = text.count("\n", 0, region.start) + 1
        source = region.lexemes["source"]
        first = text.count("\n", 0, region.start + source.offset) + 1
        info = region.lexemes["language"].strip()
        found.append(
            Block(
                page,
                line,
                info.split()[0] if info else "",
                str(source),
                first,
                _markers(lines, line - 1, f"{page}:{line}"),
            )
        )
    return sorted(found, key=lambda b: b.line)


def _markers(lines: list[str], fence: int, where: str) -> dict[str, str]:
    """The markers of the comment just above the fence at index ``fence`` (one blank line
    between them allowed); an unknown marker fails with its place."""
    above = fence - 1
    if above >= 0 and not lines[above].strip():
        above -= 1
    match = _MARKER.match(lines[above]) if above >= 0 else None
    if match is None:
        return {}
    found = {}
    for item in match.group("body").split(";"):
        name, _, argument = item.strip().partition(" ")
        if name not in MARKERS:
            raise ValueError(
                f"{where}: unknown docs-test marker {name!r} (known: {sorted(MARKERS)})"
            )
        found[name] = argument.strip()
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks_of(page)]


IGNORED = shutil.ignore_patterns(
    ".git", "venvs", "__pycache__", "*.egg-info", ".mypy_cache", ".ruff_cache", "site", "build"
)
"""What a checkout holds that is not the repository's (caches, venvs, build output)."""


def copy_checkout(target: Path) -> Path:
    """The repository's files copied to ``target`` (what a reader's clone holds): the folder a
    page's blocks run in, so that what they write lands there."""
    shutil.copytree(ROOT, target, dirs_exist_ok=True, ignore=IGNORED, symlinks=True)
    return target


def compile_python(block: Block) -> object:
    """The block compiled so that a traceback names the page and the block's own lines."""
    padded = "\n" * (block.source_line - 1) + block.source
    return compile(padded, str(ROOT / block.page), "exec", dont_inherit=True)


STAND_INS = {
    # `servekit serve` (which runs until stopped) starts the real server in the background on
    # the test's ports and returns once it answers; every other command is servekit's own.
    "servekit": """#!/bin/bash
if [ "$1" = serve ]; then
  shift
  "$DOCS_PYTHON" -m servekit serve "$@" --http-port "$DOCS_HTTP_PORT" \\
    --grpc-port "$DOCS_GRPC_PORT" --host 127.0.0.1 >>"$DOCS_LOG" 2>&1 &
  echo $! >>"$DOCS_PIDS"
  exec "$DOCS_PYTHON" "$DOCS_WAIT" "http://127.0.0.1:$DOCS_HTTP_PORT/v2/health/ready" $!
fi
exec "$DOCS_PYTHON" -m servekit "$@"
""",
    # `mkdocs serve` likewise (its live preview), on the test's port.
    "mkdocs": """#!/bin/bash
if [ "$1" = serve ]; then
  shift
  "$DOCS_PYTHON" -m mkdocs serve "$@" --dev-addr "127.0.0.1:$DOCS_HTTP_PORT" >>"$DOCS_LOG" 2>&1 &
  echo $! >>"$DOCS_PIDS"
  exec "$DOCS_PYTHON" "$DOCS_WAIT" "http://127.0.0.1:$DOCS_HTTP_PORT/" $!
fi
exec "$DOCS_PYTHON" -m mkdocs "$@"
""",
    # `pip install` resolves what it is given against this environment and changes nothing
    # (the test environment has every extra installed; nothing downloads).
    "pip": """#!/bin/bash
if [ "$1" = install ]; then
  shift
  exec "$DOCS_PYTHON" -m pip install --dry-run --no-index --no-deps --no-build-isolation "$@"
fi
exec "$DOCS_PYTHON" -m pip "$@"
""",
    # `pytest` collects the suite it names (running it would run this test inside itself).
    "pytest": """#!/bin/bash
exec "$DOCS_PYTHON" -m pytest --collect-only -q "$@"
""",
    # `apt-get install` changes no system: CI's .ci/run installs the system packages the docs
    # name; here each must already be installed.
    "apt-get": """#!/bin/bash
if [ "$1" = install ]; then
  shift
  for package in "$@"; do
    case "$package" in -*) continue ;; esac
    dpkg-query -W -f='${Status}\\n' "$package" 2>/dev/null | grep -q '^install ok installed$' \\
      || { echo "$package is not installed (add it to .ci/run's apt-get line)" >&2; exit 1; }
  done
  exit 0
fi
echo "apt-get stand-in: only install is known" >&2
exit 1
""",
    # `docker` is podman (what Debian's podman-docker package makes it; CI has no Docker
    # daemon). `docker run`, which runs until
    # stopped, runs in the background with the block's 8000/8001 published on the test's ports
    # of 127.0.0.1, returns once the server in it is ready, and is removed after the block.
    "docker": """#!/bin/bash
if [ "$1" = run ]; then
  shift
  args=()
  for arg in "$@"; do
    case "$arg" in
      -d|--detach) continue ;;
      8000:*|127.0.0.1:8000:*) arg="127.0.0.1:$DOCS_HTTP_PORT:${arg##*:}" ;;
      8001:*|127.0.0.1:8001:*) arg="127.0.0.1:$DOCS_GRPC_PORT:${arg##*:}" ;;
    esac
    args+=("$arg")
  done
  name="docs-test-$$-$RANDOM"
  echo "$name" >>"$DOCS_CONTAINERS"
  podman run --name "$name" "${args[@]}" >>"$DOCS_LOG" 2>&1 &
  echo $! >>"$DOCS_PIDS"
  exec "$DOCS_PYTHON" "$DOCS_WAIT" "http://127.0.0.1:$DOCS_HTTP_PORT/v2/health/ready" $!
fi
exec podman "$@"
""",
    # `kubectl` has no cluster here: it validates what it is given instead (KUBECTL below).
    "kubectl": """#!/bin/bash
exec "$DOCS_PYTHON" "$DOCS_KUBECTL" "$@"
""",
}
"""Commands a shell block runs through a stand-in (first on its PATH), each for a reason said
above it; docs/development.md lists them."""

WAIT = """import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])  # pid: this process's child (the stand-in exec'd us)
deadline = time.monotonic() + 90
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(f"the background command exited ({status}) before {url} answered")
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            if answer.status == 200:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.2)
sys.exit(f"{url} did not answer within 90 s")
"""


KUBECTL = """import base64, os, shutil, subprocess, sys
from pathlib import Path
import yaml
from kubernetes_validate import utils as kv

VERSION = "1.30.0"  # the Kubernetes version tests/test_export.py validates against
APPLIED = Path(os.environ["DOCS_KUBECTL_APPLIED"])  # what `apply -f` was given in this block


def check(doc, where):
    try:
        kv.validate(doc, VERSION, strict=True)
    except kv.SchemaNotFoundError:  # a CRD: KServe's are vendored (tests/kserve_schemas.py)
        if str(doc.get("apiVersion", "")).startswith("serving.kserve.io/"):
            sys.path.insert(0, os.environ["DOCS_TESTS_DIR"])
            import jsonschema
            from kserve_schemas import validate_kserve
            try:
                validate_kserve(doc)
            except jsonschema.ValidationError as error:
                sys.exit(f"{where}: {doc['kind']} {doc['metadata'].get('name')}: {error.message}")
            return
        # KEDA's, the Prometheus Operator's: no schema offline
        print(f"{where}: {doc['kind']} ({doc['apiVersion']}) not validated: no schema offline")
    except kv.ValidationError as error:
        sys.exit(f"{where}: {doc['kind']} {doc['metadata'].get('name')}: {error.message}")


def real_kubectl():
    # Debian's kubectl (kubernetes-client), found on PATH past this stand-in's folder
    here = Path(__file__).resolve().parent
    path = [p for p in os.environ["PATH"].split(os.pathsep) if p and Path(p).resolve() != here]
    found = shutil.which("kubectl", path=os.pathsep.join(path))
    if found is None:
        sys.exit("kubectl is not installed (add kubernetes-client to .ci/run's apt-get line)")
    return found


def kustomize(args):
    # kustomize needs no cluster: the real kubectl builds it
    os.execv(real_kubectl(), ["kubectl", "kustomize", *args])


def apply(args):
    if len(args) == 2 and args[0] == "-k":  # kustomize's build, then as -f
        built = subprocess.run([real_kubectl(), "kustomize", args[1]], capture_output=True,
                               text=True, timeout=120)
        if built.returncode != 0:
            sys.exit(built.stderr)
        target = APPLIED.with_name(f"kustomized-{os.getpid()}.yaml")
        target.write_text(built.stdout)
        args = ["-f", str(target)]
    if args[:1] != ["-f"] or len(args) != 2:
        sys.exit(f"kubectl stand-in: apply takes -f FILE or -k DIR, not {args}")
    docs = [d for d in yaml.safe_load_all(Path(args[1]).read_text()) if d]
    if not docs:
        sys.exit(f"{args[1]}: no manifests")
    for doc in docs:
        check(doc, args[1])
    with APPLIED.open("a") as applied:
        applied.write(args[1] + "\\n")
    print(f"{args[1]}: {len(docs)} manifests valid (not applied: no cluster)")


def create_secret(args):
    if args[:1] != ["generic"] or len(args) < 3:
        sys.exit(f"kubectl stand-in: create secret takes generic NAME --from-file=..., not {args}")
    data = {}
    for option in args[2:]:
        if not option.startswith("--from-file="):
            sys.exit(f"kubectl stand-in: create secret generic: unknown option {option}")
        key, _, path = option.removeprefix("--from-file=").rpartition("=")
        data[key or Path(path).name] = base64.b64encode(Path(path).read_bytes()).decode()
    check({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": args[1]},
           "type": "Opaque", "data": data}, "secret")
    print(f"secret/{args[1]} valid (not created: no cluster)")


def port_forward(args):
    kind, _, name = args[0].partition("/")
    if kind not in ("svc", "service") or len(args) < 2:
        sys.exit(f"kubectl stand-in: port-forward takes svc/NAME PORT..., not {args}")
    files = APPLIED.read_text().split() if APPLIED.exists() else []
    docs = [d for f in files for d in yaml.safe_load_all(Path(f).read_text()) if d]
    services = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == name]
    if not services:
        sys.exit(f"kubectl stand-in: no Service {name!r} was applied")
    ports = {p["port"] for p in services[0]["spec"]["ports"]}
    for pair in args[1:]:
        remote = int(pair.rpartition(":")[2])
        if remote not in ports:
            sys.exit(f"Service {name!r} has no port {remote} (it has {sorted(ports)})")
    print(f"service/{name} has ports {sorted(ports)} (not forwarded: no cluster)")


COMMANDS = {("apply",): apply, ("create", "secret"): create_secret,
            ("port-forward",): port_forward, ("kustomize",): kustomize}
for words, command in COMMANDS.items():
    if tuple(sys.argv[1 : 1 + len(words)]) == words:
        command(sys.argv[1 + len(words) :])
        break
else:
    sys.exit(f"kubectl stand-in: {sys.argv[1:]} is not known to it (tests/docs_blocks.py)")
"""
"""The ``kubectl`` stand-in: there is no cluster, so ``apply -f FILE`` validates FILE's
manifests against Kubernetes' OpenAPI schemas (kubernetes-validate, strict: an unknown field
fails; a custom resource, which has no schema offline, is named as not validated),
``apply -k DIR`` does so with what the real ``kubectl kustomize DIR`` builds (kustomize needs no
cluster, so ``kustomize`` itself is the real one), ``create secret generic`` validates the
Secret it would create from the files it names, and ``port-forward svc/NAME`` checks that a
Service NAME with those ports was applied."""


def write_stand_ins(folder: Path) -> Path:
    """The stand-ins as executables in ``folder`` (put first on PATH), the waiter and
    kubectl's validator."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, script in STAND_INS.items():
        path = folder / name
        path.write_text(script)
        path.chmod(0o755)
    (folder / "wait_url.py").write_text(WAIT)
    (folder / "kubectl.py").write_text(KUBECTL)
    (folder / "containers.conf").write_text(CONTAINERS_CONF)
    return folder


CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]
[engine]
runtime = "runc"
"""
"""podman's settings for this machine, as docs/ops.md gives them (and tests/test_container.py):
crun refuses its cgroups, and podman's default ulimits are too high here."""


def addresses(text: str, http_port: int, grpc_port: int) -> str:
    """The block's server addresses (8000 for HTTP, 8001 for gRPC, on localhost, 127.0.0.1 or
    the placeholder ``host``) made the test's own ports on 127.0.0.1, and the examples'
    ``otel-collector`` host 127.0.0.1 (traffic stays on this machine)."""
    text = re.sub(r"\botel-collector:", "127.0.0.1:", text)  # the examples' collector: here
    text = re.sub(r"\b(?:localhost|127\.0\.0\.1|host):8000\b", f"127.0.0.1:{http_port}", text)
    return re.sub(r"\b(?:localhost|127\.0\.0\.1|host):8001\b", f"127.0.0.1:{grpc_port}", text)


PYTHON = sys.executable
