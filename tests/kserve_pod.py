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

:func:`start_pod_in_image` is the other runner: the container as the kubelet starts it, in its
``image:`` under podman (the image built by tests/podman_image.py), with the same env, its
``command``/``args`` as Kubernetes applies them over the image's ENTRYPOINT/CMD, the model
folder mounted read-only at /mnt/models, the securityContext and resources asked of podman, and
each container port published on a free 127.0.0.1 port; nothing is translated inside.
:func:`runtime_defaults` does what KServe's controller adds for a runtime by its
``serving.kserve.io/server-type`` (for ``mlserver``: the ``MLSERVER_MODEL_*`` env and the
``modelClass`` label) and :func:`legacy_model` what its webhook does with a ``predictor.sklearn``
-style InferenceService.
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
import uuid
from collections.abc import Callable
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


LEGACY_FORMATS = ("sklearn", "xgboost", "lightgbm", "tensorflow", "pytorch", "onnx", "pmml")
MLSERVER_CLASSES = {
    "xgboost": "mlserver_xgboost.XGBoostModel",
    "lightgbm": "mlserver_lightgbm.LightGBMModel",
    "mlflow": "mlserver_mlflow.MLflowRuntime",
}
"""KServe's constants.MLServerModelClass*: the label value per modelFormat (default sklearn's)."""
MLSERVER_SKLEARN = "mlserver_sklearn.SKLearnModel"


def legacy_model(isvc: dict[str, Any]) -> dict[str, Any]:
    """KServe's webhook (setPredictorModelDefaults): ``predictor.sklearn: {...}`` becomes
    ``predictor.model: {modelFormat: {name: sklearn}, ...}``; other InferenceServices as given."""
    isvc = copy.deepcopy(isvc)
    predictor = isvc["spec"]["predictor"]
    for name in LEGACY_FORMATS:
        if name in predictor:
            predictor["model"] = {"modelFormat": {"name": name}, **predictor.pop(name)}
    return isvc


def runtime_defaults(runtime: dict[str, Any], isvc: dict[str, Any]) -> dict[str, Any]:
    """KServe's SetRuntimeDefaults, chosen by the runtime's server-type annotation. For
    ``mlserver`` (SetMlServerDefaults): protocol v2 unless set; ``MLSERVER_MODEL_NAME`` (the
    InferenceService's name) and ``MLSERVER_MODEL_URI`` (/mnt/models) when a storageUri is set,
    else ``MLSERVER_LOAD_MODELS_AT_STARTUP=false``, each only if the env lacks it; the
    ``modelClass`` label the runtime's env templates into MLSERVER_MODEL_IMPLEMENTATION."""
    isvc = copy.deepcopy(isvc)
    annotations = runtime["metadata"].get("annotations", {})
    if annotations.get("serving.kserve.io/server-type") != "mlserver":
        return isvc
    model = isvc["spec"]["predictor"]["model"]
    model.setdefault("protocolVersion", "v2")
    if "storageUri" in model or "storage" in model:
        added = {"MLSERVER_MODEL_NAME": isvc["metadata"]["name"], "MLSERVER_MODEL_URI": MODEL_MOUNT}
    else:
        added = {"MLSERVER_LOAD_MODELS_AT_STARTUP": "false"}
    env = model.setdefault("env", [])
    have = {entry["name"] for entry in env}
    env += [{"name": k, "value": v} for k, v in added.items() if k not in have]
    model_class = MLSERVER_CLASSES.get(model["modelFormat"]["name"], MLSERVER_SKLEARN)
    isvc["metadata"].setdefault("labels", {})["modelClass"] = model_class
    return isvc


def pod_container(runtime: dict[str, Any], isvc: dict[str, Any]) -> dict[str, Any]:
    """The container KServe's controller would write for ``isvc`` served by ``runtime``."""
    (base,) = [c for c in runtime["spec"]["containers"] if c["name"] == "kserve-container"]
    isvc = runtime_defaults(runtime, legacy_model(isvc))
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
    remove: Callable[[], None] | None = None
    """What else stopping the pod takes (podman: removing its container)."""

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
        if self.remove is not None:  # podman: stop and remove the container; `podman run` ends
            self.remove()
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


KSERVE_E2E = Path(__file__).with_name("data") / "kserve-e2e"
"""The request files of KServe's e2e tests, which ``ask_clients`` calls name."""
CLIENT = Path(__file__).with_name("kserve_pod_client.py")


def ask_clients(python: Path, pod: Pod, calls: list[dict[str, Any]]) -> list[Any]:
    """KServe's clients, run by ``python`` (KServe's venv), send ``calls`` to ``pod``'s HTTP
    port 8080 (gRPC calls to 8081) unless a call names its own address; their answers, in
    order. A client's error fails the test, with the pod's output."""
    for entry in calls:
        entry["file"] = str(KSERVE_E2E / entry["file"])
        entry.setdefault("url", pod.url(8080))
        if entry["kind"] == "grpc":
            entry.setdefault("target", pod.target(8081))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run(
        [str(python), str(CLIENT)], input=json.dumps(calls), capture_output=True, text=True,
        timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    answers: list[Any] = json.loads(result.stdout)
    for entry, answer in zip(calls, answers, strict=True):
        assert not (isinstance(answer, dict) and "error" in answer), (entry, answer, pod.output())
    return answers


def broken_runtime(runtime: dict[str, Any], how: str) -> dict[str, Any]:
    """A copy of ``runtime`` broken as a careless edit would break it: ``args`` without
    ``--model-dir``, another ``port``, a wrong readiness ``probe`` path, or the
    ``image-command`` the image had before it honoured MLServer's environment."""
    broken = copy.deepcopy(runtime)
    container = broken["spec"]["containers"][0]
    args = container.get("args", [])
    if how == "args":  # the model mount not passed: servekit looks for serve.yaml instead
        index = args.index("--model-dir")
        del args[index : index + 2]
    elif how == "port":
        args[args.index("--http-port") + 1] = "9090"
    elif how == "probe":
        container["readinessProbe"]["httpGet"]["path"] = "/v2/health/readiness"
    elif how == "image-command":  # the image's command before MLServer's env was honoured
        container["args"] = ["serve", "/srv/serve.yaml", "--host", "0.0.0.0"]
    return broken


def pod_ports(container: dict[str, Any]) -> dict[int, int]:
    """The pod's ports, each given a free port on this machine: Knative's, the declared ones,
    and every port number the args name (--grpc-port 8081)."""
    ports = {KNATIVE_PORT: free_port()}
    for entry in container.get("ports", []):
        ports.setdefault(int(entry["containerPort"]), free_port())
    for arg in container.get("args", []):
        for number in re.findall(r"(?:^|=)(80[0-9][0-9]|9[0-9]{3})$", arg):
            ports.setdefault(int(number), free_port())
    return ports


def knative_env() -> dict[str, str]:
    """What Knative sets in the user container."""
    return {"PORT": str(KNATIVE_PORT), "K_SERVICE": "isvc-predictor",
            "K_CONFIGURATION": "isvc-predictor", "K_REVISION": "isvc-predictor-00001"}  # fmt: skip


def start_pod(container: dict[str, Any], models: Path, log: Path) -> Pod:
    """Start the container's command as the kubelet would, in a pretend network namespace."""
    ports = pod_ports(container)

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
    env.update(knative_env())
    workdir = log.parent / "container-root"  # the image's files, not this checkout's
    workdir.mkdir(exist_ok=True)
    handle = log.open("wb")
    process = subprocess.Popen(
        argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        cwd=workdir,
    )  # fmt: skip
    handle.close()
    return Pod(container, process, ports, log)


def podman_security(container: dict[str, Any]) -> list[str]:
    """The container's securityContext and resource limits, asked of podman."""
    context = container.get("securityContext", {})
    flags: list[str] = []
    if "ALL" in context.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", "ALL"]
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if context.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--tmpfs", "/tmp:rw,mode=1777"]
    if "runAsUser" in context:
        flags += [
            "--user",
            f"{context['runAsUser']}:{context.get('runAsGroup', context['runAsUser'])}",
        ]
    limits = container.get("resources", {}).get("limits", {})
    if "cpu" in limits:  # "1", "0.5" or "100m"
        cpu = str(limits["cpu"])
        flags += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
    if "memory" in limits:  # "2Gi", "512Mi"
        flags += ["--memory", str(limits["memory"]).replace("Gi", "g").replace("Mi", "m")]
    return flags


def start_pod_in_image(
    container: dict[str, Any], models: Path, log: Path, podman_env: dict[str, str]
) -> Pod:
    """Start the container as the kubelet would, in its ``image:`` under podman: Kubernetes'
    ``command`` replaces the image's ENTRYPOINT (and then its CMD), ``args`` replace its CMD;
    ``models`` is mounted read-only at /mnt/models; the container's ports published on free
    127.0.0.1 ports; its output is ``log``. A ``runAsNonRoot`` container whose image runs as
    root is refused, as the kubelet refuses it."""
    name = f"kserve-pod-{uuid.uuid4().hex[:10]}"
    ports = pod_ports(container)
    image = container["image"]
    if container.get("securityContext", {}).get("runAsNonRoot"):
        user = subprocess.run(
            ["podman", "image", "inspect", "-f", "{{.Config.User}}", image],
            env=podman_env, capture_output=True, text=True, timeout=60, check=True,
        ).stdout.strip()  # fmt: skip
        assert user.split(":")[0] not in ("", "0", "root"), f"the image runs as root: {user!r}"
    for item in [models, *models.rglob("*")]:  # the storage initializer's files, to uid 10001
        item.chmod(0o755 if item.is_dir() else 0o644)
    env = {**{e["name"]: str(e["value"]) for e in container.get("env", [])}, **knative_env()}
    argv = ["podman", "run", "--rm", "--name", name, "--health-interval=disable",
            *podman_security(container), *(f"--env={k}={v}" for k, v in env.items()),
            "-v", f"{models}:{MODEL_MOUNT}:ro",
            *(f"-p=127.0.0.1:{host}:{port}" for port, host in ports.items())]  # fmt: skip
    if "command" in container:
        argv += ["--entrypoint", json.dumps(container["command"])]
    argv += [image, *container.get("args", [])]
    handle = log.open("wb")
    process = subprocess.Popen(
        argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=podman_env
    )
    handle.close()

    def remove() -> None:
        subprocess.run(["podman", "rm", "-f", "-t", "3", "--ignore", name], env=podman_env,
                       capture_output=True, timeout=60)  # fmt: skip

    return Pod(container, process, ports, log, remove=remove)
