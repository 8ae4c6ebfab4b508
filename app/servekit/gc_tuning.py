"""The garbage collector's setting in a server process of its own (``servekit serve`` and its
workers; never a notebook's kernel, whose collector is the user's).

CPython runs a young collection after every 700 net allocations of container objects, and each
one walks every container still alive in the young generation. Under load that is the
requests in flight: their futures, coroutines, scopes and arrays. At 64 requests in flight on
the batched path, collections cost about 16,000 instructions per request, 6% of it
(``python bench/instructions.py new=. --batching --concurrency 64 --body "REST binary"``:
268,127 with the default, 252,246 at 5,000, 252,248 at 20,000; one request at a time, REST
JSON moves 0.3% and gRPC 1.4%). A request's objects are freed by reference counting the
moment it ends, so a higher threshold does not make memory grow: only garbage held in reference
cycles waits a little longer for its collection.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Net container allocations between young collections: twice what removed the cost at 64 in
flight (5,000), for more in flight."""


def tune() -> None:
    """Collect the young generation less often; the older generations' ratios stay Python's."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
