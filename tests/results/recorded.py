"""Recorded runs with known numbers: a catalog row, run.json and per-rank event files, no workers.

The files have exactly the shape the workers write (mlbench.results.events), so compare, charts
and the MLPerf log read them as they read real runs, and every figure they print can be checked
against a hand-computed answer.
"""

from __future__ import annotations

from typing import Any

from mlbench.launch.faults import parse_inject, parse_on_failure
from mlbench.results.events import FileSink
from mlbench.results.store import FINISHED, RunRecord, RunStore
from mlbench.tasks.records import spec_to_dict
from mlbench.tasks.registry import TASKS

T0 = 1_700_000_000.0
ENVIRONMENT = {"host": "lab", "cpu": "Test CPU", "cores": 8, "gpus": [], "torch": "2.x"}
#: seconds per phase of every rank; communication is given per run
COMPUTE = {"data": 1.0, "forward": 2.0, "backward": 3.0, "optimizer": 1.0}


def record_run(store: RunStore, *, workers: int, task: str = "task1a", tta: float | None = None,
               wall: float | None = None, goal: float | None = 0.8, seed: int = 0,
               communication: tuple[float, ...] | None = None, samples_per_rank: int = 1000,
               train_time: float = 10.0, division: str = "closed", optimizer: str = "centralized-sgd",
               launcher: str = "local", state: str = FINISHED, environment: dict | None = None,
               device: str = "cpu", group_id: str | None = None,
               result_extra: dict[str, Any] | None = None, network: dict[str, Any] | None = None,
               final: float | None = None, nodes: int | None = None,
               on_this_machine: bool | None = None, framework: str | None = None,
               inject: tuple[str, ...] = (), on_failure: str = "fail",
               restarts: tuple[dict[str, Any], ...] = (), config: dict[str, Any] | None = None,
               document: dict[str, Any] | None = None, evaluated: bool = True) -> RunRecord:
    """A run whose events and result say exactly what the arguments say; ``final`` is the goal
    metric's last value (the task's: accuracy, perplexity, BLEU; default 0.9 or 0.5 accuracy);
    ``nodes`` and ``on_this_machine`` as its launcher records them (None: a run.json from before
    it did); ``inject`` and ``on_failure`` as `run --inject/--on-failure` take them, ``restarts``
    the entries of run.json's ``faults.restarts`` (each a kill of rank 1 it answered); ``config``
    and ``document`` add to run.json's config and to run.json itself. ``evaluated=False``: the run
    ended before its first evaluation (no time/eval or eval/* events); only a finished one (its
    step cap reached) records a result."""
    spec = TASKS[task]
    metric = spec.metric
    run_json = {"task": task, "division": division, "changed": [],
                "config": {"task": spec_to_dict(spec), "workers": workers, "device": device,
                           "seed": seed, "data": "real" if goal is not None else "synthetic"},
                "environment": environment or ENVIRONMENT}
    if inject or on_failure != "fail":
        policy, max_restarts = parse_on_failure(on_failure)
        run_json["config"].update(faults=[parse_inject(text) for text in inject], on_failure=policy,
                                  max_restarts=max_restarts)
        # the workers start at T0 - 5 (started_at below); kill i at 30 (i + 1) s, its verdict 0.5 s later
        kills = [{"kind": "kill", "rank": 1, "at": 30.0 * (i + 1), "time": T0 - 5.0 + 30.0 * (i + 1),
                  "schedule": 0, "action": "restart", "lost_steps": r.get("lost_steps", 0)}
                 for i, r in enumerate(restarts)]
        run_json["faults"] = {"events": kills, "restarts": [{"fault": i, "at": kill["time"] + 0.5, **r}
                                                            for i, (r, kill) in enumerate(zip(restarts, kills))]}
    run_json["config"].update(config or {})
    run_json.update(document or {})
    if framework is not None:  # None: a run.json from before there was a choice (PyTorch's)
        run_json["config"]["framework"] = framework
    if network is not None:  # the emulated network, as NetworkSettings.to_dict() records it
        run_json["network"] = network
    if nodes is not None:
        run_json["nodes"] = nodes
    if on_this_machine is not None:
        run_json["on_this_machine"] = on_this_machine
    record = store.create(task=task, workers=workers, division=division, run_json=run_json,
                          optimizer=optimizer, launcher=launcher, seed=seed, group_id=group_id)
    comm = communication or tuple(0.5 for _ in range(workers))
    steps_per_epoch = 50
    for rank in range(workers):
        sink = FileSink(record.run_dir, rank)

        def emit(when: float, name: str, value: Any, step: int, sink=sink, rank=rank) -> None:
            sink.write({"time": T0 + when, "rank": rank, "epoch": step / steps_per_epoch,
                        "step": step, "name": name, "value": value})

        if rank == 0:
            emit(0.0, "environment", environment or ENVIRONMENT, 0)
        # two logging intervals of 25 steps, then the evaluation at the end of epoch 1
        for i, step in enumerate((25, 50)):
            t = train_time * (i + 1) / 2
            emit(t, "train/loss", 2.0 - i, step)
            emit(t, "train/steps", 25, step)
            emit(t, "train/samples", samples_per_rank // 2, step)
            emit(t, "train/time", t, step)
            if framework in (None, "pytorch"):   # a port's compiled step times no phases
                for phase, seconds in COMPUTE.items():
                    emit(t, f"time/{phase}", seconds / 2, step)
                emit(t, "time/communication", comm[rank] / 2, step)
        if not evaluated:
            if rank == 0 and state == FINISHED:
                result = {"goal": goal, "light": False, "reached": False, "metric": metric,
                          "time_to_accuracy": None, "wall_time_to_accuracy": None, "epochs_to_accuracy": None,
                          "steps_to_accuracy": None, "final_accuracy": None, "final_loss": None,
                          "best_accuracy": None, "train_time": train_time, "eval_time": 0.0, "epochs": 1.0,
                          "steps": 50, "stop_reason": "max-steps", "bytes_sent": 0, **(result_extra or {})}
                emit(train_time + 0.5, "result", result, 50)
            sink.close()
            continue
        emit(train_time + 1.0, "time/eval", 1.0, 50)
        if rank == 0:
            accuracy = final if final is not None else 0.9 if tta is not None else 0.5
            emit(train_time + 1.0, "eval/loss", 0.3, 50)
            emit(train_time + 1.0, f"eval/{metric}", accuracy, 50)
            emit(train_time + 1.0, "train/time", train_time, 50)
            result = {"goal": goal, "light": False, "reached": tta is not None, "metric": metric,
                      "time_to_accuracy": tta, "wall_time_to_accuracy": wall,
                      "epochs_to_accuracy": 1.0 if tta is not None else None,
                      "steps_to_accuracy": 50 if tta is not None else None,
                      "final_accuracy": accuracy, "final_loss": 0.3, "best_accuracy": accuracy,
                      "train_time": train_time, "eval_time": 1.0, "epochs": 1.0, "steps": 50,
                      "stop_reason": "goal" if tta is not None else "max-epochs", "bytes_sent": 0,
                      **(result_extra or {})}
            emit(train_time + 1.5, "result", result, 50)
        sink.close()
    ended = {"state": state, "started_at": T0 - 5.0,
             "finished_at": T0 + train_time + (1.5 if evaluated else 0.5)}
    if state == FINISHED:
        ended["result"] = result
    else:
        ended["reason"] = "worker 1 exited with code 1"
    store.update(record.id, **ended)
    return store.get(record.id)
