"""A run as an MLPerf-style result log: ``:::MLLOG {json}`` lines (`mlbench download --format mlperf`).

MLPerf Training reports every run as such a log (keys and event types from the mlperf-logging
package's ``mllog.constants``): submission fields, ``init_start``/``init_stop``, ``run_start``,
one ``epoch_start``/``epoch_stop`` and ``eval_start``/``eval_accuracy``/``eval_stop`` per
evaluation, hyper-parameters (``global_batch_size``, ``seed``, ``opt_*``) and ``run_stop`` with a
``status`` of ``success`` (goal reached) or ``aborted``. Writing the same format lets MLPerf's own
parser and tooling read mlbench results. The log is rebuilt from the run's metric events after the
fact, so it needs nothing from the workers beyond what every run records:

* ``run_start`` is the wall-clock moment training began: rank 0's first training-time reading
  minus the training and evaluation seconds before it;
* an evaluation ends at rank 0's ``time/eval`` event and starts that many seconds earlier; the
  epoch before it runs from the previous evaluation's end (or ``run_start``) to its start;
* the framework that trained (`mlbench run --framework`) is in ``submission_platform`` with its
  version, where MLPerf's system description names a submission's framework (``..., local,
  JAX 0.4.30``), and ``mlbench_framework`` holds its name (run.json's) and that release;
* a run on an emulated network (`mlbench run --bandwidth ...`) adds ``mlbench_network``: its
  label as the value, run.json's settings and mechanism as the metadata;
* a run that restarted, shrank or was resumed logs the epochs and evaluations of its final
  trajectory only (those of work a later start threw away are left out, and a step evaluated
  twice is logged once, as it was last), and each restart, shrink and resume as an
  ``mlbench_restart``, ``mlbench_shrink`` or ``mlbench_resume`` record at its moment (value: the
  step it went on from; metadata: why, the ranks, the steps redone, the time to recover, a
  shrink's new size and global batch); a shrunk run's ``number_of_workers`` names every size it
  trained at in its metadata (``sizes``), and ``samples_count`` counts each step at the global
  batch of its size;
* training after the last evaluation (a run that failed, was cancelled or was stopped by its
  step cap before evaluating again) is one more epoch, up to rank 0's last training-time
  reading;
* ``init_start`` is when the launcher started the run (process start, data loading and the
  process group count as initialisation, as in MLPerf), ``run_stop`` the time of the result, or
  of the run's end where it recorded none (a failed or cancelled run);
* ``run_stop``'s status is ``success`` where the run reached its goal, else ``aborted``, as
  MLPerf logs an aborted run: a run that failed or was cancelled, or ended before its first
  evaluation, has a valid log all the same (mlbench's rules require evaluations and
  ``eval_samples`` of a run that did not abort only); ``train_samples`` is the recorded training
  set's size, else one epoch's steps times the global batch;
* ``eval_accuracy`` holds the task's goal metric, whatever it is, and names it in its metadata
  when it is not accuracy; ``eval_samples`` is the evaluation set's size as the runtime counts it
  (images, validation tokens, test sentences);
* task 0a's sweep has no epochs: one ``mlbench_allreduce`` record per dtype and message size
  (its bandwidth, nccl-tests' figures in the metadata), then ``mlbench_peak_bandwidth`` and
  ``mlbench_latency``, in the units of :mod:`mlbench.tasks.metrics`.

MLPerf's checker passes these logs with the rules mlbench ships
(:mod:`mlbench.results.mlperf_rules`; `mlbench download RUN --format mlperf --check`). A run
that cannot have a valid log is refused in one line (:func:`run_mllog`): one that has not ended
(no ``run_stop`` yet) and one that recorded no training step (no ``run_start``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlbench.errors import UsageError
from mlbench.extras import needs
from mlbench.frameworks import DEFAULT_FRAMEWORK, framework_release
from mlbench.network.settings import network_label
from mlbench.results.compare import hardware_label
from mlbench.results.division import run_division
from mlbench.results.events import read_run_events
from mlbench.results.goodput import FAULTS_SECTION, run_worker_sizes, run_workers_label
from mlbench.results.outcome import AllreduceResult, TrainingResult, read_result
from mlbench.results.mlperf_rules import checker_command, explain
from mlbench.results.store import RunRecord
from mlbench.run_config import RunConfig, RunDocument, occupancy
from mlbench.safefile import write_text
from mlbench.tasks.metrics import LATENCY
from mlbench.tasks.spec import TaskSpec

TOKEN = ":::MLLOG"
ORG = "mlbench"


def mllog_lines(record: RunRecord, events: list[dict[str, Any]], document: RunDocument | None,
                org: str = ORG) -> list[str]:
    """The :::MLLOG lines of one run, in time order."""
    config = document.config if document else None
    spec = config.task if config is not None and isinstance(config.task, TaskSpec) else None
    rank0 = [e for e in events if e.get("rank", 0) == 0]
    outcome = read_result(record.result or next((e["value"] for e in rank0 if e["name"] == "result"), None))
    result = outcome if isinstance(outcome, TrainingResult) else TrainingResult()
    def per_step(workers: int) -> int:   # the global batch of a group of that size
        return spec.settings.global_batch_size(workers) if spec else 0

    batch = per_step(record.workers)
    environment = next((e["value"] for e in rank0 if e["name"] == "environment"),
                       document.environment if document else {})
    log = _Log()

    init_start = record.started_at or record.created_at
    log.add(init_start, "submission_benchmark", record.task)
    log.add(init_start, "submission_division", run_division(record, document).name)
    log.add(init_start, "submission_org", org)
    log.add(init_start, "submission_platform", _platform(record, config, environment))
    here = occupancy(record.run_dir, record.launcher, record.workers).on_this_machine
    log.add(init_start, "submission_status", "onprem" if here else "cloud")
    log.add(init_start, "cache_clear", False)
    log.add(init_start, "init_start", None, "INTERVAL_START")
    log.add(init_start, "mlbench_run_id", record.id)
    sizes = run_worker_sizes(record)
    log.add(init_start, "number_of_workers", record.workers, metadata={"sizes": sizes} if len(sizes) > 1 else None)
    log.add(init_start, "global_batch_size", batch)
    log.add(init_start, "gradient_accumulation_steps", spec.settings.accumulation(record.workers) if spec else 1)
    log.add(init_start, "seed", record.seed if record.seed is not None else (config.seed if config else None))
    log.add(init_start, "opt_name", record.optimizer)
    for kind in ("tensor", "pipeline", "context", "expert"):  # data parallelism only
        log.add(init_start, f"{kind}_parallelism", 1)
    log.add(init_start, "config_filename", "run.json")
    framework = config.framework if config is not None else DEFAULT_FRAMEWORK
    log.add(init_start, "mlbench_framework", framework,
            metadata={"release": framework_release(framework, environment)})
    network = document.extra.get("network") if document else None
    if network:  # the emulated network: its label, the settings and how
        log.add(init_start, "mlbench_network", network_label(network), metadata=dict(network))
    if spec is not None:
        log.add(init_start, "micro_batch_size", spec.settings.batch_per_worker)
        for key, value in spec.settings.mllog_hyperparameters(record.workers).items():
            log.add(init_start, key, value)
    steps_per_epoch = _steps_per_epoch(result, rank0)
    train_samples = result.train_samples or (steps_per_epoch and steps_per_epoch * batch)
    if train_samples:
        log.add(init_start, "train_samples", train_samples)
    if result.test_samples:
        log.add(init_start, "eval_samples", result.test_samples)

    stop = next((e["time"] for e in rank0 if e["name"] == "result"), record.finished_at)
    if isinstance(outcome, AllreduceResult):
        _sweep(log, rank0, outcome, init_start, stop)
        return log.lines()
    start = _run_start(rank0)
    restarts = _recoveries(log, document, per_step)
    if start is not None:
        log.add(start, "init_stop", None, "INTERVAL_END")
        log.add(start, "run_start", None, "INTERVAL_START")
        again = [(when, from_step) for when, from_step, _ in restarts]
        shrinks = [(from_step, workers) for _, from_step, workers in restarts if workers is not None]
        _epochs_and_evaluations(log, rank0, start, _samples_at(record.workers, per_step, shrinks),
                                spec.metric if spec else "accuracy", again)
    if stop is not None:
        status = "success" if result.reached else "aborted"
        epochs = result.epochs or max((float(e["epoch"]) for e in rank0 if e["name"] == "train/time"), default=0.0)
        log.add(stop, "run_stop", None, "INTERVAL_END", {"status": status, "epoch_num": _epoch_num(epochs)})
    return log.lines()


def _sweep(log: _Log, rank0: list[dict[str, Any]], sweep: AllreduceResult, init_start: float,
           stop: float | None) -> None:
    """Task 0a: the sweep between ``run_start`` (its first measurement's start) and
    ``run_stop``; ``success`` when no element came back wrong."""
    rows = [e for e in rank0 if e["name"] == "allreduce"]
    end = stop if stop is not None else (rows[-1]["time"] if rows else init_start)
    start = max(init_start, end - sweep.train_time)
    log.add(start, "init_stop", None, "INTERVAL_END")
    log.add(start, "run_start", None, "INTERVAL_START")
    metric = sweep.goal_metric
    for e in rows:
        row = e["value"]
        log.add(float(e["time"]), "mlbench_allreduce", sweep.bandwidth(row),
                metadata={**row, "metric": metric.name, "unit": metric.unit})
    log.add(end, "mlbench_peak_bandwidth", sweep.headline, metadata={"metric": metric.name, "unit": metric.unit})
    log.add(end, "mlbench_latency", sweep.latency_us, metadata={"metric": LATENCY.name, "unit": LATENCY.unit})
    log.add(end, "run_stop", None, "INTERVAL_END", {"status": "aborted" if sweep.wrong else "success"})


def run_mllog(record: RunRecord) -> list[str]:
    """The :::MLLOG lines of the recorded run ``record``; a usage error of one line for a run
    that cannot have a valid log: one that has not ended has no ``run_stop`` yet, and one that
    recorded no training step (it failed or was cancelled first) has no ``run_start``."""
    if record.active:
        raise UsageError(f"run {record.id} is still {record.state}: its MLPerf log ends with run_stop, "
                         "so download it when the run has ended")
    events = read_run_events(record.run_dir)
    rank0 = [e for e in events if e.get("rank", 0) == 0]
    sweep = isinstance(read_result(record.result), AllreduceResult)
    if not sweep and _run_start(rank0) is None:
        raise UsageError(f"run {record.id} {record.state} before it recorded a training step: an MLPerf log "
                         "starts the run at its first step (run_start), so this run has no valid log")
    return mllog_lines(record, events, RunDocument.load_or_none(record.run_dir))


def write_mllog(record: RunRecord, output: str | os.PathLike, lines: list[str] | None = None) -> Path:
    """Write the run's :::MLLOG log (``lines``, else :func:`run_mllog`'s) to ``output``: whole,
    and never through a link planted at its name or at its partial file's
    (:mod:`mlbench.safefile`)."""
    lines = run_mllog(record) if lines is None else lines
    return write_text(output, "".join(line + "\n" for line in lines))


def require_checker() -> None:
    """MissingExtra (exit 1, one line naming the `mlperf` extra) unless MLPerf's checker is
    installed."""
    with needs("mlperf"):
        import mlperf_logging  # noqa: F401


def check_mllog(path: str | os.PathLike) -> tuple[bool, str]:
    """Run MLPerf's checker by its own command line on the log at ``path`` with mlbench's rules:
    (passed, why not: one line per failed rule, :func:`mlbench.results.mlperf_rules.explain`).
    Its own log file goes to a temporary folder, not the working one."""
    require_checker()
    with tempfile.TemporaryDirectory(prefix="mlbench-mllog-") as folder:
        command = [*checker_command(Path(path).resolve(), sys.executable),
                   "--log_output", str(Path(folder) / "compliance_checker.log")]
        proc = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        return True, ""
    said = explain(proc.stderr, _benchmark(Path(path)))
    if not said:  # the checker itself failed (a traceback): its own words
        said = [line for line in (proc.stdout + proc.stderr).splitlines()
                if line.strip() and not line.startswith(TOKEN) and not line.startswith("** Logging output")]
    return False, "\n".join(said)


def _benchmark(path: Path) -> str | None:
    """The log's ``submission_benchmark``: which rules the checker applied."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(TOKEN) and '"submission_benchmark"' in line:
            try:
                value = json.loads(line[len(TOKEN):]).get("value")
            except ValueError:
                return None
            return value if isinstance(value, str) else None
    return None


class _Log:
    """Collects log records and renders them in time order (stable for equal times)."""

    def __init__(self) -> None:
        self._records: list[tuple[float, int, dict[str, Any]]] = []

    def add(self, when: float, key: str, value: Any, event_type: str = "POINT_IN_TIME",
            metadata: dict[str, Any] | None = None) -> None:
        body = {"namespace": "", "time_ms": round(when * 1000), "event_type": event_type,
                "key": key, "value": value, "metadata": metadata or {}}
        self._records.append((when, len(self._records), body))

    def lines(self) -> list[str]:
        return [f"{TOKEN} {json.dumps(body)}" for _, _, body in sorted(self._records, key=lambda r: r[:2])]


def _platform(record: RunRecord, config: RunConfig | None, environment: dict[str, Any]) -> str:
    nodes = occupancy(record.run_dir, record.launcher, record.workers).nodes
    hardware = hardware_label(config.device if config else None, environment)
    framework = framework_release(config.framework if config else DEFAULT_FRAMEWORK, environment)
    return f"{nodes}x {hardware}, {run_workers_label(record)} worker(s), {record.launcher}, {framework}"


def _steps_per_epoch(result: TrainingResult, rank0: list[dict[str, Any]]) -> int | None:
    """The result's steps per epoch; of a run without one (failed, cancelled), rank 0's last
    training-time reading's (its ``epoch`` is its step over the steps per epoch)."""
    steps, epochs = result.steps, result.epochs
    if not (steps and epochs):
        last = next((e for e in reversed(rank0) if e["name"] == "train/time" and float(e["epoch"]) > 0), None)
        steps, epochs = (int(last["step"]), float(last["epoch"])) if last else (0, 0.0)
    return round(steps / epochs) if steps and epochs else None


def _epoch_num(epoch: float) -> int:
    """MLPerf counts epochs from 1; a partial last epoch (a step cap) is still an epoch."""
    return max(1, math.ceil(round(epoch, 6)))


def _run_start(rank0: list[dict[str, Any]]) -> float | None:
    eval_before = 0.0
    for e in rank0:
        if e["name"] == "time/eval":
            eval_before += float(e["value"])
        elif e["name"] == "train/time":
            return float(e["time"]) - float(e["value"]) - eval_before
    return None


def _recoveries(log: _Log, document: RunDocument | None,
                per_step: Callable[[int], int]) -> list[tuple[float, int, int | None]]:
    """Log each restart, shrink and resume (see the module's docstring; ``per_step``: the global
    batch of a group of a size); returns (when, the step it went on from, a shrink's new size or
    None) of each."""
    if document is None:
        return []
    found: list[tuple[float, int, int | None]] = []
    section = document.extra.get(FAULTS_SECTION) or {}
    for entry in section.get("restarts") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("at"), (int, float)):
            continue
        from_step = int(entry.get("from_step") or 0)
        workers = entry.get("workers") if entry.get("survivors") is not None else None
        meta = {key: entry[key] for key in ("reason", "ranks", "reached_step", "lost_steps", "recovered_s",
                                            "survivors") if entry.get(key) is not None}
        if workers is not None:
            meta.update(workers=workers, global_batch_size=per_step(int(workers)))
        log.add(float(entry["at"]), "mlbench_shrink" if workers is not None else "mlbench_restart", from_step,
                metadata=meta)
        found.append((float(entry["at"]), from_step, int(workers) if workers is not None else None))
    for resume in document.resumes:
        if isinstance(resume.get("at"), (int, float)):
            from_step = int(resume.get("from_step") or 0)
            log.add(float(resume["at"]), "mlbench_resume", from_step,
                    metadata={key: resume[key] for key in ("after", "reason") if resume.get(key)})
            found.append((float(resume["at"]), from_step, None))
    return found


def _samples_at(workers: int, per_step: Callable[[int], int], shrinks: list[tuple[int, int]]) -> Any:
    """The samples trained by step ``step``: each step at the global batch (``per_step`` of the
    size) the group had then (``shrinks``: (the step a shrink went on from, the new size), in
    order)."""
    def samples(step: int) -> int:
        total, size, since = 0, workers, 0
        for from_step, new_size in shrinks:
            if from_step >= step:
                break
            total += (from_step - since) * per_step(size)
            size, since = new_size, from_step
        return total + (step - since) * per_step(size)

    return samples


def _epochs_and_evaluations(log: _Log, rank0: list[dict[str, Any]], start: float, samples_at: Any,
                            metric: str = "accuracy", again: list[tuple[float, int]] | None = None) -> None:
    """Epochs and evaluations as intervals, of the final trajectory (``again``: (when, from
    step) of each restart and resume; an evaluation a later one went back before is left out, and
    a step evaluated twice is logged as it was last); training after the last evaluation is one
    more epoch, to rank 0's last training-time reading. ``eval_accuracy`` holds the task's goal
    metric, as MLPerf's own translation benchmark logs BLEU under that key; a metric other than
    accuracy is named in its metadata (``"metric": "perplexity"``: lower is better)."""
    accuracy = {int(e["step"]): float(e["value"]) for e in rank0 if e["name"] == f"eval/{metric}"}
    def kept(e: dict[str, Any]) -> bool:   # not thrown away by a later restart or resume
        return not any(when > float(e["time"]) and from_step < int(e["step"]) for when, from_step in again or [])

    evaluations = {int(e["step"]): e for e in rank0 if e["name"] == "time/eval" and kept(e)}
    epoch_begin, evaluated = start, -1
    for e in sorted(evaluations.values(), key=lambda e: float(e["time"])):
        end, step = float(e["time"]), int(e["step"])
        begin = end - float(e["value"])
        meta = _interval_meta(float(e["epoch"]), samples_at(step), metric)
        if begin > epoch_begin:
            log.add(epoch_begin, "epoch_start", None, "INTERVAL_START", meta)
            log.add(begin, "epoch_stop", None, "INTERVAL_END", meta)
        log.add(begin, "eval_start", None, "INTERVAL_START", meta)
        if step in accuracy:
            log.add(end, "eval_accuracy", accuracy[step], metadata=meta)
        log.add(end, "eval_stop", None, "INTERVAL_END", meta)
        epoch_begin, evaluated = end, step
    trained = [e for e in rank0 if e["name"] == "train/time" and kept(e)]
    last = max(trained, key=lambda e: float(e["time"]), default=None)
    if last is not None and int(last["step"]) > evaluated and float(last["time"]) > epoch_begin:
        meta = _interval_meta(float(last["epoch"]), samples_at(int(last["step"])), metric)
        log.add(epoch_begin, "epoch_start", None, "INTERVAL_START", meta)
        log.add(float(last["time"]), "epoch_stop", None, "INTERVAL_END", meta)


def _interval_meta(epoch: float, samples: int, metric: str) -> dict[str, Any]:
    """An epoch's or evaluation's metadata: its epoch, the samples trained by then, and the goal
    metric where it is not accuracy."""
    meta: dict[str, Any] = {"epoch_num": _epoch_num(epoch), "samples_count": samples}
    if metric != "accuracy":
        meta["metric"] = metric
    return meta
