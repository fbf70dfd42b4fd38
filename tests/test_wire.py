"""What a worker really sent (mlbench/worker/wire.py), measured in a process of its own: the
test's own process may hold other TCP sockets (an earlier module's server in the same xdist
worker) that send while it counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COUNTED = """
import os, socket, struct, sys, threading
sys.path.insert(0, sys.argv[1])
servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
peer_of, service = servers
os.environ["MLBENCH_RESULTS_URL"] = f"http://127.0.0.1:{service.getsockname()[1]}/"
from mlbench.worker.wire import TCPI_BYTES_SENT, WireCounter
clients = [socket.create_connection(s.getsockname()) for s in servers]
accepted = [s.accept()[0] for s in servers]
received = [bytearray(), bytearray()]
def drain(i, n):
    while len(received[i]) < n:
        chunk = accepted[i].recv(n - len(received[i]))
        if not chunk:
            break
        received[i].extend(chunk)
readers = [threading.Thread(target=drain, args=(0, 150_000), daemon=True),
           threading.Thread(target=drain, args=(1, 50_000), daemon=True)]
for r in readers:
    r.start()
import time
def arrived(i, n):
    # a byte counts once TCP has sent it: wait for the receiver, as a collective does
    deadline = time.monotonic() + 30
    while len(received[i]) < n and time.monotonic() < deadline:
        time.sleep(0.001)
counter = WireCounter()
clients[0].sendall(b"x" * 100_000)      # to a peer: counted
clients[1].sendall(b"s" * 50_000)       # to the results service: left out
arrived(0, 100_000); arrived(1, 50_000)
counter.pause()
clients[0].sendall(b"e" * 30_000)       # while paused (an evaluation): left out
arrived(0, 130_000)
counter.resume()
clients[0].sendall(b"x" * 20_000)       # counted
for r in readers:
    r.join(timeout=30)
taken, again = counter.take(), counter.take()
retrans = struct.unpack_from("Q", clients[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256),
                             TCPI_BYTES_SENT + 8)[0]
print(len(received[0]), len(received[1]), taken, again, retrans, counter.available)
"""


def test_the_counter_sees_the_peers_bytes_not_the_results_services_nor_a_pauses():
    proc = subprocess.run([sys.executable, "-c", COUNTED, str(REPO)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, service, taken, again, retrans, available = proc.stdout.split()
    assert (first, service, again, available) == ("150000", "50000", "0", "True"), proc.stdout
    # TCP's resent bytes count (they went over the wire), in or out of the pause
    assert 120_000 - int(retrans) <= int(taken) <= 120_000 + int(retrans), proc.stdout
