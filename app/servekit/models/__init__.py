"""Model management: the repository of loaded model versions, the storage of pushed files, the
parsing of pushed configs and the checks on ONNX files. Above runtimes and config, below the
services that answer requests."""
