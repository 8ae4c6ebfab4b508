#!/usr/bin/env bash
# Does servekit install from the package index alone, as on a user's machine? (issue 27)
#
# This machine's pip also reads local wheel folders and mirrors (its pip.conf, PIP_FIND_LINKS),
# which once hid a test extra pinned to a build the index does not have. This script ignores
# all of that (PIP_CONFIG_FILE=/dev/null, no find-links, no extra index) and asks the index
# only. It downloads, so no test runs it: run it by hand after changing dependencies.
#
#   scripts/check_index_install.sh           resolve only (pip --dry-run --report): the test
#                                            extra and the user extras on this Python; the
#                                            wheels for Python 3.12 and 3.13 (test extra: 3.12)
#   scripts/check_index_install.sh --full    also install ".[test]" into a fresh venv and run
#                                            the fast tier there (no torch: the torch tier has an
#                                            extra of its own, test-torch, whose torch from the
#                                            index alone is the CUDA build, several GB)
#
# Prints one line per check; exits non-zero when one fails. Reports are kept in $OUT
# (default: a new temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."

full=0
[[ "${1:-}" == "--full" ]] && full=1
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"

# The package index alone: no config file, no local wheels, no extra index.
export PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= PIP_NO_INDEX=
unset PIP_INDEX_URL PIP_CONSTRAINT
export PIP_DISABLE_PIP_VERSION_CHECK=1

venv="$out/venv"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip  # --dry-run and --report need pip >= 22.2

status=0
resolve() {  # resolve NAME ARGS...: a dry-run install, summarised from its report
  local name="$1"
  shift
  if "${pip[@]}" install -q --dry-run --ignore-installed --report "$out/$name.json" "$@" \
    >"$out/$name.log" 2>&1; then
    "$venv/bin/python" - "$out/$name.json" "$name" <<'EOF' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
names = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
nvidia = sorted(n for n in names if n.startswith("nvidia-"))
torch = names.get("torch")
extra = f", torch {torch}" + (f" with {len(nvidia)} nvidia-* packages" if nvidia else "") if torch else ""
if sys.argv[2].startswith("test") and torch:
    sys.exit(f"FAIL {sys.argv[2]}: the test extra brings torch{extra} (test-torch's job)")
print(f"ok   {sys.argv[2]}: {len(names)} packages resolve{extra}")
EOF
  else
    echo "FAIL $name: $(grep -m1 'No matching' "$out/$name.log" || grep -m1 ERROR "$out/$name.log")"
    status=1
  fi
}

# The wheel of this checkout, so that other Pythons' resolutions need no build of it.
"${pip[@]}" wheel -q --no-deps --wheel-dir "$out/dist" . >"$out/wheel.log" 2>&1
wheel="$(ls "$out"/dist/servekit-*.whl)"

py="$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
resolve "test-py$py" "$wheel[test]"
for extra in client notebook sklearn torch; do
  resolve "$extra-py$py" "$wheel[$extra]"
done
# Other Pythons, from wheels alone (no interpreter needed): servekit and its user extras on
# 3.12 and 3.13; the test extra on 3.12 only (MLServer 1.7.1, its last release, which the
# tests use for its codecs, requires Python < 3.13).
for version in 3.12 3.13; do
  for extra in "" "[notebook]" "[sklearn]" "[torch]"; do
    resolve "core${extra:+-${extra:1:-1}}-py$version" --python-version "$version" --only-binary=:all: "$wheel$extra"
  done
done
resolve "test-py3.12" --python-version 3.12 --only-binary=:all: "$wheel[test]"

if ((full)); then
  if "${pip[@]}" install -q -e ".[test]" >"$out/install.log" 2>&1; then
    echo "ok   installed .[test] into $venv ($(du -sh "$venv" | cut -f1))"
    if "$venv/bin/python" -m pytest -m "not slow" -q -p no:cacheprovider >"$out/fast.log" 2>&1; then
      echo "ok   fast tier in the fresh venv: $(tail -1 "$out/fast.log")"
    else
      echo "FAIL fast tier in the fresh venv: $(tail -1 "$out/fast.log")"
      status=1
    fi
  else
    echo "FAIL install .[test]: $(grep -m1 ERROR "$out/install.log" || tail -1 "$out/install.log")"
    status=1
  fi
fi
echo "reports: $out"
exit "$status"
