"""What a run records of the machine's load and of the threads its workers really used, so that
its figures can be compared fairly: the load average as the run starts (rank 0's ``environment``
event, run.json's ``environment``) and as it ends (the ``result``), the threads in the
``environment`` event, and when a recorded load says the machine was busy."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

import mlbench
from mlbench.results.environment import describe_environment, load_average, machine_was_busy
from mlbench.results.events import EventWriter, read_run_events
from mlbench.results.outcome import AllreduceResult, TrainingResult, read_result
from mlbench.results.summary import summarize
from mlbench.worker.port_trainer import run_trainer
from tests.helpers import ListSink, run_json

linux = pytest.mark.skipif(not hasattr(os, "getloadavg"), reason="no load average on this platform")


def three_loads(value) -> bool:
    return isinstance(value, list) and len(value) == 3 and all(isinstance(v, float) and v >= 0 for v in value)


@linux
def test_the_load_average_is_the_systems_over_1_5_and_15_minutes_to_2_decimals():
    for _ in range(3):   # the kernel updates its averages every few seconds: between two readings
        before = [round(v, 2) for v in os.getloadavg()]
        loads = load_average()
        if loads == before == [round(v, 2) for v in os.getloadavg()]:
            break
    assert three_loads(loads) and loads == before


def test_without_a_load_average_there_is_none(monkeypatch):
    monkeypatch.delattr(os, "getloadavg", raising=False)   # Windows
    assert load_average() is None

    def unobtainable():
        raise OSError("load average unobtainable")

    monkeypatch.setattr(os, "getloadavg", unobtainable, raising=False)
    assert load_average() is None


@linux
def test_the_environment_records_the_load_average():
    assert three_loads(describe_environment()["load_average"])


def test_a_real_run_records_its_workers_threads_and_the_load_as_it_starts_and_ends():
    run = mlbench.run("task2a", 1, data="synthetic", max_steps=5, log_every=5)
    assert run.state == "finished", run.reason
    threads = run_json(run)["config"]["threads_per_worker"]
    events = read_run_events(run.run_dir)
    environment = next(e["value"] for e in events if e["name"] == "environment")
    assert environment["threads_per_worker"] == threads == 1
    assert isinstance(environment["interop_threads"], int) and environment["interop_threads"] >= 1
    assert summarize(events).environment == environment   # as status and compare read it back
    result = next(e["value"] for e in events if e["name"] == "result")
    if hasattr(os, "getloadavg"):
        assert three_loads(result["load_average_end"]) and three_loads(run_json(run)["environment"]["load_average"])
        assert three_loads(environment["load_average"])
    # the catalog's copy of the result, read through the result model
    assert read_result(run.result).load_average_end == result["load_average_end"]


def free_port() -> int:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        return listening.getsockname()[1]


def test_a_worker_that_no_mlbench_launcher_started_records_the_runs_threads_not_torchs_default():
    """Started as torchrun would start it, without OMP_NUM_THREADS: left to itself, torch would
    compute on every usable core (a 1-worker run with all the cores against 2-worker runs of one
    thread each is no scaling result); the worker takes the run's threads and records them."""
    run = mlbench.run("task2a", 1, data="synthetic", max_steps=5, log_every=5, launch={"record_only": True})
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    worker = subprocess.run([sys.executable, "-m", "mlbench.worker", str(run.run_dir)], env=env,
                            capture_output=True, text=True, timeout=240)
    assert worker.returncode == 0, worker.stderr
    environment = next(e["value"] for e in read_run_events(run.run_dir) if e["name"] == "environment")
    assert environment["threads_per_worker"] == run_json(run)["config"]["threads_per_worker"] == 1


class FrameworklessTrainer:
    """What run_trainer asks of a port's trainer, without a framework."""

    def __init__(self) -> None:
        self.rank, self.heartbeat = 0, None
        self.events = EventWriter(ListSink(), 0)

    def train(self) -> TrainingResult:
        return TrainingResult(steps=1, epochs=0.5, stop_reason="max-steps")

    def leave(self) -> None:
        pass


def test_a_port_records_the_threads_it_can_tell_and_the_load_at_its_end():
    trainer = FrameworklessTrainer()
    assert run_trainer(trainer, {"framework": "tensorflow", "threads_per_worker": 2}) == 0
    by_name = {e["name"]: e["value"] for e in trainer.events.sink.events}
    assert by_name["environment"]["threads_per_worker"] == 2 and by_name["environment"]["interop_threads"] is None
    end = by_name["result"]["load_average_end"]
    assert three_loads(end) if hasattr(os, "getloadavg") else end is None


def test_the_result_model_reads_the_load_at_the_end_and_none_for_an_older_run():
    loads = [1.5, 0.75, 0.25]
    training = read_result({"goal": 0.8, "final_accuracy": 0.9, "load_average_end": loads})
    sweep = read_result({"kind": "allreduce", "rows": [], "workers": 2, "load_average_end": loads})
    assert isinstance(training, TrainingResult) and training.load_average_end == loads
    assert isinstance(sweep, AllreduceResult) and sweep.load_average_end == loads
    assert read_result({"goal": 0.8, "final_accuracy": 0.9}).load_average_end is None


@pytest.mark.parametrize("load,cores,own,busy", [
    ([0.2, 0.1, 0.1], 8, 0, False),       # an idle machine
    ([6.0, 5.0, 4.0], 8, 0, True),        # others keep 6 of 8 cores busy
    ([6.0, 5.0, 4.0], 8, 4, False),       # ... but 4 of them are the run's own workers
    ([4.0, 9.0, 9.0], 8, 0, False),       # half the cores exactly is not more than half
    ([4.01, 0.0, 0.0], 8, 0, True),       # only the last minute counts
    ([3.0, 3.0, 3.0], 2, 1, True),        # 2 of 2 cores taken by others
    ([1.0, 1.0, 1.0], 2, 2, False),       # the run's own processes, counted in part, never make it busy
    (None, 8, 0, False),                  # no load average recorded (older run, other platform)
    ([9.0, 9.0, 9.0], None, 0, False),    # no cores recorded
    ([9.0, 9.0, 9.0], 0, 0, False),
])
def test_a_machine_was_busy_when_others_load_exceeds_half_of_its_cores(load, cores, own, busy):
    assert machine_was_busy(load, cores, own) is busy
