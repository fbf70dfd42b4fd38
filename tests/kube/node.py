"""One real Kubernetes node on this machine, for the tests that run mlbench's pods for real.

``kube-local.sh start DIR`` + ``node DIR`` give a control plane and a node (Docker engine,
kubelet, scheduler; see the script). This harness adds what a cluster has and the script leaves
out, each a real Kubernetes component where one exists:

- **kube-proxy** (iptables mode, built by kube-local.sh): Service ClusterIPs work from pods. Its
  rules, and the kubelet's chains, are removed at the end.
- **the API server for pods**: it listens on 127.0.0.1 only, and publishes no endpoint for the
  ``kubernetes`` Service (a loopback address is not a valid endpoint). The harness relays TCP
  from the node's bridge address to it and writes that address as the Service's endpoint, so
  in-cluster clients (the results service's supervisor) reach it at 10.96.0.1:443 as in a cluster.
- **volume binding**: a second kube-controller-manager runs only the controllers the script's
  does not (persistentvolume-binder, pvc-protection, pv-protection); the tests create hostPath
  PersistentVolumes for the claims of a namespace (a folder per claim, owned by the pods' user).
- **the service-account CA**: the script's controller manager has no ``--root-ca-file``, so the
  token Secrets it writes carry an empty ``ca.crt``; the harness fills it with the API server's
  self-signed CA (what that flag would do), so in-cluster clients (the results service's
  supervisor) verify the API server.
- **cluster DNS**: :class:`tests.kube.cluster_dns.ClusterDNS` on the node's bridge address,
  which the kubelet gives pods as their nameserver (the one stand-in: CoreDNS is not in Debian).

Anything that cannot start makes the tests skip with the reason.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import socketserver
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes import config as kube_config

from tests.helpers import command_lines, pump
from tests.kube.cluster_dns import ClusterDNS
from tests.kube_local import CONTROL_PLANE_PARTS, KUBE_LOCAL, ControlPlaneDown, dead_part, start_control_plane
from tests.kube_local import stop as stop_control_plane

KUBE_BIN = Path(os.environ.get("KUBE_LOCAL_CACHE", Path.home() / ".cache" / "kube-local" / "v1.20.2-r2")) / "bin"
NODE_NAME = "kube-local-node"
#: the processes ``kube-local.sh node`` adds, as its pid files name them
NODE_PARTS = ("dockerd", "kubelet", "scheduler")
UID = 1000  # the image's user (docker/Dockerfile): hostPath volumes are not chowned by fsGroup
ROUTE_LOCALNET = Path("/proc/sys/net/ipv4/conf/all/route_localnet")


class NodeUnavailable(Exception):
    """The node (or a part the tests need) cannot run on this machine; the message says why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 1) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return " | ".join(text[-lines:]) or "empty log"


@dataclass
class LocalNode:
    """The control plane and node in ``state`` and the harness's own processes."""

    state: Path
    kubeconfig: Path
    ip: str
    docker_host: str
    api: Any
    image: str = ""  # the worker image on the node's engine (tests/kube/images.py)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    dns: ClusterDNS | None = None
    relay: socketserver.ThreadingTCPServer | None = None
    route_localnet: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def docker(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "DOCKER_HOST": self.docker_host})
        if check and proc.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def containers(self) -> list[str]:
        """Names of the engine's containers (running or not) that belong to pods."""
        out = self.docker("ps", "-a", "--format", "{{.Names}}").stdout.split()
        return [name for name in out if name.startswith("k8s_")]

    # -- start ------------------------------------------------------------------------------
    @classmethod
    def start(cls, state: Path) -> LocalNode:
        if not KUBE_LOCAL.exists():
            raise NodeUnavailable(f"kube-local.sh not found at {KUBE_LOCAL} (set KUBE_LOCAL_SH)")
        if os.geteuid() != 0:
            raise NodeUnavailable("a Kubernetes node needs root (dockerd, kubelet, iptables)")
        build = subprocess.run(["bash", str(KUBE_LOCAL), "build"], capture_output=True, text=True, timeout=1800)
        if build.returncode != 0:
            raise NodeUnavailable("kube-local.sh build failed: " + _last(build.stderr))
        state.mkdir(parents=True, exist_ok=True)
        try:
            start_control_plane(state)
        except ControlPlaneDown:
            stop_kube_local(state)
            raise
        added = subprocess.run(["bash", str(KUBE_LOCAL), "node", str(state)], capture_output=True, text=True,
                               timeout=300, env={**os.environ, "KUBE_LOCAL_CLUSTER_DNS": "node"})
        dead = dead_part(state, (*CONTROL_PLANE_PARTS, *NODE_PARTS))
        if added.returncode != 0 or dead:
            stop_kube_local(state)
            if dead:  # a port taken meanwhile (tests/kube_local.py): the fixture starts again
                raise ControlPlaneDown(dead)
            raise NodeUnavailable("kube-local.sh node failed: " + _last(added.stderr))
        env = dict(line.split("=", 1) for line in (state / "env").read_text().split("\n") if "=" in line)
        kubeconfig = state / "kubeconfig"
        node = cls(state, kubeconfig, env["KUBE_LOCAL_NODE_IP"], env["DOCKER_HOST"],
                   kube_config.new_client_from_config(config_file=str(kubeconfig)))
        try:
            node._start_extras()
        except BaseException:
            node.stop()
            raise
        return node

    def _start_extras(self) -> None:
        try:
            self.dns = ClusterDNS(client.CoreV1Api(kube_config.new_client_from_config(
                config_file=str(self.kubeconfig))), self.ip).start()
        except OSError as err:
            raise NodeUnavailable(f"the cluster DNS stand-in cannot listen on {self.ip}:53 ({err})") from None
        self._relay_api_server()
        self._spawn("volume-binder", [
            str(KUBE_BIN / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--port=0", "--leader-elect=false",
            "--controllers=persistentvolume-binder,pvc-protection,pv-protection"])
        self.route_localnet = ROUTE_LOCALNET.read_text().strip()
        self._spawn("kube-proxy", [
            str(KUBE_BIN / "kube-proxy"), f"--kubeconfig={self.kubeconfig}", f"--hostname-override={NODE_NAME}",
            "--proxy-mode=iptables", "--masquerade-all", "--conntrack-max-per-core=0",
            "--feature-gates=EndpointSliceProxying=false",  # Endpoints: no EndpointSlice controller runs
            f"--metrics-bind-address=127.0.0.1:{free_port()}", f"--healthz-bind-address=127.0.0.1:{free_port()}",
            "--iptables-sync-period=5s"])
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # kube-local's self-signed API
        threading.Thread(target=self._fill_service_account_ca, daemon=True).start()
        self._wait_for_kube_proxy()

    def _relay_api_server(self) -> None:
        api = urllib.parse.urlsplit(self.api.configuration.host)
        upstream = (api.hostname, api.port)

        class Relay(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with socket.create_connection(upstream, timeout=30) as server:
                    server.settimeout(None)
                    back = threading.Thread(target=pump, args=(server, self.request), daemon=True)
                    back.start()
                    pump(self.request, server)
                    back.join(timeout=60)

        relay = socketserver.ThreadingTCPServer((self.ip, 0), Relay)
        relay.daemon_threads = True
        threading.Thread(target=relay.serve_forever, daemon=True).start()
        self.relay = relay
        self.core.create_namespaced_endpoints("default", {
            "metadata": {"name": "kubernetes"},
            "subsets": [{"addresses": [{"ip": self.ip}],
                         "ports": [{"name": "https", "port": relay.server_address[1], "protocol": "TCP"}]}]})

    def _spawn(self, name: str, command: list[str]) -> None:
        log = open(self.state / f"harness-{name}.log", "w")  # noqa: SIM115  (the process writes it)
        self.processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        time.sleep(0.5)
        if self.processes[name].poll() is not None:
            raise NodeUnavailable(f"{name} exited at once: {_tail(self.state / f'harness-{name}.log')}")

    def _wait_for_kube_proxy(self) -> None:
        """kube-proxy's rule for the ``kubernetes`` Service: pods can reach the API server."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rules = subprocess.run(["iptables", "-t", "nat", "-S", "KUBE-SERVICES"], capture_output=True, text=True)
            if "default/kubernetes" in rules.stdout:
                return
            if self.processes["kube-proxy"].poll() is not None:
                break
            time.sleep(0.5)
        raise NodeUnavailable(f"kube-proxy wrote no iptables rules: {_tail(self.state / 'harness-kube-proxy.log', 2)}")

    def _fill_service_account_ca(self) -> None:
        """Give every service-account token Secret the API server's CA (see the module docstring).

        Watched, not polled: a list of every Secret ten times a second, for the node's whole
        life, cost the API server, etcd and this process 5 CPU-seconds a minute with nothing
        running (of the idle node's 6.4), about a tenth of a core for the quarter of an hour
        tests/kube runs. The watch's first events are the Secrets that exist; each one the
        controller manager writes or updates after comes as it happens."""
        pem = (self.state / "certs" / "apiserver.crt").read_text()
        blocks = ["-----BEGIN" + b for b in pem.split("-----BEGIN")[1:]]
        ca = base64.b64encode((blocks[-1].strip() + "\n").encode()).decode()
        core = client.CoreV1Api(kube_config.new_client_from_config(config_file=str(self.kubeconfig)))
        while not self._stop.is_set():
            try:
                # ends every few seconds (the server's timeout) so that a stopped node ends it
                for event in watch.Watch().stream(core.list_secret_for_all_namespaces, timeout_seconds=5,
                                                  field_selector="type=kubernetes.io/service-account-token"):
                    secret = event["object"]
                    if event["type"] in ("ADDED", "MODIFIED") and not (secret.data or {}).get("ca.crt"):
                        core.patch_namespaced_secret(secret.metadata.name, secret.metadata.namespace,
                                                     {"data": {"ca.crt": ca}})
            except Exception:
                self._stop.wait(0.5)

    # -- what tests use ----------------------------------------------------------------------
    def add_volumes(self, namespace: str, claims: list[str], root: Path, size: str = "100Gi") -> list[str]:
        """A hostPath PersistentVolume reserved for each claim of ``namespace`` (folders under root)."""
        names = []
        for claim in claims:
            folder = root / claim
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, UID, UID)
            name = f"{namespace}-{claim}"
            self.core.create_persistent_volume({
                "metadata": {"name": name, "labels": {"mlbench-test/namespace": namespace}},
                "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                         "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(folder)},
                         "claimRef": {"namespace": namespace, "name": claim}}})
            names.append(name)
        return names

    def delete_volumes(self, namespace: str) -> None:
        for pv in self.core.list_persistent_volume(label_selector=f"mlbench-test/namespace={namespace}").items:
            try:
                self.core.delete_persistent_volume(pv.metadata.name)
            except client.ApiException as err:
                if err.status != 404:
                    raise

    def restart_engine(self) -> None:
        """Stop the node's Docker engine (its containers die with it) and start it again."""
        pid_file = self.state / "dockerd.pid"
        command = Path(f"/proc/{int(pid_file.read_text())}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        _end_process(pid_file, timeout=60)
        with open(self.state / "dockerd.log", "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        (self.state / "dockerd.pid").write_text(str(process.pid))
        deadline = time.monotonic() + 60
        while self.docker("info", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"dockerd did not come back: {_tail(self.state / 'dockerd.log', 3)}")
            time.sleep(0.5)

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()
        if self.dns is not None:
            self.dns.stop()
        if self.relay is not None:
            self.relay.shutdown()
            self.relay.server_close()
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if "kube-proxy" in self.processes:
            subprocess.run([str(KUBE_BIN / "kube-proxy"), "--cleanup"], capture_output=True, timeout=60)
        if self.route_localnet is not None:
            ROUTE_LOCALNET.write_text(self.route_localnet)
        # the kubelet first: kube-local.sh removes the containers while the engine still runs,
        # and a kubelet still running would start those of pods still there again in between
        # (they would outlive the node and pin its images)
        _end_process(self.state / "kubelet.pid")
        stop_kube_local(self.state)
        end_orphaned_shims(self.state)
        remove_kube_chains()


def end_orphaned_shims(state: Path) -> None:
    """SIGKILL the containerd shims of the node's engine (in ``state``) that outlived it. A shim
    whose engine was stopped under it (:meth:`LocalNode.restart_engine`) can stay, its container
    gone, its folder deleted: one was found idle 47 minutes after a loaded session had ended."""
    marker = str(state).encode()
    for pid, argv in command_lines():
        if argv[0].endswith(b"containerd-shim-runc-v2") and any(marker in arg for arg in argv[1:]):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def remove_kube_chains() -> None:
    """The iptables chains the kubelet and kube-proxy leave (KUBE-FIREWALL, KUBE-MARK-*, canaries)."""
    for table in ("filter", "nat", "mangle"):
        rules = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True).stdout.splitlines()
        for rule in rules:
            parts = rule.split()
            if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and "KUBE-" in rule:
                subprocess.run(["iptables", "-t", table, "-D", *parts[1:]], capture_output=True)
        chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
        for chain in chains:
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True)
        for chain in chains:
            subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True)


def _end_process(pid_file: Path, timeout: float = 20) -> None:
    """SIGTERM the process a pid file names and wait for it to go (SIGKILL after ``timeout``)."""
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def stop_kube_local(state: Path) -> None:
    """kube-local.sh stop: the pods' containers, the node, the control plane, the kubelet's mounts.

    The folder stays: it holds the engine's data root, with the images, for the next session.
    """
    stop_control_plane(state)


def _last(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
