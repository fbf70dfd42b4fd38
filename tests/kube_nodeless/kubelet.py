"""A stand-in for the kubelet, and for the cluster network, on a control plane that has neither.

kube-local.sh runs a real API server and controllers but no node, so pods stay Pending. This
harness watches one namespace and does what a kubelet would with each pod: it runs the pod's
container command as a local process with the pod's environment (values, field references,
Secret and ConfigMap keys, ``$(VAR)`` expansion), provides its volumes as folders (ConfigMaps
written out, a PersistentVolumeClaim as a folder that outlives the pod), runs readiness probes,
reports the pod's status through the real API (Running, Ready, Succeeded, Failed with exit code,
reason and the last log lines), restarts containers of ``restartPolicy: Always`` pods, and kills
the process when its pod is deleted. A pod that mounts a service account token gets a kubeconfig
with a real token for that account (TokenRequest), so the API server enforces its Role.

The pod network (loopback pod IPs, cluster DNS names, Services, port-forwards) is
:class:`tests.kube_nodeless.network.PodNetwork`; nothing listens anywhere but on loopback addresses.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests import zygote
from tests.kube_nodeless.network import PodNetwork, container_port

REPO = Path(__file__).resolve().parents[2]
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodProcess:
    name: str
    uid: str
    ip: str
    pod: dict[str, Any]
    log: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    ready: bool = False
    done: bool = False
    started_at: str = field(default_factory=_now)


class HarnessKubelet:
    """Runs the pods of ``namespace`` as local processes; see the module docstring."""

    def __init__(self, kubeconfig: Path, namespace: str, root: Path):
        from kubernetes import config as kube_config

        self.kubeconfig = kubeconfig
        self.api = kube_config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.namespace = namespace
        self.root = root
        self.pods: dict[str, PodProcess] = {}     # uid -> process
        self.seen: dict[str, dict[str, Any]] = {}  # "Kind/name" -> the object when its pod started
        self.held_labels: dict[str, str] = {}      # pods matching these are "unschedulable"
        self.errors: list[str] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.network = PodNetwork(self.core, namespace, self._backends)

    # -- what tests control -------------------------------------------------------------------
    def start(self) -> HarnessKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            for running in self.pods.values():
                self._kill(running)
        self.network.close()

    def hold(self, label: str, value: str) -> None:
        """Pods with this label are never started; they get the scheduler's Unschedulable condition."""
        self.held_labels[label] = value

    def fail(self, pod_name: str, reason: str = "OOMKilled", exit_code: int = 137,
             evicted_message: str | None = None) -> None:
        """Kill a running pod's process as the node would (OOM kill, eviction) and report it."""
        with self._lock:
            running = next(p for p in self.pods.values() if p.name == pod_name)
            self._kill(running, graceful=False)
            running.done = True
        status: dict[str, Any] = {"phase": "Failed", "containerStatuses": [self._container_status(
            running, {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": running.started_at,
                                     "finishedAt": _now()}})]}
        if evicted_message:
            status.update(reason="Evicted", message=evicted_message)
        self._patch(running.name, status)

    # -- the kubelet loop ---------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as err:
                self.errors.append(f"{type(err).__name__}: {err}")
            self._stop.wait(0.1)

    def _sync(self) -> None:
        listed = [self.api.sanitize_for_serialization(p) for p in self.core.list_namespaced_pod(self.namespace).items]
        live = {p["metadata"]["uid"]: p for p in listed}
        with self._lock:
            for pod in listed:
                self.network.ip(pod["metadata"]["uid"])
            for uid, pod in live.items():
                if uid in self.pods or pod["metadata"].get("deletionTimestamp") \
                        or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                if self._held(pod):
                    self._report_unschedulable(pod)
                else:
                    self._start(pod)
            for uid, running in list(self.pods.items()):
                if uid not in live:
                    self._kill(running)
                    del self.pods[uid]
                elif not running.done and running.proc and running.proc.poll() is not None:
                    self._exited(running)
                elif not running.ready and not running.done:
                    self._probe(running)

    def _backends(self) -> list[tuple[dict[str, Any], str]]:
        """(pod, IP) of every pod whose container runs: what Services route to."""
        with self._lock:
            return [(p.pod, p.ip) for p in self.pods.values() if not p.done]

    def _held(self, pod: dict[str, Any]) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return any(labels.get(k) == v for k, v in self.held_labels.items())

    def _report_unschedulable(self, pod: dict[str, Any]) -> None:
        conditions = pod.get("status", {}).get("conditions") or []
        if not any(c["type"] == "PodScheduled" for c in conditions):
            self._patch(pod["metadata"]["name"], {"conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient cpu.", "lastTransitionTime": _now()}]})

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        container = spec["containers"][0]
        running = PodProcess(meta["name"], meta["uid"], self.network.ip(meta["uid"]), pod,
                             self.root / meta["name"] / "container.log")
        folder = self.root / meta["name"]
        mounts = self._volumes(pod, folder)
        env = self._environment(pod, container, running.ip, mounts, folder)
        command = [_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), part)
                   for part in container.get("command", []) + container.get("args", [])]
        running.pod["_command"] = [_remap(part, mounts) for part in command]
        running.pod["_env"] = env
        self._snapshot(pod)
        self.pods[meta["uid"]] = running
        self._run(running)
        self._patch(running.name, {"phase": "Running", "podIP": running.ip, "podIPs": [{"ip": running.ip}],
                                   "hostIP": "127.0.0.1", "startTime": running.started_at,
                                   **self._readiness(running, False)})

    def _run(self, running: PodProcess) -> None:
        command = running.pod["_command"]
        if command[0] == "python":
            command = [sys.executable] + command[1:]
        elif command[0] == "mlbench":
            command = [sys.executable, "-m", "mlbench"] + command[1:]
        with open(running.log, "ab") as log:   # a worker or the results service: forked by the tests' zygote
            running.proc = zygote.popen_module(command, running.pod["_env"], log, cwd=str(running.log.parent))

    def _volumes(self, pod: dict[str, Any], folder: Path) -> dict[str, str]:
        """mountPath -> local folder, for the first container's mounts."""
        local: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            if "persistentVolumeClaim" in volume:  # outlives the pod, like a PersistentVolume
                path = self.root / "pvc" / volume["persistentVolumeClaim"]["claimName"]
            else:
                path = folder / "volumes" / name
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                data = self.core.read_namespaced_config_map(volume["configMap"]["name"], self.namespace).data
                for key, value in (data or {}).items():
                    (path / key).write_text(value)
            local[name] = path
        container = pod["spec"]["containers"][0]
        return {m["mountPath"]: str(local[m["name"]]) for m in container.get("volumeMounts") or []
                if m["mountPath"] != "/dev/shm"}

    def _environment(self, pod: dict[str, Any], container: dict[str, Any], ip: str, mounts: dict[str, str],
                     folder: Path) -> dict[str, str]:
        home = folder / "home"
        home.mkdir(exist_ok=True)
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "PYTHONPATH": str(REPO),
               "GLOO_SOCKET_IFNAME": "lo",  # the harness's only network is the loopback
               "PYTHONWARNINGS": "ignore:Unverified HTTPS request"}  # kube-local's self-signed API
        fields = {"status.podIP": ip, "metadata.name": pod["metadata"]["name"],
                  "metadata.namespace": self.namespace}
        for item in container.get("env") or []:
            source = item.get("valueFrom")
            if source is None:
                value = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), item.get("value", ""))
            elif "fieldRef" in source:
                value = fields[source["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                secret = self.core.read_namespaced_secret(ref["name"], self.namespace)
                value = base64.b64decode(secret.data[ref["key"]]).decode()
            else:
                raise ValueError(f"the harness does not support env source {source}")
            env[item["name"]] = self.network.resolve(_remap(value, mounts))
        if self._mounts_token(pod):
            env["KUBECONFIG"] = str(self._service_account_kubeconfig(pod, folder))
        return env

    def _mounts_token(self, pod: dict[str, Any]) -> bool:
        spec = pod["spec"]
        if spec.get("automountServiceAccountToken") is not None:
            return bool(spec["automountServiceAccountToken"])
        account = self.core.read_namespaced_service_account(spec.get("serviceAccountName", "default"),
                                                            self.namespace)
        return account.automount_service_account_token is not False

    def _service_account_kubeconfig(self, pod: dict[str, Any], folder: Path) -> Path:
        account = pod["spec"].get("serviceAccountName", "default")
        token = self.core.create_namespaced_service_account_token(
            account, self.namespace, {"spec": {"expirationSeconds": 3600}}).status.token
        server = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]
        path = folder / "serviceaccount.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "cluster", "cluster": server}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": account,
                                                     "namespace": self.namespace}}]}))
        return path

    def _snapshot(self, pod: dict[str, Any]) -> None:
        """Remember the pod and the run objects it refers to, as the API server returned them."""
        self.seen[f"Pod/{pod['metadata']['name']}"] = pod
        subdomain = pod["spec"].get("subdomain")
        if subdomain:
            self.seen[f"Service/{subdomain}"] = self.api.sanitize_for_serialization(
                self.core.read_namespaced_service(subdomain, self.namespace))
        for volume in pod["spec"].get("volumes") or []:
            if "configMap" in volume:
                name = volume["configMap"]["name"]
                self.seen[f"ConfigMap/{name}"] = self.api.sanitize_for_serialization(
                    self.core.read_namespaced_config_map(name, self.namespace))

    def _probe(self, running: PodProcess) -> None:
        container = running.pod["spec"]["containers"][0]
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        if probe:
            url = f"http://{running.ip}:{container_port(running.pod, probe['port'])}{probe.get('path', '/')}"
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status >= 400:
                        return
            except OSError:
                return
        running.ready = True
        self._patch(running.name, self._readiness(running, True))

    def _readiness(self, running: PodProcess, ready: bool) -> dict[str, Any]:
        flag = "True" if ready else "False"
        return {"conditions": [{"type": t, "status": s, "lastTransitionTime": _now()} for t, s in
                               (("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", flag),
                                ("Ready", flag))],
                "containerStatuses": [self._container_status(running, {"running": {"startedAt": running.started_at}},
                                                             ready)]}

    def _container_status(self, running: PodProcess, state: dict[str, Any], ready: bool = False) -> dict[str, Any]:
        container = running.pod["spec"]["containers"][0]
        return {"name": container["name"], "image": container["image"], "imageID": "", "ready": ready,
                "restartCount": running.restarts, "started": "running" in state, "state": state}

    def _exited(self, running: PodProcess) -> None:
        code = running.proc.returncode
        if running.pod["spec"].get("restartPolicy", "Always") == "Always":
            running.restarts += 1
            running.ready = False
            time.sleep(0.3)
            self._run(running)
            self._patch(running.name, self._readiness(running, False))
            return
        running.done = True
        terminated = {"exitCode": code if code >= 0 else 128 - code, "reason": "Completed" if code == 0 else "Error",
                      "startedAt": running.started_at, "finishedAt": _now()}
        container = running.pod["spec"]["containers"][0]
        if code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            terminated["message"] = "\n".join(running.log.read_text(errors="replace").splitlines()[-80:])[-2048:]
        self._patch(running.name, {"phase": "Succeeded" if code == 0 else "Failed",
                                   "containerStatuses": [self._container_status(running, {"terminated": terminated})]})

    def _kill(self, running: PodProcess, graceful: bool = True) -> None:
        """SIGTERM, then SIGKILL after a grace period (as for a deleted pod); or SIGKILL at once."""
        proc = running.proc
        if proc is None or proc.poll() is not None:
            return
        steps = ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)) if graceful else ((signal.SIGKILL, 5.0),)
        for sig, wait in steps:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def _patch(self, name: str, status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})
        except client.ApiException as err:
            if err.status != 404:  # a pod deleted meanwhile has no status to report
                raise


def _remap(value: str, mounts: dict[str, str]) -> str:
    """Paths under a mount point -> the local folder that stands for the volume."""
    if not mounts:
        return value
    paths = "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))
    return re.sub(rf"(?<![\w/.-])({paths})(?=/|$|\s)", lambda m: mounts[m.group(1)], value)  # one pass
