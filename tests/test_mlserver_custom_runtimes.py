"""MLServer custom runtimes served by servekit, answered as a real MLServer 1.7.1 answers them.

MLServer's ``content-type`` example (tests/data/mlserver-examples/content-type: its
``runtime.py`` and ``model-settings.json`` as published) is served unmodified by
``mlserver start`` and by ``servekit serve``, and each request its README sends goes to both,
over REST and over gRPC (MLServer's own stubs and converters, tests/mlserver_grpc_client.py):
the answers must be equal field by field (status, outputs' names, datatypes, shapes, data and
parameters, the response's parameters), and so must the model's metadata. A second runtime
answers with what reached its ``predict`` (the request's and each input's parameters, what
its ``decode`` and ``decode_request`` make of them), so that what MLServer passes a runtime is
compared too, not only what an echo returns.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlserver_server import grpc_answers, mlserver_started
from servers import start_server
from waits import wait_until

EXAMPLE = Path(__file__).parent / "data" / "mlserver-examples" / "content-type"
MODEL = "content-type-example"


def _codecs_request() -> dict[str, Any]:
    """The README's second request, built as it builds it: MLServer's NumpyCodec and
    StringCodec (``use_bytes=False``) into its InferenceRequest."""
    import numpy as np
    from mlserver_codecs import InferenceRequest, NumpyCodec, StringCodec

    payload = InferenceRequest(
        inputs=[
            NumpyCodec.encode_input("parameters-np", np.array([[1, 2], [3, 4]])),
            StringCodec.encode_input("parameters-str", ["hello world 😁"], use_bytes=False),
        ]
    )
    dumped: dict[str, Any] = payload.model_dump()
    return dumped


def readme_requests() -> list[dict[str, Any]]:
    """The requests of the example's README, in its order (the ``img`` one is for its
    PillowCodec, the ``pd`` one for its request codecs)."""
    return [
        {"inputs": [
            {"name": "parameters-np", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4],
             "parameters": {"content_type": "np"}},
            {"name": "parameters-str", "datatype": "BYTES", "shape": [1],
             "data": "hello world 😁", "parameters": {"content_type": "str"}},
        ]},
        _codecs_request(),
        {"inputs": [
            {"name": "metadata-np", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]},
            {"name": "metadata-str", "datatype": "BYTES", "shape": [11], "data": "hello world 😁"},
        ]},
        {"inputs": [
            {"name": "image-int32", "datatype": "INT32", "shape": [8, 8], "data": [1, 0] * 32,
             "parameters": {"content_type": "img"}},
            {"name": "image-bytes", "datatype": "BYTES", "shape": [8, 8], "data": "10101010" * 8,
             "parameters": {"content_type": "img"}},
        ]},
        {"inputs": [
            {"name": "parameters-np", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4],
             "parameters": {"content_type": "np"}},
            {"name": "parameters-str", "datatype": "BYTES", "shape": [2, 11],
             "data": ["hello world 😁", "bye bye 😁"], "parameters": {"content_type": "str"}},
        ], "parameters": {"content_type": "pd"}},
    ]  # fmt: skip


def _elements(data: Any) -> list[Any]:
    """A tensor's data as a flat list: MLServer echoes a runtime's data as it is (a bare
    string for one BYTES element, nested lists), servekit always writes a flat list."""
    if isinstance(data, list):
        return [v for item in data for v in _elements(item)]
    return [data]


def _sizes_agree(request: dict[str, Any]) -> bool:
    """Whether each input's data fills its shape (the V2 protocol's rule)."""
    for item in request["inputs"]:
        size = 1
        for dim in item["shape"]:
            size *= dim
        if len(_elements(item["data"])) != size:
            return False
    return True


def _fitted(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` with each BYTES input's shape made to fit its data (``[n]``)."""
    inputs = []
    for item in request["inputs"]:
        if item["datatype"] == "BYTES":
            item = {**item, "shape": [len(_elements(item["data"]))]}
        inputs.append(item)
    return {**request, "inputs": inputs}


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    """What is compared of a 200 answer: the model, the response's parameters and each
    output's name, datatype, shape, parameters and elements."""
    return {
        "model_name": body["model_name"],
        "parameters": body.get("parameters") or {},
        "outputs": [
            {
                "name": o["name"],
                "datatype": o["datatype"],
                "shape": o["shape"],
                "parameters": o.get("parameters") or {},
                "data": _elements(o["data"]),
            }
            for o in body["outputs"]
        ],
    }


def _rest(url: str, model: str, requests: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    import httpx

    out: list[tuple[int, Any]] = []
    for request in requests:
        answer = httpx.post(f"{url}/v2/models/{model}/infer", json=request, timeout=60)
        body = answer.json() if answer.headers.get("content-type", "").startswith("app") else None
        out.append((answer.status_code, body))
    return out


def _both(folder: Path, model: str, ask: Callable[..., Any]) -> tuple[Any, Any, list[str]]:
    """``ask(http_url, grpc_target, metrics_url)`` of MLServer, then of servekit, on the same
    folder; servekit's log besides."""
    with mlserver_started(folder) as mlserver:
        theirs = ask(mlserver.url, mlserver.grpc_target, mlserver.metrics_url)
    served = start_server(folder)
    try:
        assert served.grpc_target is not None
        mine = ask(served.http_url, served.grpc_target, f"{served.http_url}/metrics")
    finally:
        assert served.stop() == 0, served.log()
    return theirs, mine, served.log().splitlines()


def _metadata(url: str, model: str) -> dict[str, Any]:
    import httpx

    found: dict[str, Any] = httpx.get(f"{url}/v2/models/{model}", timeout=30).json()
    return found


@pytest.mark.slow
def test_the_content_type_example_answers_as_in_mlserver(tmp_path: Path) -> None:
    """The README's requests over REST and gRPC; metadata over both."""
    folder = tmp_path / "content-type"
    shutil.copytree(EXAMPLE, folder)
    requests = readme_requests()
    fitted = [_fitted(r) for r in requests if not _sizes_agree(r)]
    # and one of numbers alone, with its id and parameters (the echo fails on BYTES over gRPC)
    with_id = {"id": "my-request-1", "inputs": requests[0]["inputs"][:1], "parameters": {"a": 1}}
    sent = [*requests, *fitted, with_id]
    over_grpc = [r for r in [*requests, *fitted, with_id] if _sizes_agree(r)]

    def ask(url: str, target: str, metrics: str) -> dict[str, Any]:
        return {
            "rest": _rest(url, MODEL, sent),
            "grpc": grpc_answers(target, MODEL, over_grpc),
            "metadata": _metadata(url, MODEL),
        }

    theirs, mine, _ = _both(folder, MODEL, ask)

    # REST: every request the README sends whose data fills its shape, answered alike.
    for request, (status, body), (their_status, their_body) in zip(
        sent, mine["rest"], theirs["rest"], strict=True
    ):
        if not _sizes_agree(request):
            # MLServer hands the model BYTES data that does not fill its shape (one string
            # for shape [11]); servekit refuses it, naming the input, as for any model.
            assert status == 400, body
            assert "shape" in body["error"] and "elements" in body["error"], body
            continue
        assert status == their_status, (request, body, their_body)
        if status == 200:
            assert _answer(body) == _answer(their_body), request
        else:
            # The README's image request fails on MLServer itself (the same 500, compared
            # above): the example, run unmodified, decodes with MLServer 1.7.1's PillowCodec,
            # which raises NotImplementedError. servekit must fail it the same way and say so.
            assert "the model raised NotImplementedError" in body["error"], body
    assert mine["rest"][-1][1]["id"] == theirs["rest"][-1][1]["id"] == "my-request-1"
    statuses = [status for status, _ in theirs["rest"]]
    assert statuses.count(200) >= 5 and 500 in statuses, statuses  # the test sent real cases

    # gRPC, through MLServer's own client code.
    assert len(mine["grpc"]["infer"]) == len(theirs["grpc"]["infer"]) == len(over_grpc)
    for request, ours, real in zip(
        over_grpc, mine["grpc"]["infer"], theirs["grpc"]["infer"], strict=True
    ):
        assert ("answer" in ours) == ("answer" in real), (request, ours, real)
        if "answer" in real:
            assert _answer(ours["answer"]) == _answer(real["answer"]), request
        else:  # the same status, the model's own words (MLServer's are all it says)
            assert ours["code"] == real["code"], (ours, real)
            assert real["details"] in ours["details"], (ours, real)
    assert mine["grpc"]["infer"][-1]["answer"]["id"] == "my-request-1"
    # The echo runtime prints each input with json.dumps, which bytes (gRPC's BYTES, as
    # MLServer hands them to a runtime) fail: a real case of the model raising.
    assert any("answer" not in real for real in theirs["grpc"]["infer"])

    # The model's metadata: model-settings.json's inputs with their content types, as the
    # runtime's metadata() gives them. Over gRPC, without their parameters: the KServe V2
    # proto servekit speaks (Triton's, field for field) has no parameters in metadata, which
    # MLServer's own proto adds.
    ours, real = mine["metadata"], theirs["metadata"]
    assert ours["name"] == real["name"] == MODEL
    assert ours["inputs"] == real["inputs"] and real["inputs"][0]["parameters"], (ours, real)
    assert ours["outputs"] == real["outputs"] == [], (ours, real)
    assert ours["parameters"] == real["parameters"], (ours, real)

    def bare(tensors: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: t[k] for k in ("name", "datatype", "shape")} for t in tensors]

    ours, real = mine["grpc"]["metadata"], theirs["grpc"]["metadata"]
    assert bare(ours["inputs"]) == bare(real["inputs"]), (ours, real)


# -- what reaches predict, metadata(), unload() ---------------------------------------------------
REFLECT = '''
import json
import os

import mlserver
import numpy as np
import pandas as pd
from mlserver import MLModel
from mlserver.codecs import StringCodec
from mlserver.types import InferenceRequest, InferenceResponse, MetadataModelResponse
from mlserver.utils import get_model_uri


def shown(parameters):
    """Parameters as the runtime reads them, less the HTTP headers MLServer copies in."""
    if parameters is None:
        return None
    return {k: v for k, v in parameters.model_dump().items() if k != "headers"}


def described(value):
    if isinstance(value, pd.DataFrame):
        columns = {str(c): [str(v) for v in value[c]] for c in value.columns}
        return {"type": "DataFrame", "columns": columns}
    if isinstance(value, np.ndarray):
        return {"type": "ndarray", "dtype": str(value.dtype), "shape": list(value.shape),
                "values": value.tolist()}
    if isinstance(value, list):
        return {"type": "list", "values": [described(v) for v in value]}
    return {"type": type(value).__name__, "value": repr(value)}


class Reflect(MLModel):
    """Answers with what reached its predict: the request's and each input's parameters, and
    what its decode / decode_request make of them (MLServer's content types and codecs)."""

    async def load(self) -> bool:
        self._folder = await get_model_uri(self._settings)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        mlserver.log(inputs_seen=len(payload.inputs))  # a custom metric
        seen = {"parameters": shown(payload.parameters), "inputs": []}
        for item in payload.inputs:
            seen["inputs"].append({
                "name": item.name, "datatype": item.datatype, "shape": item.shape,
                "parameters": shown(item.parameters), "decoded": described(self.decode(item)),
            })
        if payload.parameters is not None and payload.parameters.content_type:
            seen["request"] = described(self.decode_request(payload))
        return InferenceResponse(
            model_name=self.name,
            parameters={"answered_by": "Reflect"},
            outputs=[StringCodec.encode_output("seen", [json.dumps(seen, sort_keys=True)])],
        )

    async def metadata(self) -> MetadataModelResponse:
        found = await super().metadata()
        found.parameters.custom = "from metadata()"
        return found

    async def unload(self) -> bool:
        with open(os.path.join(self._folder, "unloaded.txt"), "a") as marker:
            marker.write("unloaded\\n")
        return True
'''
REFLECT_SETTINGS = {
    "name": "reflect",
    "implementation": "reflect.Reflect",
    "parameters": {"content_type": "np"},
    "inputs": [
        {"name": "when", "datatype": "BYTES", "shape": [-1],
         "parameters": {"content_type": "datetime"}},
        {"name": "x", "datatype": "FP32", "shape": [-1, 2]},
    ],
    "outputs": [{"name": "seen", "datatype": "BYTES", "shape": [1],
                 "parameters": {"content_type": "str"}}],
}  # fmt: skip
REFLECT_REQUESTS: list[dict[str, Any]] = [
    {  # each input's content type, the request's own parameters
        "id": "r-1",
        "parameters": {"custom": "yes", "n": 3, "flag": True},
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4],
             "parameters": {"content_type": "np"}},
            {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["héllo", "world"],
             "parameters": {"content_type": "str"}},
            {"name": "blob", "datatype": "BYTES", "shape": [1], "data": ["aGVsbG8="],
             "parameters": {"content_type": "base64"}},
            {"name": "stamp", "datatype": "BYTES", "shape": [1],
             "data": ["2024-01-02T03:04:05"], "parameters": {"content_type": "datetime"}},
        ],
    },
    {  # no content types: model-settings.json's metadata gives "when" one, "x" none
        "inputs": [
            {"name": "when", "datatype": "BYTES", "shape": [1], "data": ["2021-05-06T07:08:09"]},
            {"name": "x", "datatype": "INT64", "shape": [3], "data": [1, 2, 3]},
        ],
    },
    {  # a request codec: pd, one column per input
        "parameters": {"content_type": "pd"},
        "inputs": [
            {"name": "a", "datatype": "INT32", "shape": [2], "data": [1, 2]},
            {"name": "b", "datatype": "BYTES", "shape": [2], "data": ["x", "y"],
             "parameters": {"content_type": "str"}},
        ],
    },
]  # fmt: skip


def reflect_project(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "reflect.py").write_text(REFLECT, encoding="utf-8")
    (folder / "model-settings.json").write_text(json.dumps(REFLECT_SETTINGS), encoding="utf-8")
    (folder / "settings.json").write_text("{}", encoding="utf-8")


def _seen(answer: dict[str, Any]) -> Any:
    (output,) = answer["outputs"]
    return json.loads(_elements(output["data"])[0])


@pytest.mark.slow
def test_what_reaches_predict_is_what_mlserver_passes(tmp_path: Path) -> None:
    """The request's and each input's parameters reach predict as MLServer passes them, over
    REST and gRPC; the runtime's own metadata() is the model's metadata; mlserver.log gives
    metrics; unload() runs on a repository unload."""
    import httpx

    folder = tmp_path / "reflect"
    reflect_project(folder)

    def ask(url: str, target: str, metrics: str) -> dict[str, Any]:
        seen = {
            "rest": _rest(url, "reflect", REFLECT_REQUESTS),
            "grpc": grpc_answers(target, "reflect", REFLECT_REQUESTS),
            "metadata": _metadata(url, "reflect"),
            "metrics": httpx.get(metrics, timeout=30).text,
        }
        unloaded = httpx.post(f"{url}/v2/repository/models/reflect/unload", timeout=30)
        seen["unload"] = unloaded.status_code
        marker = folder / "unloaded.txt"  # written by unload(), once the version is let go
        wait_until(marker.exists, timeout=30, what="the runtime's unload()")
        seen["marker"] = marker.read_text()
        marker.unlink(missing_ok=True)
        return seen

    theirs, mine, _ = _both(folder, "reflect", ask)
    for request, (status, body), (their_status, their_body) in zip(
        REFLECT_REQUESTS, mine["rest"], theirs["rest"], strict=True
    ):
        assert status == their_status == 200, (body, their_body)
        assert _answer(body) == _answer(their_body), request
        assert _seen(body) == _seen(their_body), request
    assert mine["rest"][0][1]["id"] == "r-1"
    seen = _seen(mine["rest"][0][1])
    assert seen["parameters"] == {"custom": "yes", "n": 3, "flag": True}
    assert [i["decoded"]["type"] for i in seen["inputs"]] == ["ndarray", "list", "list", "list"]
    assert _seen(mine["rest"][1][1])["inputs"][0]["decoded"]["values"][0]["type"] == "datetime"
    assert _seen(mine["rest"][2][1])["request"]["type"] == "DataFrame"
    for ours, real in zip(mine["grpc"]["infer"], theirs["grpc"]["infer"], strict=True):
        assert "answer" in ours and "answer" in real, (ours, real)
        assert _answer(ours["answer"]) == _answer(real["answer"])
        assert _seen(ours["answer"]) == _seen(real["answer"])
    ours, real = mine["metadata"], theirs["metadata"]
    assert real["parameters"] == {"content_type": "np", "custom": "from metadata()"}, real
    for key in ("name", "inputs", "outputs", "parameters"):
        assert ours[key] == real[key], key

    # mlserver.log: a histogram per name, labelled with the model (MLServer's labels are
    # model_name and model_version, servekit's model and version), observed once a request.
    def observed(text: str) -> dict[str, float]:
        found = re.findall(r"^inputs_seen_(count|sum)\{[^}]*reflect[^}]*\} (\S+)$", text, re.M)
        return {kind: float(value) for kind, value in found}

    sent = 2 * len(REFLECT_REQUESTS)  # over REST and over gRPC
    inputs = 2.0 * sum(len(r["inputs"]) for r in REFLECT_REQUESTS)
    assert observed(mine["metrics"]) == {"count": sent, "sum": inputs}, mine["metrics"][-3000:]
    # MLServer 1.7.1 with parallel_workers 0 (as here) registers them in its own registry but
    # exports prometheus_client's default one: its /metrics never shows them.
    assert observed(theirs["metrics"]) == {}
    assert mine["unload"] == theirs["unload"] == 200
    assert mine["marker"] == theirs["marker"] == "unloaded\n"


# -- predict_stream ------------------------------------------------------------------------------
WORDS = '''
from mlserver import MLModel
from mlserver.codecs import StringCodec
from mlserver.types import InferenceResponse


class Words(MLModel):
    """Streams one response per word of its prompt (MLServer's streaming runtimes' shape)."""

    async def predict_stream(self, payloads):
        async for payload in payloads:
            text = StringCodec.decode_input(payload.inputs[0])[0]
            for word in text.split():
                yield InferenceResponse(
                    model_name=self.name,
                    outputs=[StringCodec.encode_output("text_output", [word])],
                )
'''
WORDS_SETTINGS = {
    "name": "words",
    "implementation": "words.Words",
    "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [-1]}],
    "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [-1, 1]}],
}
WORDS_REQUEST = {
    "id": "s-1",
    "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["to be or not"],
                "parameters": {"content_type": "str"}}],
}  # fmt: skip


def _events(url: str, path: str, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    import httpx

    with httpx.stream("POST", f"{url}{path}", json=body, timeout=60) as answer:
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
        status = answer.status_code
    return status, [json.loads(line.removeprefix("data: ")) for line in lines]


@pytest.mark.slow
def test_a_streaming_runtime_streams_as_in_mlserver(tmp_path: Path) -> None:
    """MLServer's ``infer_stream``: a V2 request in, one Server-Sent Event per response of the
    runtime's predict_stream, each a V2 response."""
    folder = tmp_path / "words"
    folder.mkdir()
    (folder / "words.py").write_text(WORDS, encoding="utf-8")
    (folder / "model-settings.json").write_text(json.dumps(WORDS_SETTINGS), encoding="utf-8")

    def ask(url: str, target: str, metrics: str) -> dict[str, Any]:
        return {
            "stream": _events(url, "/v2/models/words/infer_stream", WORDS_REQUEST),
            "unary": _rest(url, "words", [WORDS_REQUEST]),
        }

    theirs, mine, _ = _both(folder, "words", ask)
    (status, events), (their_status, their_events) = mine["stream"], theirs["stream"]
    assert status == their_status == 200
    assert len(events) == len(their_events) == 4, (events, their_events)
    for event in their_events:  # MLServer's stream leaks its CloudEvents headers in-band
        assert set(event["parameters"]) == {"headers"}, event
        del event["parameters"]
    assert [_answer(e) for e in events] == [_answer(e) for e in their_events]
    assert all(e["id"] == "s-1" for e in [*events, *their_events])
    # /infer of a streaming runtime has no answer on either server: MLServer answers 500
    # (its MLModel.predict raises NotImplementedError); servekit 501 Not Implemented, naming
    # the streaming route, as it answers any decoupled model asked on a unary route.
    ((unary, body),), ((their_unary, _),) = mine["unary"], theirs["unary"]
    assert (unary, their_unary) == (501, 500), (unary, their_unary)
    assert "decoupled" in body["error"], body
    assert [_elements(e["outputs"][0]["data"]) for e in events] == [["to"], ["be"], ["or"], ["not"]]


# -- in process -----------------------------------------------------------------------------------
def test_the_content_type_example_converts_to_a_plain_serve_yaml(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``servekit convert mlserver`` on the example: its tensors once as serve.yaml's inputs
    and once in the runtime's settings, written out in full (no YAML anchors)."""
    from servekit.cli import main as cli_main
    from servekit.config.loader import parse_config

    assert cli_main(["convert", "mlserver", str(EXAMPLE)]) == 0
    text = capsys.readouterr().out
    assert "&id" not in text and "*id" not in text, text
    (model,) = parse_config(text).models
    assert [(t.name, t.datatype, t.shape) for t in model.inputs or ()] == [
        ("metadata-np", "INT32", [2, 2]),
        ("metadata-str", "BYTES", [11]),
    ]


def test_requests_batched_together_are_each_answered_alone() -> None:
    """With ``max_batch_size`` the executor may hand a runtime several requests at once (one
    document each): each reaches predict alone and gets its own answer, in order."""
    import mlserver_codecs  # noqa: F401  (MLServer's package entered without its server)
    import numpy as np
    from mlserver.model import MLModel
    from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

    from servekit.runtimes import mlserver_model, mlserver_wire

    class Count(MLModel):
        async def predict(self, payload: InferenceRequest) -> InferenceResponse:
            (item,) = payload.inputs
            count = ResponseOutput(name="n", datatype="INT64", shape=[1], data=[len(item.data)])
            return InferenceResponse(model_name=self.name, id=payload.id, outputs=[count])

    model = mlserver_model.MLServerModel(Count, {"mlserver": {"name": "count"}}, "count")
    documents = [
        {"id": str(n), "inputs": [{"name": "x", "datatype": "FP32", "shape": [n], "data": [0] * n}]}
        for n in (1, 3)
    ]
    try:
        batched = np.concatenate([mlserver_wire.pack(d) for d in documents])  # as the executor
        answered = model.predict({mlserver_wire.REQUEST: batched})
    finally:
        model.unload()
    answers = [json.loads(bytes(a)) for a in answered[mlserver_wire.RESPONSE]]
    assert [a["outputs"][0]["data"] for a in answers] == [[1], [3]]
