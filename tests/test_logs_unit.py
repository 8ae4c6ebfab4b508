"""The log's parts in process: the JSON and text formatters, request IDs, a reload's outcome in
words, the public-bind warning, ``accessLog`` spellings and warm-up inputs."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_builders import mlp

from servekit.cli.serve import _warn_public_without_token
from servekit.config.overrides import Overrides, load_plan
from servekit.config.schema import LoggingConfig, WarmupSample
from servekit.models.warmup import WarmupError, build_inputs
from servekit.observability import access, logs, request_ids
from servekit.observability.access import AccessLine
from servekit.observability.request_ids import CURRENT, RequestInfo, accepted
from servekit.server import ServeKit
from servekit.services import watch
from servekit.services.watch import _Watcher, outcome


def _record(message: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("servekit.x", logging.WARNING, __file__, 1, message, None, None)
    record.__dict__.update(extra)
    return record


def test_a_json_line_carries_the_request_it_was_written_for() -> None:
    info = RequestInfo("abc-1", True)
    info.model, info.version = "m", "2"
    token = CURRENT.set(info)
    try:
        line = logs.JsonFormatter(worker=1).format(_record("hello there", reload={"a": 1}))
    finally:
        CURRENT.reset(token)
    record = json.loads(line)
    assert record["message"] == "hello there" and record["level"] == "WARNING"
    assert record["logger"] == "servekit.x" and record["time"].endswith("Z")
    assert (record["request_id"], record["model"], record["version"]) == ("abc-1", "m", "2")
    assert record["worker"] == 1 and record["reload"] == {"a": 1}
    assert "\n" not in line


def test_a_json_line_holds_a_traceback_in_one_line() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, "", 1, "failed", None, None)
        import sys

        record.exc_info = sys.exc_info()
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line and "ValueError: bad" in json.loads(line)["error"]
    assert "request_id" not in json.loads(line)  # no request: no field


def test_no_log_line_shows_a_uri_with_its_user_info_or_query() -> None:
    """Whoever logs a URI (a library's debug line, an exception's message), both formats show
    it as servekit shows URIs."""
    uri = "https://user:S3cretPassw0rd@h.example/m.onnx?X-Amz-Signature=SIGVALUE123"
    try:
        raise OSError(f"cannot open {uri}")
    except OSError:
        import sys

        record = _record(f"GET {uri} answered 200")
        record.exc_info = sys.exc_info()
    for formatter in (logs.JsonFormatter(), logs.TextFormatter()):
        line = formatter.format(record)
        assert "S3cretPassw0rd" not in line and "SIGVALUE123" not in line, line
        assert "https://h.example/m.onnx?..." in line


def test_a_text_line_names_its_request() -> None:
    token = CURRENT.set(RequestInfo("r-9", False))
    try:
        text = logs.TextFormatter(worker=0).format(_record("oops"))
    finally:
        CURRENT.reset(token)
    assert text.endswith("WARNING servekit.x[w0]: oops [request r-9]")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(b"abc-1", "abc-1"), ("x" * 128, "x" * 128), ("x" * 129, None), (b"", None),
     (b"a b", None), (b"a\x00", None), ("é".encode(), None), (b"\xff", None)],
)  # fmt: skip
def test_only_short_printable_ids_are_taken(value: bytes | str, expected: str | None) -> None:
    assert accepted(value) == expected


def test_made_ids_are_distinct_and_a_body_id_is_adopted_once() -> None:
    made = {request_ids.new_id() for _ in range(1000)}
    assert len(made) == 1000
    info = RequestInfo(request_ids.new_id(), False)
    info.headers = [(b"date", b"x"), (b"x-request-id", info.id.encode())]
    info.adopt("from-body")
    assert info.id == "from-body" and info.headers[-1] == (b"x-request-id", b"from-body")
    info.adopt("another")  # a client's ID (sent or adopted) is never replaced
    assert info.id == "from-body"
    sent = RequestInfo("header", True)
    sent.adopt("body")
    assert sent.id == "header"


def test_a_failed_reload_reads_failed_never_applied() -> None:
    level, text, fields = outcome(
        {"added": [], "removed": [], "reloaded": ["rf", "ok"], "failed": ["rf"]}
    )
    assert level == logging.WARNING and "applied" not in text and "{" not in text
    assert "rf failed to load" in text and "reloaded ok" in text
    assert fields == {"added": [], "reloaded": ["ok"], "removed": [], "failed": ["rf"]}
    level, text, _ = outcome({"added": ["a"], "removed": ["b"], "reloaded": [], "failed": []})
    assert (level, text) == (logging.INFO, "serve.yaml applied: added a; removed b")


def test_watch_logs_a_reload_that_failed_as_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> None:
        onnx.save(mlp(16, 8, 4), tmp_path / "m.onnx")
        path = tmp_path / "serve.yaml"
        path.write_text("models:\n  - {name: m, modelFormat: {name: onnx}, storageUri: m.onnx}\n")
        kit = ServeKit(load_plan(path, Overrides()))
        await kit.control.start()
        watcher = _Watcher(kit, path, Overrides())
        await watcher.check(touched=False)
        (tmp_path / "m.onnx").write_bytes(b"not a model at all")
        with caplog.at_level(logging.INFO, "servekit.watch"):
            await watcher.check(touched=True)
        await kit.repository.close()

    watch.SETTLE_STEP_S = 0.0
    asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if r.name == "servekit.watch"]
    assert len(lines) == 1, lines
    assert "m failed to load" in lines[0] and "applied" not in lines[0] and "{" not in lines[0]


def test_a_public_bind_without_a_token_warns_once_naming_the_setting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("server: {host: 0.0.0.0}\nmodels: []\n")
    with caplog.at_level(logging.WARNING, "servekit"):
        _warn_public_without_token(load_plan(path, Overrides()))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "server.auth.default" in warnings[0]
    assert "SERVEKIT_TOKEN" in warnings[0] and "0.0.0.0" in warnings[0]
    caplog.clear()
    path.write_text("server: {host: 127.0.0.1}\nmodels: []\n")
    with caplog.at_level(logging.WARNING, "servekit"):
        _warn_public_without_token(load_plan(path, Overrides()))
    assert not caplog.records


def test_access_log_spellings() -> None:
    assert LoggingConfig.model_validate({"accessLog": False}).access_log == "off"
    assert LoggingConfig.model_validate({"accessLog": True}).access_log == "on"
    assert LoggingConfig.model_validate({"accessLog": "errors"}).access_log == "errors"
    with pytest.raises(ValueError):
        LoggingConfig.model_validate({"accessLog": "sometimes"})


def _sample(**inputs: dict[str, object]) -> WarmupSample:
    return WarmupSample.model_validate({"name": "s", "batchSize": 2, "inputs": inputs})


def test_warmup_inputs(tmp_path: Path) -> None:
    zeros = build_inputs(
        _sample(x={"dataType": "FP32", "dims": [3], "zeroData": True}), 4, tmp_path
    )
    assert zeros["x"].shape == (2, 3) and zeros["x"].dtype == np.float32 and not zeros["x"].any()
    unbatched = build_inputs(
        _sample(x={"dataType": "INT64", "dims": [5], "randomData": True}), 0, tmp_path
    )
    assert unbatched["x"].shape == (5,) and unbatched["x"].dtype == np.int64
    lengths = b"".join(len(w).to_bytes(4, "little") + w for w in (b"ab", b"c"))
    (tmp_path / "words.bin").write_bytes(lengths)
    words = build_inputs(
        _sample(t={"dataType": "TYPE_STRING", "dims": [2], "inputDataFile": "words.bin"}),
        4,
        tmp_path,
    )
    assert words["t"].tolist() == [[b"ab", b"c"], [b"ab", b"c"]]
    with pytest.raises(WarmupError, match="batchSize 2 is not between 1 and"):
        build_inputs(_sample(x={"dataType": "FP32", "dims": [3], "zeroData": True}), 1, tmp_path)
    (tmp_path / "short.bin").write_bytes(b"\0" * 5)
    with pytest.raises(WarmupError, match="holds 5 bytes"):
        build_inputs(
            _sample(x={"dataType": "FP32", "dims": [3], "inputDataFile": "short.bin"}), 4, tmp_path
        )
    with pytest.raises(ValueError, match="exactly one of"):
        _sample(x={"dataType": "FP32", "dims": [3], "zeroData": True, "randomData": True})


def test_custom_metrics_bind_the_loading_version_and_refuse_bad_use() -> None:
    from servekit.observability import custom_metrics as cm

    token = cm.LOADING.set(("unit-m", "3"))
    try:
        first = cm.counter("unit_things_total", "things")
        again = cm.counter("unit_things", "things")  # the same family and child
        level = cm.gauge("unit_level")
    finally:
        cm.LOADING.reset(token)
    first.inc(2)
    again.inc()
    level.set(5)
    level.dec(2)
    rows = {s.name: s.rows for s in cm.samples()}
    assert (("unit-m", "3"), 3.0, 0.0, []) in rows["unit_things"]
    assert (("unit-m", "3"), 3.0, 0.0, []) in rows["unit_level"]
    with pytest.raises(ValueError, match="only goes up"):
        first.inc(-1)
    with pytest.raises(ValueError, match="servekit_"):
        cm.counter("servekit_mine")
    with pytest.raises(ValueError, match="already exists as a counter"):
        cm.gauge("unit_things")


def test_access_lines_are_written_in_groups_in_order_and_none_is_lost() -> None:
    """The one handler holds access lines (a write each was most of the access log's cost)
    and writes them before any other record, within HELD_SECONDS, and at a flush."""
    import io

    from waits import wait_until

    stream = io.StringIO()
    handler = logs.LineHandler(stream)
    handler.setFormatter(logs.TextFormatter())
    logger = logging.getLogger("servekit.access")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    access.set_access("on")
    try:
        info = RequestInfo("held-1", True)
        for status in (200, 404):
            access.write_line(
                AccessLine(
                    protocol="HTTP",
                    method="GET",
                    path="/x",
                    status=status,
                    duration_s=0.001,
                    bytes_in=0,
                    bytes_out=2,
                    client=None,
                    info=info,
                )
            )
        assert stream.getvalue() == ""  # held
        handler.handle(_record("a warning"))  # writes the held lines first
        lines = stream.getvalue().splitlines()
        assert [line.split(": ", 1)[1][:19] for line in lines] == [
            "HTTP GET /x 200 1.0",
            "HTTP GET /x 404 1.0",
            "a warning",
        ]
        access.write_line(
            AccessLine(
                protocol="gRPC",
                method="ModelInfer",
                path="/m",
                status="OK",
                duration_s=0.001,
                bytes_in=1,
                bytes_out=1,
                client=None,
                info=info,
            )
        )
        wait_until(lambda: "gRPC ModelInfer" in stream.getvalue(), timeout=5,
                   what="the held line written by the flusher")  # fmt: skip
        for _ in range(logs.LineHandler.HELD_LINES):  # a full group is written at once
            access.write_line(
                AccessLine(
                    protocol="HTTP",
                    method="GET",
                    path="/y",
                    status=200,
                    duration_s=0.0,
                    bytes_in=0,
                    bytes_out=0,
                    client=None,
                    info=info,
                )
            )
        handler.flush()
        assert stream.getvalue().count("HTTP GET /y 200") == logs.LineHandler.HELD_LINES
    finally:
        access.set_access("off")
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


@pytest.mark.parametrize("worker", [None, 1])
def test_access_lines_without_a_record_read_as_the_formatters_write_them(
    worker: int | None,
) -> None:
    """logs.AccessLines (the server's access lines, made with no LogRecord) writes what the
    formatters write for the same values: the same JSON fields (the message shortened) and the
    same text line; a path with characters JSON escapes stays valid JSON."""
    import io

    values = [
        ("HTTP", "POST", "/v2/models/m/infer", 200, False, 0.0004121, 70, 69, "127.0.0.1:1", "m"),
        ("gRPC", "ModelInfer", "/inference.G/ModelInfer", "NOT_FOUND", True, 0.002, 5, 0,
         "ipv4:127.0.0.1:2", None),
        ("HTTP", "GET", '/v2/models/"q\\\n\u00e9/ready', 404, True, 0.0, 0, 30, None, 'a"b'),
    ]  # fmt: skip
    for fmt in ("json", "text"):
        made, recorded = io.StringIO(), io.StringIO()
        fast = logs.LineHandler(made)
        slow = logs.LineHandler(recorded)
        slow.setFormatter(logs.formatter(fmt, worker))  # type: ignore[arg-type]
        writer = logs.AccessLines(fast, fmt, worker)  # type: ignore[arg-type]
        logger = logging.getLogger("servekit.access")
        logger.addHandler(slow)
        logger.propagate = False
        logger.setLevel(logging.INFO)
        access.set_access("on")
        try:
            for protocol, method, path, status, failed, seconds, n_in, n_out, peer, model in values:
                info = RequestInfo("id-1", True)
                info.model = model
                line = AccessLine(protocol, method, path, status, seconds, n_in, n_out, peer, info)
                assert line.failed == failed
                writer(line)
                access.write_line(
                    AccessLine(
                        protocol=protocol,
                        method=method,
                        path=path,
                        status=status,
                        duration_s=seconds,
                        bytes_in=n_in,
                        bytes_out=n_out,
                        client=peer,
                        info=info,
                    )
                )
            fast.flush()
            slow.flush()
        finally:
            access.set_access("off")
            logger.removeHandler(slow)
            logger.propagate = True
            logger.setLevel(logging.NOTSET)
        ours, theirs = made.getvalue().splitlines(), recorded.getvalue().splitlines()
        assert len(ours) == len(theirs) == len(values)
        for mine, expected, row in zip(ours, theirs, values, strict=True):
            if fmt == "json":
                a, b = json.loads(mine), json.loads(expected)
                assert list(a) == list(b), (a, b)  # the same fields, in the same order
                assert a.pop("message") == f"{row[0]} {row[1]} {row[2]} {row[3]}"
                b.pop("message")
                assert a.pop("time")[:16] == b.pop("time")[:16]  # to the minute
                assert a == b
            else:  # the same line after the time (the milliseconds may differ)
                assert mine.split(" ", 2)[2] == expected.split(" ", 2)[2]


def test_an_access_line_escapes_a_sent_id_in_json_and_follows_the_level() -> None:
    """A client's ID may hold ``"`` and ``\\`` (printable ASCII): the JSON line stays valid and
    names it; the access logger's level (read with the time's text, once a second) leaves
    lines out when above INFO, as a record's level check did."""
    import io

    stream = io.StringIO()
    handler = logs.LineHandler(stream)
    writer = logs.AccessLines(handler, "json", None)
    logger = logging.getLogger("servekit.access")
    sent = accepted('q"u\\ote')
    assert sent is not None
    info = RequestInfo(sent, True)
    try:
        logger.setLevel(logging.INFO)
        writer(AccessLine("HTTP", "GET", "/v2", 200, 0.0015, 0, 3, "127.0.0.1:9", info))
        handler.flush()
        row = json.loads(stream.getvalue())
        assert row["request_id"] == 'q"u\\ote' and row["client"] == "127.0.0.1:9"
        assert row["duration_ms"] == 1.5 and row["status"] == 200
        logger.setLevel(logging.WARNING)
        writer._stamp = (-1, "")  # (the next second)
        writer(AccessLine("HTTP", "GET", "/v2", 200, 0.0, 0, 0, None, info))
        handler.flush()
        assert len(stream.getvalue().splitlines()) == 1
    finally:
        logger.setLevel(logging.NOTSET)


def test_a_grpc_request_id_is_read_from_the_body_only_of_messages_with_an_id() -> None:
    """ModelInfer's ``id`` names the call; other RPCs' messages have no such field and are
    not asked for one (a missing field of a protobuf message raises inside upb: it cost every
    other call about 7,000 instructions)."""
    from servekit.grpc.request_ids import _has_id, _info
    from servekit.protos import grpc_service_pb2 as pb

    class Context:
        def invocation_metadata(self) -> tuple[()]:
            return ()

        def peer(self) -> str:
            return "ipv4:127.0.0.1:40000"

    infer = _info(Context(), pb.ModelInferRequest(model_name="m", id="client-7"))  # type: ignore[arg-type]
    assert (infer.id, infer.sent) == ("client-7", True)
    assert infer.client == "ipv4:127.0.0.1:40000"  # the peer, for a client's share of slots
    ready = _info(Context(), pb.ModelReadyRequest(name="m"))  # type: ignore[arg-type]
    assert not ready.sent and ready.id
    assert _has_id(pb.ModelInferRequest) and not _has_id(pb.ModelReadyRequest)
    assert not _has_id(list)  # a stream's request iterator
