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

from mlbench.optim.descriptors import INFO, OptimizerInfo
from tests.conftest import REPO
from tests.helpers import command_lines, mlbench

WRONG = Path(__file__).with_name("wrong_plugins.py")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "my_sgd.py"
BUILTINS = ("centralized-sgd", "centralized-adam", "centralized-adamw", "model-averaging", "powersgd", "signsgd",
            "sparsified-sgd", "decentralized-sgd", "diloco", "streaming-diloco", "sparseloco", "ddp", "fsdp")
EXACT = {"centralized-sgd", "centralized-adam", "centralized-adamw", "ddp", "fsdp", "my-sgd"}
#: Whose ranks differ with their default options (a consensus line instead of same-model).
DIFFER = {"decentralized-sgd", "diloco", "streaming-diloco", "sparseloco"}
CHECKS = ["exact", "bytes", "same-model", "restore", "communication", "progress", "memory", "random-stream",
          "determinism", "finite"]


def report(stdout: str) -> tuple[dict[tuple[str, int], dict[str, tuple[str, str]]], str]:
    """{(optimizer, workers): {check: (status, detail)}} from the command's lines, and its last line."""
    checks: dict[tuple[str, int], dict[str, tuple[str, str]]] = {}
    current = None
    lines = stdout.splitlines()
    for line in lines[:-1]:
        row = re.match(r"^  (PASS|FAIL|SKIP) +(\S+) +(.*)$", line)
        if row:
            assert current is not None, stdout
            checks[current][row[2]] = (row[1], row[3])
        else:
            header = re.match(r"^(\S+?)(?: \(plug-in .*\))?: (\d+) workers x batch ", line)
            assert header, line
            current = header[1].split("@")[0], int(header[2])
            checks[current] = {}
    return checks, lines[-1]


def failed_checks(checks: dict[tuple[str, int], dict[str, tuple[str, str]]]) -> dict[str, dict[int, list[str]]]:
    """{optimizer: {workers: [the checks that failed]}}, leaving out worker counts where none failed."""
    out: dict[str, dict[int, list[str]]] = {}
    for (name, workers), results in checks.items():
        failed = sorted(check for check, (status, _) in results.items() if status == "FAIL")
        if failed:
            out.setdefault(name, {})[workers] = failed
    return out


def test_every_builtin_and_the_documented_example_pass_the_checks_they_claim():
    proc = mlbench("check-optimizer", *BUILTINS, f"{EXAMPLE}:MySGD", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks, last = report(proc.stdout)
    assert last == "No check failed.", proc.stdout
    assert list(checks) == [(name, k) for name in (*BUILTINS, "my-sgd") for k in (2, 4)]
    for (name, k), results in checks.items():
        same = "consensus" if name in DIFFER else "same-model"
        assert list(results) == [same if c == "same-model" else c for c in CHECKS], (name, k, results)
        assert results["exact"][0] == ("PASS" if name in EXACT else "SKIP"), (name, k, results)
        assert all(status == "PASS" for check, (status, _) in results.items() if check != "exact"), (name, results)
    assert re.search(r"2 workers x batch 8 against 1 process x batch 16 after 20 steps", checks["ddp", 2]["exact"][1])
    assert re.search(r"4 workers x batch 8 against 1 process x batch 32 after 20 steps", checks["ddp", 4]["exact"][1])
    # the all-reduce of 71,178 fp32 numbers, 20 times, as each rank reports it: 2 (k-1)/k x 284,712 B
    assert checks["centralized-sgd", 2]["bytes"][1].startswith("reported 11,388,480 B, sent on the wire ")
    assert checks["centralized-sgd", 4]["bytes"][1].startswith("reported 34,165,440 B, sent on the wire ")
    # DiLoCo's H=10: two rounds, each with its all-reduce on the wire
    assert "20 steps (2 periods of H=10)" in proc.stdout
    assert checks["diloco", 2]["communication"][1].startswith("the 2 ranks sent bytes on the wire in each of its "
                                                              "2 periods of 10 steps")
    for (name, k), results in checks.items():   # the memory line says the growth it measured
        growth = float(re.match(r"allocated memory grew by up to ([-+][\d.]+) KiB per step", results["memory"][1])[1])
        assert growth < 70, (name, k, results["memory"])


def test_wrong_plugins_fail_naming_the_check_they_break(tmp_path):
    names = ("NoDivide", "Flatterer", "Drifter", "Noisy", "Exploding", "Unaveraged", "Raiser", "Skipper",
             "IdleRounds", "Miscounted", "AliasedEMA", "GroupAccountant", "Delayed", "Hierarchical", "LateCompressor",
             "GradientNoise", "UnseededNoise")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = mlbench("check-optimizer", *(f"{WRONG}:{name}" for name in names), "--timeout", "3",
                   timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr == ""
    checks, last = report(proc.stdout)

    def at(*failed: str, workers: tuple[int, ...] = (2, 4)) -> dict[int, list[str]]:
        return {k: sorted(failed) for k in workers}

    assert failed_checks(checks) == {
        "no-divide": at("exact"), "flatterer": at("bytes"), "drifter": at("same-model"),
        "noisy": at("determinism", "same-model"), "exploding": at("finite", "progress"),
        "unaveraged": at("communication", "consensus"), "raiser": at("run"), "skipper": at("run"),
        # what 2 workers and 5 steps did not see
        "idle-rounds": at("communication", "progress"),      # its global model never moves
        "miscounted": at("bytes"),                            # H=10: its first round is step 10
        "aliased-ema": at("restore"),                         # declares nothing, evaluation changes it
        "group-accountant": at("bytes"),                      # rank 0 counts the group's bytes
        "delayed": at("memory"),                              # keeps every averaged gradient
        "hierarchical": at("exact", workers=(4,)),            # right with one pair of ranks only
        "late-compressor": at("same-model"),                  # wrong from step 8
        "gradient-noise": at("random-stream"), "unseeded-noise": at("random-stream"),
    }
    assert last.startswith("Failed checks: no-divide@") and "hierarchical@" in last, last
    assert re.search(r"hierarchical@[0-9a-f]{12} exact \(4 workers\)", last), last
    assert re.search(r"flatterer@[0-9a-f]{12} bytes \(2, 4 workers\)", last), last
    by_name = {name: results for (name, k), results in checks.items() if k == 2}
    assert re.match(r"reported 18,\d{3} B, sent on the wire 11,4\d\d,\d{3} B", by_name["flatterer"]["bytes"][1])
    # per rank: the sum is right, rank 1's own count is not
    accountant = by_name["group-accountant"]["bytes"][1]
    assert re.match(r"reported 11,388,480 B, sent on the wire 11,4\d\d,\d{3} B by all 2 ranks.*the farthest rank 1: "
                    r"reported 0 B, sent 5,7\d\d,\d{3} B", accountant), accountant
    assert re.match(r"no rank sent a byte on the wire in steps 1-4", by_name["idle-rounds"]["communication"][1])
    assert re.match(r"the evaluated model's loss on the check's 320 samples: (\d\.\d+) initially, \1 after 20 steps",
                    by_name["idle-rounds"]["progress"][1])
    leak = float(re.match(r"allocated memory grew by up to \+([\d.]+) KiB per step",
                          by_name["delayed"]["memory"][1])[1])
    assert 250 < leak < 320, by_name["delayed"]["memory"]   # one model, 278 KiB, per step
    seeded, drawn = by_name["gradient-noise"]["random-stream"][1], by_name["unseeded-noise"]["random-stream"][1]
    assert "seeded again (torch.initial_seed() is 1234, not the run's 0)" in seeded, seeded
    assert "draws from torch's default generator on 2 of 2 ranks" in drawn, drawn
    assert all(status == "PASS" for check, (status, _) in by_name["no-divide"].items() if check != "exact")
    assert "every rank evaluates" not in by_name["unaveraged"]["consensus"][1]
    assert re.match(r"rank \d: optimizer plug-in raiser@[0-9a-f]{12} raised in step 2: ValueError: boom$",
                    by_name["raiser"]["run"][1])
    assert re.match(r"rank 1 stopped joining the collectives in step 1 and went on .*while rank 0 timed out "
                    r"waiting in step 1 after 3 s", by_name["skipper"]["run"][1]), by_name["skipper"]["run"][1]
    assert "skips a collective" in by_name["skipper"]["run"][1]
    # nothing left behind: no process of the check, no temporary folder
    assert not list(tmp_path.glob("mlbench-check-*"))
    assert [pid for pid, argv in command_lines() if str(WRONG).encode() in b"\0".join(argv)] == []


def test_the_rank_that_stopped_joining_is_named_with_its_step(tmp_path):
    """Rank 1 leaves after step 20: trains on alone (departing), or waits for ever outside any
    collective (frozen). Its peers time out in step 21's all-reduce; the line names rank 1."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = mlbench("check-optimizer", f"{WRONG}:Departing", f"{WRONG}:Frozen", "--steps", "24", "--timeout", "3",
                   timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks, _last = report(proc.stdout)
    assert failed_checks(checks) == {"departing": {2: ["run"], 4: ["run"]}, "frozen": {2: ["run"], 4: ["run"]}}
    peers = {2: "rank 0", 4: "ranks 0, 2 and 3"}
    for k in (2, 4):
        departed = checks["departing", k]["run"][1]
        assert departed.startswith(f"rank 1 stopped joining the collectives in step 21 and went on (rank 1 after "
                                   f"step 24, the last), while {peers[k]} timed out waiting in step 21 after 3 s"
                                   "; in step 21 rank 1 issued 0 collectives, while rank 0 waits in its collective "
                                   "1 of that step"), departed
        frozen = checks["frozen", k]["run"][1]
        assert frozen.startswith(f"rank 1 stopped in step 21 (the last step it finished: 20): it joined no "
                                 f"collective since, neither finishing nor timing out, while {peers[k]} in step 21 "
                                 "timed out waiting after 3 s"), frozen
    assert not list(tmp_path.glob("mlbench-check-*"))
    assert [pid for pid, argv in command_lines() if str(WRONG).encode() in b"\0".join(argv)] == []


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/opt.py:X"], "optimizer plug-in /nonexistent/opt.py:X: no such file /nonexistent/opt.py"),
    ([f"{WRONG}:NoDivide", "powersgd", "--opt", "rank=2"], "--opt applies to one optimizer: give one SPEC with --opt"),
    (["powersgd", "--opt", "rank=0"], "option rank=0: expected a value in [1, inf]"),
    (["powersgd", "--workers", "1"], "--workers 1: each count must be in [2, 16]"),
    (["powersgd", "--workers", "2,four"], "--workers 2,four: expected worker counts such as 4 or 2,4"),
    (["decentralized-sgd", "--workers", "4", "--opt", "topology=0-1"],
     "topology 0-1 does not connect all 4 workers, so they could never agree on a model; add edges"),
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


def test_the_descriptors_declare_the_builtins_periods():
    """The steps between two communications: an option's value (DiLoCo's H, model averaging's
    period) or every step; a plug-in that says nothing declares none."""
    for name in ("diloco", "streaming-diloco", "sparseloco"):
        assert INFO[name].communication_period(INFO[name].parse_options({"H": "6"}, 2)) == 6
    assert INFO["model-averaging"].communication_period({"period": 3, "by": "model"}) == 3
    for name in ("centralized-sgd", "centralized-adam", "powersgd", "signsgd", "sparsified-sgd", "decentralized-sgd",
                 "ddp"):
        assert INFO[name].communication_period(INFO[name].parse_options({}, 2)) == 1
    assert OptimizerInfo("mine", "-", "-").communication_period({}) is None


WIRE_BYTES = """
import socket, struct, sys, threading
sys.path.insert(0, sys.argv[1])
from mlbench.worker.wire import TCPI_BYTES_SENT, wire_bytes_sent
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
retrans = struct.unpack_from("Q", client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256), TCPI_BYTES_SENT + 8)[0]
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
