"""Models composed of models: pipelines (serve.yaml ``pipeline:``; pipelines.py, the request
kind, with each step's call to its model worked out once in steps.py) and a Python model's
calls to other served models (``servekit.models.infer``; model_calls.py)."""
