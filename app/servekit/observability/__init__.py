"""What servekit tells about itself, whatever the transport: the log (``logs``: one handler
and format for every source), request IDs (``request_ids``), the access line (``access``: one
:class:`~servekit.observability.access.AccessLine` per request, one writer), traces
(``tracing``: OpenTelemetry), and metrics (``metrics``: the Prometheus registry and its
rendering; ``custom_metrics``: the counters, gauges and histograms a Python model defines).

A foundation package: it imports no Litestar, uvicorn or grpcio. The glue that needs a
transport stays with it: app/servekit/http/request_ids.py and traces.py (at the HTTP edge),
app/servekit/grpc/request_ids.py and traces.py (wrapped around each gRPC method).
"""
