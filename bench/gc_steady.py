"""Runs ``python -m MODULE ARGS...`` with the garbage collector made steady on request, for
bench/instructions.py.

    python bench/gc_steady.py servekit serve serve.yaml ...

A full collection walks every object the process holds (the imported libraries, the loaded
model: about 37 million instructions in a server with gRPC), so a counted window of a few
hundred requests that happens to contain one counts ~15% more than one that does not, and
which window does depends on everything allocated before it. Each line read from stdin makes
this process collect everything and freeze what survives (``gc.freeze()``: the objects alive
now are never scanned again), then print ``gc steady <n>`` to stderr. bench/instructions.py
asks for it before each counted window: every window then starts from the same collector
state, and its collections only ever walk what the requests themselves allocated.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
import threading


def _steady_on_request() -> None:
    for _ in sys.stdin:
        gc.collect()
        gc.freeze()
        # one write, line and newline together: print() writes them apart, and the log's
        # writer thread (access lines) may write between the two
        sys.stderr.write(f"gc steady {gc.get_freeze_count()}\n")
        sys.stderr.flush()


def main() -> None:
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    sys.path[0] = os.getcwd()  # as ``python -m`` has it (not bench/, whose modules would shadow)
    threading.Thread(target=_steady_on_request, name="gc-steady", daemon=True).start()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
