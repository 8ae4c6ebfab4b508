"""Sequence models (serve.yaml ``sequenceBatching``): the request kind (handler.py), a
request's sequence flags (flags.py) and the batcher that gives sequences their slots and runs
them in order (batcher.py)."""
