"""One write per response at the edge (app/servekit/http/writes.py ``Coalescer``), counted
in process.

The edge's protocol runs on a uvloop loop over a transport that records each ``write`` and
``writelines`` call (each would be one syscall on uvloop's real transport), fed requests as
uvicorn's transport would feed them. The application is a bare ASGI callable, so each test
says exactly what the cycle sends: a small answer, a stream whose first chunk is late, HEAD,
204, ``connection: close``, pipelined requests, ``Expect: 100-continue``, a large body, an
application failing before or after its headers, the edge's own 408.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn
import uvloop
from uvicorn.server import ServerState
from wires import Wire

from servekit.config.schema import NetworkLimits
from servekit.http.connection import EdgeProtocol
from servekit.http.limits import EdgeState
from servekit.http.writes import JOIN_LIMIT

SMALL = b'{"outputs":[1,2,3]}'
BIG = b"x" * (JOIN_LIMIT + 1)


App = Callable[[Any, Any, Any], Awaitable[None]]


class Connection:
    """One connection of the edge protocol, on the running loop, over a :class:`Wire`."""

    def __init__(self, app: App, limits: NetworkLimits | None = None) -> None:
        class Protocol(EdgeProtocol):
            edge = EdgeState(limits or NetworkLimits(), 100)

        config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
        config.load()
        self.wire = Wire()
        self.protocol = Protocol(config=config, server_state=ServerState(), app_state={})
        self.protocol.connection_made(self.wire)

    def send(self, data: bytes) -> None:
        self.protocol.data_received(data)

    async def until(self, condition: Callable[[], object], what: str) -> None:
        """Let the loop turn until ``condition`` holds (bounded: nothing here waits on I/O)."""
        for _ in range(200):
            if condition():
                return
            await asyncio.sleep(0)
        raise AssertionError(f"not reached within 200 loop turns: {what}")

    async def answered(self, count: int) -> None:
        await self.until(
            lambda: self.protocol.server_state.total_requests >= count, f"{count} responses"
        )

    def close(self) -> None:
        self.protocol.connection_lost(None)


def run(test: Callable[[], Awaitable[None]]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(test(), 30))


def get(path: str, extra: bytes = b"", method: bytes = b"GET") -> bytes:
    return b"%s %s HTTP/1.1\r\nhost: test\r\n%s\r\n" % (method, path.encode(), extra)


async def answer(send: Any, body: bytes, status: int = 200, extra: list[Any] | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )
    await send({"type": "http.response.body", "body": body})


async def small(scope: Any, receive: Any, send: Any) -> None:
    await answer(send, SMALL)


def test_a_small_answer_is_one_write() -> None:
    async def test() -> None:
        conn = Connection(small)
        conn.send(get("/"))
        await conn.answered(1)
        assert len(conn.wire.calls) == 1
        kind, data = conn.wire.calls[0]
        assert kind == "write"
        assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"\r\n\r\n" + SMALL)
        conn.send(get("/again"))  # kept alive: the next answer is one write too
        await conn.answered(2)
        assert [kind for kind, _ in conn.wire.calls] == ["write", "write"]
        assert conn.wire.calls[1][1].endswith(SMALL)
        assert not conn.wire.closing
        conn.close()

    run(test)


def test_pipelined_requests_are_answered_in_order_one_write_each() -> None:
    async def by_path(scope: Any, receive: Any, send: Any) -> None:
        await answer(send, scope["path"].encode())

    async def test() -> None:
        conn = Connection(by_path)
        conn.send(get("/first") + get("/second", method=b"HEAD") + get("/third"))
        await conn.answered(3)
        await conn.until(lambda: len(conn.wire.calls) == 3, "three writes")
        first, second, third = (data for _, data in conn.wire.calls)
        assert first.endswith(b"\r\n\r\n/first")
        assert second.startswith(b"HTTP/1.1 200") and second.endswith(b"\r\n\r\n")  # HEAD
        assert b"content-length: 7" in second
        assert third.endswith(b"\r\n\r\n/third")
        conn.close()

    run(test)


def test_a_streams_headers_leave_before_its_late_first_chunk() -> None:
    async def test() -> None:
        first_chunk = asyncio.Event()

        async def stream(scope: Any, receive: Any, send: Any) -> None:
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await first_chunk.wait()  # the model is slow to produce it
            for event in (b"data: 1\n\n", b"data: 2\n\n"):
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        conn = Connection(stream)
        conn.send(get("/stream"))
        await conn.until(lambda: conn.wire.calls, "the header block")
        assert not first_chunk.is_set()
        assert conn.wire.sent.startswith(b"HTTP/1.1 200 OK\r\n")
        assert conn.wire.sent.endswith(b"transfer-encoding: chunked\r\n\r\n")
        first_chunk.set()
        await conn.answered(1)
        assert conn.wire.sent.endswith(b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n")
        assert len(conn.wire.calls) == 4  # headers, two events, the last chunk
        conn.close()

    run(test)


@pytest.mark.parametrize("status", [204, 304])
def test_an_answer_without_a_body_is_one_write(status: int) -> None:
    async def empty(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def test() -> None:
        conn = Connection(empty)
        conn.send(get("/"))
        await conn.answered(1)
        assert len(conn.wire.calls) == 1
        assert conn.wire.sent.startswith(b"HTTP/1.1 %d " % status)
        assert b"transfer-encoding" not in conn.wire.sent
        conn.close()

    run(test)


def test_connection_close_closes_after_the_one_write() -> None:
    async def test() -> None:
        conn = Connection(small)
        conn.send(get("/", b"connection: close\r\n"))
        await conn.answered(1)
        assert len(conn.wire.calls) == 1 and conn.wire.sent.endswith(SMALL)
        assert b"connection: close\r\n" in conn.wire.sent
        assert conn.wire.closing
        conn.close()

    run(test)


def test_a_large_body_goes_with_its_headers_in_one_writelines() -> None:
    async def big(scope: Any, receive: Any, send: Any) -> None:
        await answer(send, BIG)

    async def test() -> None:
        conn = Connection(big)
        conn.send(get("/"))
        await conn.answered(1)
        assert len(conn.wire.calls) == 1
        kind, data = conn.wire.calls[0]
        assert kind == "writelines" and data.endswith(b"\r\n\r\n" + BIG)
        conn.close()

    run(test)


def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    async def echo(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            body += message["body"]
            more = message["more_body"]
        await answer(send, body)

    async def test() -> None:
        conn = Connection(echo)
        conn.send(get("/", b"expect: 100-continue\r\ncontent-length: 5\r\n", b"POST"))
        await conn.until(lambda: conn.wire.calls, "100 Continue")
        assert conn.wire.sent == b"HTTP/1.1 100 Continue\r\n\r\n"
        conn.send(b"hello")
        await conn.answered(1)
        assert conn.wire.sent.endswith(b"\r\n\r\nhello")
        conn.send(get("/"))  # the next request on the connection coalesces again
        await conn.answered(2)
        assert conn.wire.calls[-1][1].startswith(b"HTTP/1.1 200")
        assert conn.wire.calls[-1][1].endswith(b"\r\n\r\n")
        conn.close()

    run(test)


def test_an_application_failing_before_its_answer_gets_a_500_in_one_write() -> None:
    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def test() -> None:
        conn = Connection(failing)
        conn.send(get("/"))
        await conn.until(lambda: conn.wire.closing, "the close")
        assert len(conn.wire.calls) == 1
        assert conn.wire.sent.startswith(b"HTTP/1.1 500 ")
        assert conn.wire.sent.endswith(b"Internal Server Error")
        conn.close()

    run(test)


def test_an_application_failing_after_its_headers_sends_them_then_closes() -> None:
    async def failing(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-length", b"10")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        raise RuntimeError("boom")

    async def test() -> None:
        conn = Connection(failing)
        conn.send(get("/"))
        await conn.until(lambda: conn.wire.closing, "the close")
        assert conn.wire.sent.startswith(b"HTTP/1.1 200 OK\r\n")
        assert conn.wire.sent.endswith(b"content-length: 10\r\n\r\n")
        conn.close()

    run(test)


def test_the_edges_own_answer_follows_headers_already_written() -> None:
    """A 408 while the application answers before the request body arrived: its header
    block (still held, the loop has not turned) goes first, then the close; the 408 itself is
    not sent, as a response had already started."""

    async def test() -> None:
        started = asyncio.Event()

        async def early(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            started.set()
            await asyncio.Event().wait()

        conn = Connection(early)
        conn.send(get("/", b"content-length: 100\r\n", b"POST"))
        await conn.until(started.is_set, "the response start")
        assert not conn.wire.calls  # held: its flush is due on the loop's next turn
        conn.protocol._close_with(408, "request body not received within 1 s")
        assert conn.wire.closing
        assert conn.wire.sent.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"408" not in conn.wire.sent
        conn.close()

    run(test)
