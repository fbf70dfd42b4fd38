"""The private loopback of a local TensorFlow run (:class:`mlbench.network.emulation.PrivateLoopback`):
a socket bound to every interface inside it is reachable from its other processes (a fresh
interpreter through ``worker_command``, a forked one through ``enter``) and from nothing outside;
as root, and as a user without root (in a user namespace of their own); and the namespace is gone
once the holder stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.network.conftest import namespace_references, nobody_folder

REPO = Path(__file__).resolve().parents[2]

#: Listens on every interface (as TensorFlow's gRPC server), prints its port, answers one
#: connection with "hello" and then waits for its standard input to close.
LISTENER = """
import socket, sys
server = socket.socket()
server.bind(("0.0.0.0", 0))
server.listen(4)
print(server.getsockname()[1], flush=True)
peer, _ = server.accept()
peer.sendall(b"hello")
peer.close()
sys.stdin.read()
"""

#: The check, run as the user it is for: the holder, a listener inside, a host-side probe, a
#: forked child that enters and connects; one JSON line.
CHECK = """
import json, os, socket, subprocess, sys, time
from pathlib import Path
from mlbench.network.emulation import PrivateLoopback, private_loopback_problem
problem = private_loopback_problem()
if problem:
    print(json.dumps({"skip": problem})); sys.exit(0)
loopback = PrivateLoopback(Path(sys.argv[1]) / "network.log")
loopback.start()
listener = subprocess.Popen(loopback.worker_command(0, [sys.executable, "-c", sys.argv[2]]),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
port = int(listener.stdout.readline())
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    outside = "connected"
except ConnectionRefusedError:
    outside = "refused"
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.close(read)
    loopback.enter(1)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        os.write(write, sock.recv(5))
    os._exit(0)
os.close(write)
os.waitpid(child, 0)
inside = os.read(read, 5).decode()
namespace = os.readlink(f"/proc/{loopback.pid}/ns/net")
user_ns = os.readlink(f"/proc/{loopback.pid}/ns/user") != os.readlink("/proc/self/ns/user")
listener.stdin.close()
listener.wait(timeout=10)
stopping_at = time.clock_gettime(time.CLOCK_BOOTTIME)
loopback.stop()
print(json.dumps({"uid": os.getuid(), "outside": outside, "inside": inside, "namespace": namespace,
                  "user_ns": user_ns, "stopping_at": stopping_at}))
"""


def _check(command: list[str], folder: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run([*command, "-c", CHECK, str(folder), LISTENER], capture_output=True, text=True,
                          timeout=120, cwd=folder, env=env)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in answer:
        pytest.skip(f"no private network namespace here: {answer['skip']}")
    return answer


def test_a_socket_on_every_interface_of_the_private_loopback_is_reachable_inside_only(tmp_path):
    answer = _check([sys.executable], tmp_path, {**os.environ, "PYTHONPATH": str(REPO)})
    assert answer["outside"] == "refused"
    assert answer["inside"] == "hello"
    assert answer["namespace"] != os.readlink("/proc/self/ns/net")
    assert answer["namespace"] not in namespace_references(answer["stopping_at"])


def test_a_user_without_root_gets_the_same_private_loopback_in_a_user_namespace():
    with nobody_folder() as (python, folder):
        answer = _check(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python], folder,
                        {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)})
    assert answer["uid"] == 65534 and answer["user_ns"]
    assert answer["outside"] == "refused"
    assert answer["inside"] == "hello"
    assert answer["namespace"] not in namespace_references(answer["stopping_at"])


def test_where_no_private_namespace_can_be_made_a_tensorflow_run_is_refused_before_it_is_recorded(tmp_path):
    """The check runs before the run exists (here: no ``unshare`` on the PATH); its one line says
    why and what to do, and nothing is recorded."""
    from tests.helpers import mlbench, run_ids

    proc = mlbench("run", "task2a", "2", "--framework", "tensorflow", "--data", "synthetic",
                   env={**os.environ, "PATH": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "network namespace of their own, which this machine cannot make: it needs unshare" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert run_ids() == []
