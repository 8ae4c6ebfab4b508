"""A do-nothing ASGI app: the ceiling any Python ASGI server reaches on this machine.

It reads the request body and answers a fixed 7-byte JSON body, nothing else, so the gap
between it and servekit is exactly what the framework, codecs, dataplane and model add. Bench
code only; servekit never imports it.

    taskset -c 0 python bench/noop_asgi.py [--server uvicorn|litestar|granian|hypercorn]

prints ``listening PORT`` once the socket is bound. ``uvicorn`` runs the way servekit runs it
(``uvicorn.Server.serve`` on a uvloop loop we own, httptools parser), so its number is the
ceiling for servekit's own stack; ``litestar`` answers the same way from inside a Litestar app
routed like servekit's inference (the framework's floor); ``granian`` and ``hypercorn`` are for
the record.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from typing import Any

_BODY = b'{"a":1}'
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"7")]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Drain the request body, answer 200 with a fixed body."""
    if scope["type"] != "http":
        if scope["type"] == "lifespan":  # granian/hypercorn send lifespan events
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _BODY})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def litestar_app() -> Any:
    """The do-nothing answer inside Litestar, routed the way servekit routes inference (a POST
    route with a path parameter, answered by a handler-level middleware): the framework's floor.
    """
    from litestar import Litestar, Request, post
    from litestar.types import ASGIApp

    def answer_directly(app: ASGIApp) -> ASGIApp:
        return noop_answer

    @post("/v2/models/{model:str}/infer", status_code=200, middleware=[answer_directly])
    async def infer(request: Request[Any, Any, Any]) -> ASGIApp:
        return noop_answer

    return Litestar([infer], debug=False)


async def noop_answer(scope: Any, receive: Any, send: Any) -> None:
    """The do-nothing answer (a name of its own: middleware factories take `app=`)."""
    await app(scope, receive, send)


async def _uvicorn(asgi_app: Any) -> None:
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    config = uvicorn.Config(
        asgi_app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        loop="none",
        http="httptools",
        server_header=False,
    )
    server = uvicorn.Server(config)
    print(f"listening {sock.getsockname()[1]}", flush=True)
    await server.serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choices = ["uvicorn", "litestar", "granian", "hypercorn"]
    parser.add_argument("--server", choices=choices, default="uvicorn")
    args = parser.parse_args()
    if args.server in ("uvicorn", "litestar"):  # "litestar": the Litestar app on uvicorn
        import uvloop

        uvloop.run(_uvicorn(app if args.server == "uvicorn" else litestar_app()))
        return
    port = _free_port()  # these servers bind themselves; a tiny race is fine for a benchmark
    print(f"listening {port}", flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    if args.server == "granian":
        cmd = [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--workers", "1", "--loop", "uvloop", "--no-ws"]
        cmd += ["--log-level", "warning", "noop_asgi:app"]
    else:
        cmd = [sys.executable, "-m", "hypercorn", "--bind", f"127.0.0.1:{port}"]
        cmd += ["--worker-class", "uvloop", "--workers", "1", "--log-level", "warning"]
        cmd += ["noop_asgi:app"]
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.chdir(here)  # both servers import "noop_asgi:app" relative to the working directory
    os.execv(sys.executable, cmd)  # replace this process: the caller's pid is the server's


if __name__ == "__main__":
    main()
