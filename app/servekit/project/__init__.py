"""Projects: what a server serves, written as a folder (serve.yaml, model files, sources,
requirements.txt, Dockerfile), and its image built (``servekit save``, ``servekit build``)."""
