"""Private descriptor pool of servekit's generated protos. DO NOT EDIT (scripts/gen_protos.py)."""

from google.protobuf import descriptor_pool as _descriptor_pool

POOL = _descriptor_pool.DescriptorPool()
