"""The emulated network itself, measured with a plain TCP stream: as a user without root, and the
pod shaping module (what a worker pod's init container runs on Kubernetes) on a real interface."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlbench.network.emulation import LocalNetwork
from mlbench.network.netns import WORKER_IF
from mlbench.network.settings import NetworkSettings
from tests.network.conftest import namespace_references, nobody_folder
from tests.network.throughput import best_goodput

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shaping")]

REPO = Path(__file__).resolve().parents[2]
RATE = 100e6


def test_the_pod_shaping_module_limits_both_directions_of_an_interface(tmp_path):
    network = LocalNetwork(NetworkSettings(), 2, tmp_path / "network.log")  # links, no qdiscs
    network.start()
    try:
        shape = [sys.executable, "-m", "mlbench.network.shape", "--device", WORKER_IF, "--bandwidth", "100mbit"]
        for _ in range(2):  # a second run replaces what the first set up
            proc = subprocess.run(network.worker_command(0, shape), capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
        assert "Shaped mlb0: 100 Mbit/s" in proc.stdout
        sent, received = best_goodput(network, 0, 1, 0.85 * RATE), best_goodput(network, 1, 0, 0.85 * RATE)
    finally:
        network.stop()
    assert 0.85 * RATE <= sent <= 1.02 * RATE
    assert 0.85 * RATE <= received <= 1.02 * RATE     # the ingress, through the ifb device


def test_a_user_without_root_gets_the_same_network_in_a_user_namespace():
    """Run the launcher's network code as ``nobody`` (with the system Python: it needs nothing
    but the standard library) and measure the link it builds."""
    with nobody_folder() as (python, folder):
        answer = _as_nobody(python, folder)
    if "skip" in answer:
        pytest.skip(f"unprivileged user namespaces are not allowed here: {answer['skip']}")
    assert answer["uid"] == 65534 and answer["user_ns"]
    assert 0.85 * RATE <= answer["bps"] <= 1.02 * RATE
    assert not set(answer["namespaces"]) & namespace_references(answer["stopping_at"])


def _as_nobody(python: str, tmp_path: Path) -> dict:
    script = f"""
import json, os, sys, time
from pathlib import Path
from mlbench.network.emulation import LocalNetwork, _check
from mlbench.network.settings import NetworkSettings
from tests.network.throughput import best_goodput
problem = _check(False)
if problem:
    print(json.dumps({{"skip": problem}})); sys.exit(0)
network = LocalNetwork(NetworkSettings(bandwidth_bps={RATE}), 2, Path({str(tmp_path)!r}) / "network.log")
network.start()
user_ns = os.readlink(f"/proc/{{network.pid}}/ns/user") != os.readlink("/proc/self/ns/user")
namespaces = [os.readlink(f"/proc/{{network.pid}}/ns/net")]
bps = best_goodput(network, 0, 1, {0.85 * RATE}, python=sys.executable)
stopping_at = time.clock_gettime(time.CLOCK_BOOTTIME)
network.stop()
print(json.dumps({{"uid": os.getuid(), "user_ns": user_ns, "bps": bps, "namespaces": namespaces,
                  "stopping_at": stopping_at}}))
"""
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", script],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
