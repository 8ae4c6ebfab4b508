"""Generated protobuf / gRPC modules. DO NOT EDIT: run ``python scripts/gen_protos.py``.

All modules here register their descriptors in the private pool ``POOL``
(not protobuf's default pool), so they coexist with tritonclient's copies of
the same ``inference.*`` messages; see scripts/gen_protos.py for details.
"""

from ._pool import POOL

__all__ = ["POOL"]
