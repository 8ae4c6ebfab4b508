"""Manifests for ops: a plain Kubernetes Deployment (``k8s``), KServe resources (``kserve``) and
the Secret wiring of tokens (``secrets``), from the same compiled plan the server runs."""
