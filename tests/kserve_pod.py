"""KServe's pod contract without a cluster: what KServe's controller and the kubelet do with a
ServingRuntime and an InferenceService, done on this machine.

Read from KServe's source (github.com/kserve/kserve, the commit in tests/data/kserve-crds/):

* the controller merges the InferenceService's ``predictor.model`` into the runtime's container
  named ``kserve-container`` (``MergeRuntimeContainers``: the InferenceService's fields win, its
  ``args`` are appended to the runtime's), then fills the Go template placeholders of the
  container from the InferenceService's metadata (``ReplacePlaceholders``: ``{{.Name}}``,
  ``{{.Namespace}}``, ``{{.Labels.x}}``, ``{{.Annotations.x}}``);
* the storage-initializer init container runs ``Storage.download_files([storageUri],
  ["/mnt/models"])`` of the ``kserve-storage`` package (its ``initializer-entrypoint``), with the
  store settings KServe's credential builder sets (``AWS_ENDPOINT_URL``, ``S3_USE_HTTPS``,
  ``AZURE_STORAGE_ACCESS_KEY``, ...) and those a ClusterStorageContainer's env or the global CA
  bundle add (``STORAGE_EMULATOR_HOST``, ``HTTPS_PROXY``, ``CA_BUNDLE_CONFIGMAP_NAME``);
* Knative sets ``PORT``, ``K_SERVICE``, ``K_CONFIGURATION`` and ``K_REVISION``;
* the kubelet starts the container's command with its args and env, and sends traffic only once
  the readiness probe answers 2xx, polling it every ``periodSeconds``.

Two things differ because there is no pod: the folder mounted at /mnt/models is a temporary
folder (its path replaces ``/mnt/models`` in the container), and the pod's own network namespace
is one port per container port picked free on 127.0.0.1 (the port numbers of the args, env and
probes are translated), so a runtime listening on another port than its probe asks is still
caught. ``servekit`` as the command is this checkout's ``python -m servekit``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from waits import wait_until

MODEL_MOUNT = "/mnt/models"
KNATIVE_PORT = 8080
PLACEHOLDER = re.compile(r"\{\{\s*\.([A-Za-z]+)(?:\.([A-Za-z0-9_./-]+))?\s*\}\}")
STORAGE_INIT = (
    "import sys\n"
    "from kserve_storage import Storage\n"
    "Storage.download_files(sys.argv[1::2], sys.argv[2::2])\n"
)
"""KServe's initializer-entrypoint, less its logging and confidential-model steps."""


def free_port() -> int:
    """A free port below the kernel's ephemeral range: the readiness probes connect before the
    server listens, and a connection to a free ephemeral port can connect to itself (TCP's
    simultaneous open) and hold the very port the server then cannot bind."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(20000, min(low, 32768)), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")


def template(container: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """KServe's ReplacePlaceholders: Go's text/template over the container's JSON, with the
    InferenceService's metadata as data; a placeholder it cannot fill is an error, as in Go."""

    def fill(match: re.Match[str]) -> str:
        field_name, key = match.group(1), match.group(2)
        if field_name in ("Name", "Namespace") and key is None:
            return str(meta.get(field_name.lower(), ""))
        if field_name in ("Labels", "Annotations") and key is not None:
            return str(meta.get(field_name.lower(), {}).get(key, "<no value>"))
        raise ValueError(f"template: can't evaluate field {match.group(0)}")

    return dict(json.loads(PLACEHOLDER.sub(fill, json.dumps(container))))


def merge(runtime_container: dict[str, Any], model_spec: dict[str, Any]) -> dict[str, Any]:
    """KServe's MergeRuntimeContainers for the fields a test's InferenceService sets: the
    InferenceService's win (env by name), its args come after the runtime's."""
    merged = copy.deepcopy(runtime_container)
    for key in ("readinessProbe", "livenessProbe", "startupProbe", "resources", "image"):
        if key in model_spec:
            merged[key] = copy.deepcopy(model_spec[key])
    env = {e["name"]: e for e in merged.get("env", [])}
    for entry in model_spec.get("env", []):
        env[entry["name"]] = entry
    merged["env"] = list(env.values())
    if "ports" in model_spec:
        merged["ports"] = copy.deepcopy(model_spec["ports"])
    merged["args"] = [*merged.get("args", []), *model_spec.get("args", [])]
    return merged


def pod_container(runtime: dict[str, Any], isvc: dict[str, Any]) -> dict[str, Any]:
    """The container KServe's controller would write for ``isvc`` served by ``runtime``."""
    (base,) = [c for c in runtime["spec"]["containers"] if c["name"] == "kserve-container"]
    model = isvc["spec"]["predictor"]["model"]
    return template(merge(base, model), isvc["metadata"])


NOT_IN_A_POD = ("PYTHONPATH", "PYTHONHOME", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
"""This machine's settings a storage-initializer container does not have: KServe's global CA
bundle is exported only where SSL_CERT_FILE and REQUESTS_CA_BUNDLE are unset."""
STORE_SETTINGS = ("AWS_", "S3_", "AZURE_", "AZ_", "GOOGLE_", "STORAGE_EMULATOR_HOST", "HTTPS_PROXY")


def storage_initializer(python: Path, uri: str, dest: Path, store_env: dict[str, str]) -> None:
    """Run KServe's storage initializer (kserve-storage in the KServe venv) into ``dest``, with
    ``store_env`` (what KServe's credential builder and storage container settings give it) as
    its only store settings."""
    dest.mkdir(parents=True, exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in NOT_IN_A_POD and not k.upper().startswith(STORE_SETTINGS)
    }
    result = subprocess.run(
        [str(python), "-c", STORAGE_INIT, uri, str(dest)],
        capture_output=True, text=True, timeout=120, env={**env, **store_env},
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, f"storage initializer failed:\n{result.stderr[-3000:]}"


@dataclass
class Pod:
    """One running pod: its container process and where its ports are on this machine."""

    container: dict[str, Any]
    process: subprocess.Popen[bytes]
    ports: dict[int, int]
    log: Path
    events: list[str] = field(default_factory=list)

    def url(self, container_port: int) -> str:
        return f"http://127.0.0.1:{self.ports[container_port]}"

    def target(self, container_port: int) -> str:
        return f"127.0.0.1:{self.ports[container_port]}"

    def probe(self, kind: str) -> bool:
        """One probe of the container as the kubelet sends it (httpGet, 2xx/3xx is success)."""
        spec = self.container.get(kind)
        if spec is None:
            return True
        get = spec["httpGet"]
        port = self.ports.get(int(get["port"]), int(get["port"]))
        try:
            status = httpx.get(
                f"http://127.0.0.1:{port}{get['path']}", timeout=spec.get("timeoutSeconds", 1)
            ).status_code
        except httpx.HTTPError:
            return False
        return 200 <= status < 400

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Poll the readiness probe until it succeeds (the kubelet's rhythm, made quicker);
        fail at once when the container exits, with its log."""
        period = min(float(self.container.get("readinessProbe", {}).get("periodSeconds", 1)), 0.2)
        deadline = time.monotonic() + timeout
        while not self.probe("readinessProbe"):
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the container exited ({self.process.returncode}) before it was ready:\n"
                    + self.output()
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"not ready within {timeout} s:\n{self.output()}")
            time.sleep(period)
        assert self.probe("livenessProbe"), "ready but not live"

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM, as the kubelet stops a container, and a second one once the first is taken
        (two at once would arrive as one): servekit would stay serving, unready, for
        ``drainDelaySeconds`` (5 s) after the first, which no test here looks at; a second
        signal cuts that short (tests/test_drain*.py hold the drain)."""
        if self.process.poll() is None:
            self.process.terminate()
            taken = lambda: self.process.poll() is not None or "servekit: stopping" in self.output()  # noqa: E731
            with contextlib.suppress(AssertionError):  # not taken: the wait below still ends it
                wait_until(taken, 10, "the container to take SIGTERM")
            if self.process.poll() is None:
                self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_pod(container: dict[str, Any], models: Path, log: Path) -> Pod:
    """Start the container's command as the kubelet would, in a pretend network namespace."""
    ports = {KNATIVE_PORT: free_port()}
    for entry in container.get("ports", []):
        ports.setdefault(int(entry["containerPort"]), free_port())
    # Every port number the args name (--grpc-port 8081) is a port of the pod's namespace.
    for arg in container.get("args", []):
        for number in re.findall(r"(?:^|=)(80[0-9][0-9]|9[0-9]{3})$", arg):
            ports.setdefault(int(number), free_port())

    def local(arg: str) -> str:
        arg = arg.replace(MODEL_MOUNT, str(models))
        if arg == "0.0.0.0":  # every interface of the pod: here, its loopback
            return "127.0.0.1"
        match = re.fullmatch(r"(.*?=)?(\d{4,5})", arg)
        if match and int(match.group(2)) in ports:
            return f"{match.group(1) or ''}{ports[int(match.group(2))]}"
        return arg

    command = container["command"]
    assert command[0] == "servekit", command
    argv = [sys.executable, "-m", "servekit", *command[1:], *map(local, container["args"])]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SERVEKIT_"))}
    for entry in container.get("env", []):
        env[entry["name"]] = local(str(entry["value"]))
    env["SERVEKIT_SERVER__STORAGEDIR"] = str(log.parent / "servekit-storage")  # the pod's /tmp
    env.update(PORT=str(KNATIVE_PORT), K_SERVICE="isvc-predictor")
    env.update(K_CONFIGURATION="isvc-predictor", K_REVISION="isvc-predictor-00001")
    workdir = log.parent / "container-root"  # the image's files, not this checkout's
    workdir.mkdir(exist_ok=True)
    handle = log.open("wb")
    process = subprocess.Popen(
        argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        cwd=workdir,
    )  # fmt: skip
    handle.close()
    return Pod(container, process, ports, log)
