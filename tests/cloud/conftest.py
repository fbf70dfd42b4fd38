"""Fixtures for the cluster tests: no cloud, no internet, nothing but 127.0.0.1.

- ``cloud_env`` (autouse): a private config folder, no cloud credentials from this machine,
  metadata servers pointed at a closed local port, Docker pointed nowhere, and this machine's
  public address asked of ``address_service`` (which answers 203.0.113.7).
- ``moto``: moto's server on 127.0.0.1 (real boto3 over HTTP), reset for every test.
- ``kube_local``: a real kube-apiserver from ../shared/k8s/kube-local.sh (once per test package).
- ``docker_engine``: Debian's dockerd started by the test on a private socket.
- ``kind_standin``: a `kind` executable on PATH that replays kind's behaviour (kind_standin.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.kube_local import KUBE_LOCAL, ControlPlaneDown, start_control_plane
from tests.kube_local import stop as stop_control_plane

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CLOSED = "127.0.0.1:9"  # nothing listens on the discard port: lookups fail at once, locally
PUBLIC_ADDRESS = "203.0.113.7"  # TEST-NET-3 (RFC 5737): the address the stand-in reports


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _WhatIsMyAddress(BaseHTTPRequestHandler):
    """Answers as checkip.amazonaws.com does: the caller's public address and a newline."""

    def do_GET(self) -> None:
        body = f"{PUBLIC_ADDRESS}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="session")
def address_service():
    """A what-is-my-address service on 127.0.0.1 (real HTTP), for create-cluster's default."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _WhatIsMyAddress)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def cloud_env(tmp_path, monkeypatch, address_service):
    """Isolate every test from this machine's cloud, Kubernetes and Docker settings."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "DOCKER_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("MLBENCH_CONFIG_DIR", str(tmp_path / "mlbench-config"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", CLOSED)
    monkeypatch.setenv("GCE_METADATA_IP", CLOSED)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    monkeypatch.setenv("MLBENCH_PUBLIC_ADDRESS_URL", address_service)
    return tmp_path


@pytest.fixture(scope="session")
def moto_url():
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def moto(moto_url, monkeypatch):
    """AWS credentials and endpoint for a freshly reset moto server."""
    import requests

    # AWS's managed policies (AmazonEKSClusterPolicy...) exist in every real account
    monkeypatch.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
    requests.post(f"{moto_url}/moto-api/reset", timeout=120).raise_for_status()  # slow when loaded
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAMLBENCHTEST00001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "mlbench-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return moto_url


@pytest.fixture(scope="package")
def kube_local(tmp_path_factory):
    """A real control plane on 127.0.0.1; the path of its admin kubeconfig, for this package's
    tests, stopped after its last one: the later tests are timed, and an idle control plane
    still takes a share of the two cores (tests/kube has its own, for one module)."""
    yield from control_plane(tmp_path_factory)


def control_plane(tmp_path_factory) -> Iterator[Path]:
    """kube-local.sh's control plane (no node) started, its admin kubeconfig given, then stopped.

    A start whose etcd, API server or controller manager exits is tried once more, in a fresh
    folder with new ports (tests/kube_local.py says why a part may exit on a busy box)."""
    if not KUBE_LOCAL.exists():
        pytest.skip(f"kube-local.sh not found at {KUBE_LOCAL} (set KUBE_LOCAL_SH)")
    build = subprocess.run(["bash", str(KUBE_LOCAL), "build"], capture_output=True, text=True,
                           timeout=1500)
    if build.returncode != 0:
        pytest.skip("kube-apiserver could not be built by kube-local.sh: "
                    + (build.stderr.strip().splitlines() or ["no output"])[-1])
    failures: list[str] = []
    for _ in range(2):
        state = tmp_path_factory.mktemp("kube-local")
        try:
            kubeconfig = start_control_plane(state)
            break
        except ControlPlaneDown as down:
            failures.append(str(down))
            stop_control_plane(state)
    else:
        raise RuntimeError("the local control plane did not start, twice: " + "; then ".join(failures))
    yield kubeconfig
    stop_control_plane(state)


#: the bridge of the tests' own Docker engine, and its address (a range no other part uses)
ENGINE_BRIDGE, ENGINE_BRIDGE_ADDRESS = "mlbtestdock0", "10.231.0.1/24"


def _ip(*args: str) -> None:
    """``ip ARGS``, whatever it answers (a bridge to delete may not exist)."""
    subprocess.run(["ip", *args], capture_output=True, check=False)


@pytest.fixture(scope="module")
def docker_engine(tmp_path_factory):
    """A Docker engine (Debian's docker.io) on a private socket, for the module that uses it.

    It gets a bridge of its own: an engine started with ``--bridge=none`` deletes the host's
    ``docker0`` (moby's removeDefaultBridgeInterface), which is the real node's network when
    tests/kube runs beside this module (pytest-xdist) and would cut every pod off."""
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        pytest.skip("no Docker engine: dockerd is not installed or not root "
                    "(apt-get install docker.io)")
    base = Path(tmp_path_factory.mktemp("dockerd"))
    sock = f"unix://{base}/docker.sock"
    log = open(base / "dockerd.log", "w")  # noqa: SIM115  (the daemon writes it for the session)
    _ip("link", "del", ENGINE_BRIDGE)   # one a killed session left
    _ip("link", "add", ENGINE_BRIDGE, "type", "bridge")
    _ip("addr", "add", ENGINE_BRIDGE_ADDRESS, "dev", ENGINE_BRIDGE)
    process = subprocess.Popen(
        [dockerd, "--host", sock, "--data-root", str(base / "root"),
         "--exec-root", str(base / "exec"), "--pidfile", str(base / "docker.pid"),
         "--iptables=false", "--ip6tables=false", f"--bridge={ENGINE_BRIDGE}", "--shutdown-timeout=1"],
        stdout=log, stderr=subprocess.STDOUT)
    import docker

    client = None
    for _ in range(60):
        if process.poll() is not None:
            break
        try:
            client = docker.DockerClient(base_url=sock, timeout=30)
            client.ping()
            break
        except Exception:
            client = None
            time.sleep(0.5)
    if client is None:
        process.kill()
        process.wait()
        _ip("link", "del", ENGINE_BRIDGE)
        tail = (base / "dockerd.log").read_text()[-300:].strip().splitlines()
        pytest.skip(f"dockerd could not start here: {tail[-1] if tail else 'no log'}")
    yield sock
    for container in client.containers.list(all=True):
        container.remove(force=True)
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    _ip("link", "del", ENGINE_BRIDGE)
    log.close()


@pytest.fixture
def kind_standin(tmp_path, monkeypatch):
    """Put the recorded `kind` stand-in first on PATH (run by this interpreter)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "kind"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "kind_standin.py"}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return wrapper
