"""Start-up time of a model kept in S3: cold (empty cache) against cached (unchanged remote).

    python bench/remote_start.py [--megabytes 100] [--rounds 3]

Starts an S3-compatible server on 127.0.0.1 (moto's server mode, from the test extra), uploads
one ONNX model of about ``--megabytes`` MB (an MLP whose weights are that large), and times
``servekit serve`` from its process start until ``/v2/models/big/ready`` answers 200: first
with an empty cache (the model is downloaded), then again with the cache left in place (the
listing matches, nothing is downloaded). A local copy of the same file is timed too: the floor
that loading the model itself costs. Prints a Markdown table; medians of ``--rounds``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent


def big_model(megabytes: int) -> bytes:
    """x[1, n] -> MatMul by an n x n FP32 matrix of about ``megabytes`` MB."""
    n = int((megabytes * 1024 * 1024 / 4) ** 0.5)
    weights = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise TimeoutError(url)


def time_start(config: Path, env: dict[str, str]) -> float:
    """Seconds from ``servekit serve`` starting to the model answering ready."""
    port = free_port()
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "servekit", "serve", str(config), "--http-port", str(port),
         "--no-grpc"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait(f"http://127.0.0.1:{port}/v2/models/big/ready", 600)
        return time.monotonic() - started
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import boto3

    work = Path(tempfile.mkdtemp(prefix="servekit-remote-bench-"))
    port = free_port()
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait(endpoint, 30)
        data = big_model(args.megabytes)
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench",
                          aws_secret_access_key="bench", region_name="us-east-1")  # fmt: skip
        s3.create_bucket(Bucket="models")
        s3.put_object(Bucket="models", Key="big/1/model.onnx", Body=data)
        (work / "local" / "1").mkdir(parents=True)
        (work / "local" / "1" / "model.onnx").write_bytes(data)
        cache = work / "cache"
        env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench",
                   AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                   XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT / "app"))  # fmt: skip
        remote = work / "remote.yaml"
        remote.write_text("models:\n  - {name: big, modelFormat: {name: onnx}, "
                          "storageUri: 's3://models/big'}\n")  # fmt: skip
        local = work / "local.yaml"
        local.write_text("models:\n  - {name: big, modelFormat: {name: onnx}, "
                         "storageUri: local}\n")  # fmt: skip
        cold, cached, floor = [], [], []
        for _ in range(args.rounds):
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(time_start(remote, env))
            cached.append(time_start(remote, env))
            floor.append(time_start(local, env))
        size = len(data) / 1e6
        print(f"model: {size:.0f} MB ONNX in moto's S3 on 127.0.0.1; medians of {args.rounds}")
        print("| start | seconds to ready | over a local file |")
        print("|---|---:|---:|")
        base = statistics.median(floor)
        for name, runs in (("local file", floor), ("S3, cold cache", cold),
                           ("S3, cached (unchanged remote)", cached)):  # fmt: skip
            median = statistics.median(runs)
            print(f"| {name} | {median:.2f} | {median - base:+.2f} s |")
    finally:
        os.killpg(moto.pid, signal.SIGKILL)
        moto.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
