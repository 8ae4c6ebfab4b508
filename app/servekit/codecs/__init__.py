"""Wire formats <-> dataplane types, one module per format.

``raw`` holds the one byte layout of a tensor (little-endian, row-major, BYTES with 4-byte length
prefixes) shared by Triton's binary HTTP extension and gRPC raw contents.
"""
