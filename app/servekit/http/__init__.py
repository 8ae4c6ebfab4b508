"""The HTTP transport: uvicorn's connection protocol with servekit's limits, and the inference
lane that answers plain V2 inference requests at the connection.

The Litestar application (app/servekit/rest/) is the adapter that sits on it: its routes
answer every request the lane does not, and its inference route gives the lane its answer.
What each module does:

- ``listener``: the protocol class uvicorn is given (``protocol_class``);
- ``connection``: the connection protocol (``EdgeProtocol``): header limits, caps, the Host
  and token checks, the client-left cancel, the access log's counts;
- ``deadlines``: header and body deadlines and the minimum body rate, on one lazy timer;
- ``limits``: what the connections share, the connection cap, the canned refusals;
- ``writes``: one ``write()`` per response (the coalescing writer);
- ``tls``: the TLS handshake made by the connection, counted by the limits;
- ``inference_lane``: plain inference requests read and answered with no ASGI cycle;
- ``taskless``: an answer run in the connection's callback, with no task even if it waits;
- ``bodies``: request bodies read under the route's limits (the one Content-Length rule);
- ``compression``: gzip and deflate bodies decoded under the same limits, answers compressed;
- ``large``: large bodies read into one buffer, decoded and encoded off the loop;
- ``client_left``: a request whose client left while it waited for the model is dropped;
- ``request_ids``, ``traces``: request IDs, access-log lines and server spans of a request;
- ``private_apis``: every uvicorn and Litestar internal the package uses, in one place.
"""
