"""`mlbench check-optimizer`: the built-ins pass, deliberately wrong plug-ins fail naming the check.

Real processes with real torch.distributed (gloo on 127.0.0.1), as the command always runs; each
invocation checks several optimizers, so that the processes' start is paid once per test.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mlbench.optim.descriptors import INFO
from tests.conftest import REPO
from tests.helpers import command_lines, mlbench

WRONG = Path(__file__).with_name("wrong_plugins.py")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "my_sgd.py"
BUILTINS = ("centralized-sgd", "centralized-adam", "model-averaging", "powersgd", "signsgd", "sparsified-sgd",
            "decentralized-sgd", "ddp")
EXACT = {"centralized-sgd", "centralized-adam", "ddp", "my-sgd"}


def report(stdout: str) -> dict[str, dict[str, tuple[str, str]]]:
    """{optimizer: {check: (status, detail)}} from the command's lines."""
    checks: dict[str, dict[str, tuple[str, str]]] = {}
    current = None
    for line in stdout.splitlines():
        row = re.match(r"^  (PASS|FAIL|SKIP) +(\S+) +(.*)$", line)
        if row:
            assert current is not None, stdout
            checks[current][row[2]] = (row[1], row[3])
        else:
            current = line.split(" ", 1)[0].rstrip(":")
            checks[current] = {}
    return checks


def test_every_builtin_and_the_documented_example_pass_the_checks_they_claim():
    proc = mlbench("check-optimizer", *BUILTINS, f"{EXAMPLE}:MySGD", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = report(proc.stdout)
    example = next(name for name in checks if name.startswith("my-sgd@"))
    checks["my-sgd"] = checks.pop(example)
    assert list(checks) == [*BUILTINS, "my-sgd"]
    for name, results in checks.items():
        same = "consensus" if name == "decentralized-sgd" else "same-model"
        assert list(results) == ["exact", "bytes", same, "determinism", "finite"], (name, results)
        assert results["exact"][0] == ("PASS" if name in EXACT else "SKIP"), (name, results)
        assert all(status == "PASS" for check, (status, _) in results.items() if check != "exact"), (name, results)
    assert re.search(r"2 workers x batch 8 against 1 process x batch 16 after 5 steps", checks["ddp"]["exact"][1])
    # the all-reduce of 71,178 fp32 numbers, 5 times, as each of 2 ranks reports it: 2 x 5 x 284,712 B
    assert checks["centralized-sgd"]["bytes"][1].startswith("reported 2,847,120 B, sent on the wire ")


def test_wrong_plugins_fail_naming_the_check_they_break(tmp_path):
    names = ("NoDivide", "Flatterer", "Drifter", "Noisy", "Exploding", "Unaveraged", "Raiser", "Skipper")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = mlbench("check-optimizer", *(f"{WRONG}:{name}" for name in names), "--timeout", "3",
                   timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr == ""
    checks = report(proc.stdout)
    failed = {name.split("@")[0]: sorted(c for c, (status, _) in results.items() if status == "FAIL")
              for name, results in checks.items()}
    assert failed == {"no-divide": ["exact"], "flatterer": ["bytes"], "drifter": ["same-model"],
                      "noisy": ["determinism", "same-model"], "exploding": ["finite"],
                      "unaveraged": ["consensus"], "raiser": ["run"], "skipper": ["run"]}
    by_name = {name.split("@")[0]: results for name, results in checks.items()}
    assert re.match(r"reported 18,\d{3} B, sent on the wire 2,8\d\d,\d{3} B", by_name["flatterer"]["bytes"][1])
    assert all(status == "PASS" for check, (status, _) in by_name["no-divide"].items() if check != "exact")
    assert "every rank evaluates" not in by_name["unaveraged"]["consensus"][1]
    assert re.match(r"rank \d: optimizer plug-in raiser@[0-9a-f]{12} raised in step 2: ValueError: boom$",
                    by_name["raiser"]["run"][1])
    assert "Timed out" in by_name["skipper"]["run"][1] and "skips a collective" in by_name["skipper"]["run"][1]
    # nothing left behind: no process of the check, no temporary folder
    assert not list(tmp_path.glob("mlbench-check-*"))
    assert [pid for pid, argv in command_lines() if str(WRONG).encode() in b"\0".join(argv)] == []


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/opt.py:X"], "optimizer plug-in /nonexistent/opt.py:X: no such file /nonexistent/opt.py"),
    ([f"{WRONG}:NoDivide", "powersgd", "--opt", "rank=2"], "--opt applies to one optimizer: give one SPEC with --opt"),
    (["powersgd", "--opt", "rank=0"], "option rank=0: expected a value in [1, inf]"),
])
def test_a_bad_spec_is_one_line_and_exit_2(args, message):
    proc = mlbench("check-optimizer", *args)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"Error: {message}\n")


def test_the_descriptors_say_which_builtins_are_exact_and_whose_ranks_differ():
    assert INFO["centralized-sgd"].claims_exact({"by": "layer"})
    assert INFO["ddp"].claims_exact({"hook": "allreduce"}) and not INFO["ddp"].claims_exact({"hook": "fp16"})
    assert not INFO["powersgd"].claims_exact({})
    assert not INFO["model-averaging"].claims_ranks_differ({"period": 1})
    assert INFO["model-averaging"].claims_ranks_differ({"period": 2})
    assert INFO["decentralized-sgd"].claims_ranks_differ({"topology": "ring"})


WIRE_BYTES = """
import socket, struct, sys, threading
sys.path.insert(0, sys.argv[1])
from mlbench.optim.check import _TCPI_BYTES_SENT, wire_bytes_sent
from tests.optim.test_check import _read
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
received = bytearray()
reader = threading.Thread(target=lambda: received.extend(_read(peer, 300_000)), daemon=True)
reader.start()
before = wire_bytes_sent()
client.sendall(b"x" * 300_000)
reader.join(timeout=30)
after = wire_bytes_sent()
# what TCP sent again (tcpi_bytes_retrans, right after tcpi_bytes_sent): on a loaded box a tail
# loss probe may resend the last segment before the starved receiver's ACK is processed
retrans = struct.unpack_from("Q", client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256), _TCPI_BYTES_SENT + 8)[0]
print(len(received), before is not None and after is not None and after - before - retrans)
"""


def test_wire_bytes_are_the_payload_this_process_sent_over_tcp():
    """The count is the payload, plus what TCP resent (counted: it went over the wire too)."""
    # in a process of its own: the test's process may hold other TCP sockets (a fixture's server
    # of an earlier module, in the same pytest-xdist worker) that send while it measures
    proc = subprocess.run([sys.executable, "-c", WIRE_BYTES, str(REPO)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["300000", "300000"], proc.stdout


def _read(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = sock.recv(n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
