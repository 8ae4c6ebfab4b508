"""The object stores' emulators on 127.0.0.1, for the tests that fetch models from them
(test_remote_storage.py: servekit's own fetch; test_kserve_runtime_e2e.py: KServe's storage
initializer): Azurite for Azure Blob, gcp-storage-emulator for GCS, each in its own process
group on a free port, up once its port answers, stopped by that group; moto's S3 server in a
thread (``moto_s3``).

KServe's initializer builds an Azure blob URI's endpoint as ``https://ACCOUNT.blob.core.windows
.net`` and has no setting to point it elsewhere, so ``azurite(tls=...)`` serves HTTPS with a
certificate for that host (and 127.0.0.1); the test reaches it through an ``HTTPS_PROXY``
(tests/gated_proxy.py with ``tunnel_to``), trusting the certificate's CA as KServe's global CA
bundle would make it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trustme
from waits import wait_until

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (  # Azurite's published development account key (not a secret)
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURE_BLOB_HOST = f"{AZURITE_ACCOUNT}.blob.core.windows.net"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Emulator:
    """A store's emulator in its own process group, up once its port answers."""

    def __init__(self, argv: list[str], port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        with log_path.open("w") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        wait_until(self._up, 60, argv[0])

    def _up(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the emulator exited:\n{self.log_path.read_text()[-2000:]}")
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


def azure_connection(port: int, key: str = AZURITE_KEY, scheme: str = "http") -> str:
    """A connection string for Azurite's account on 127.0.0.1 (its path-style endpoint)."""
    return (
        f"DefaultEndpointsProtocol={scheme};AccountName={AZURITE_ACCOUNT};AccountKey={key};"
        f"BlobEndpoint={scheme}://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
    )


def azurite(folder: Path, tls: trustme.CA | None = None) -> Emulator:
    """Azurite's blob service, its data in ``folder``; with ``tls``, HTTPS with a certificate
    from that CA for Azure's own blob host name and 127.0.0.1 (Azurite reads the account from
    a host name of that shape, as Azure does)."""
    binary = shutil.which("azurite-blob")
    assert binary is not None, "azurite-blob is missing: npm install -g azurite (.ci/run)"
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
            str(folder / "data"), "--silent", "--skipApiVersionCheck"]  # fmt: skip
    if tls is not None:
        cert = tls.issue_cert(AZURE_BLOB_HOST, "127.0.0.1")
        cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
        cert.private_key_pem.write_to_path(str(folder / "key.pem"))
        argv += ["--cert", str(folder / "cert.pem"), "--key", str(folder / "key.pem")]
    return Emulator(argv, port, folder / "azurite.log")


def gcs_emulator(folder: Path) -> Emulator:
    """gcp-storage-emulator in memory; clients find it through ``STORAGE_EMULATOR_HOST``."""
    binary = shutil.which("gcp-storage-emulator")
    assert binary is not None, "gcp-storage-emulator is missing: pip install -e '.[test]'"
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [binary, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"]
    return Emulator(argv, port, folder / "gcs.log")


@contextmanager
def moto_s3(bucket: str) -> Iterator[tuple[dict[str, str], Any]]:
    """A moto S3 server on a free port holding an empty ``bucket``: the environment KServe's S3
    credentials give the storage initializer, and a boto3 client to fill the bucket with."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "S3_USE_HTTPS": "0",
        "S3_VERIFY_SSL": "0",
    }
    try:
        client = boto3.client(
            "s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        client.create_bucket(Bucket=bucket)
        yield env, client
    finally:
        server.stop()
