"""`mlbench predict`: step time, throughput, speedup and time to the goal at worker counts and
networks past this machine, from a calibration of measured runs (mlbench.results.predict)."""

from __future__ import annotations

import os
import statistics
from typing import Any

import click

from mlbench.checkpoint_schedule import CheckpointRule
from mlbench.cli import cli
from mlbench.cli.completion import complete_tasks
from mlbench.cli.output import emit, output_option, tabulate
from mlbench.cli.results import pricing_options
from mlbench.errors import UsageError
from mlbench.launch.plan import parse_checkpoint_auto, parse_checkpoint_every
from mlbench.launch.session import open_store
from mlbench.network.settings import NetworkSettings, network_options
from mlbench.results.predict import (Calibration, Prediction, calibration_from, crossovers, describe_link,
                                     predict_run)
from mlbench.results.cost import cost_usd, node_hour_price
from mlbench.results.outcome import fmt_duration
from mlbench.tasks.registry import get_task
from mlbench.tasks.spec import TaskSpec

#: The load per core above which a calibration is refused: its runs would measure the others.
BUSY_LOAD_PER_CORE = 0.5
#: Sweeps of one network per calibration: the link takes the median of their times per size.
SWEEPS = 3
#: Sweeps of one network whose times differ by more than this (the median over message sizes
#: of slowest / fastest) are too unsteady to fit a link to. Three sweeps of 200 operations a
#: size on the 2-core machine, at a load of 1-2, differed by 1.06-1.82x; of 20 operations at a
#: load of 2 or more, by up to 5x.
SWEEP_SPREAD = 2.5
#: Calibration runs per optimizer and worker count: one run carries its noise into every
#: prediction of its optimizer; the model takes the median of these repeats.
CALIBRATION_REPEATS = 3
#: Timed all-reduces per message size in a calibration's sweeps (task 0a's own default is 20).
#: A small all-reduce here takes 0.3-0.9 ms most times and a scheduler tick (4 ms) more about
#: one time in four, so the mean of 20 is off by about 20%, the mean of 200 by about 7%.
CALIBRATION_ITERATIONS = 200
#: Seconds per message size in a calibration's sweeps: room for all of a small message's
#: iterations; a large one's few take the same time, and its bandwidth term needs no more.
CALIBRATION_SECONDS_PER_SIZE = 1.0


def _checkpoint_rule(text: str | None) -> CheckpointRule | None:
    """``--checkpoint-every`` as `mlbench run` spells it: ``500steps``, a duration (``2m``) or
    ``auto:MTBF``. ``auto`` alone takes its MTBF from a run's --inject schedule, which a
    prediction has none of."""
    if text is None:
        return None
    mtbf = parse_checkpoint_auto(text)
    if mtbf is not None:
        if not mtbf:
            raise UsageError(f"--checkpoint-every {text}: give the mean time between failures (auto:2h); a "
                             "prediction has no --inject schedule to take it from", option="checkpoint_every")
        return CheckpointRule(auto_mtbf_s=mtbf)
    seconds, steps = parse_checkpoint_every(text)
    return CheckpointRule(steps=steps) if steps is not None else CheckpointRule(seconds=seconds)


def _counts(text: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UsageError(f"--workers {text}: expected whole numbers, comma-separated (2,8,64)",
                         option="workers") from None
    if not counts or counts[0] < 1:
        raise UsageError(f"--workers {text}: expected worker counts of 1 or more", option="workers")
    return counts


def _networks(bandwidth: str | None, latency: str | None) -> list[NetworkSettings | None]:
    networks = network_options(bandwidth, latency, None, None)
    return list(networks) if networks else [None]


def _seconds(value: float | None) -> str:
    if value is None:
        return "unknown"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    return fmt_duration(value)


def _cost(prediction: Prediction, usd: float | None) -> float | None:
    """USD to the goal: one node per worker for the predicted time to goal (None: unknown)."""
    seconds = prediction.time_to_goal_s
    return None if usd is None or seconds is None else cost_usd(seconds, prediction.workers, usd)


def _table(predictions: list[Prediction], usd: float | None = None) -> str:
    base: dict[tuple[str, str], Prediction] = {}
    for p in predictions:
        key = (p.optimizer, p.link.network)
        if key not in base or p.workers < base[key].workers:
            base[key] = p
    rows = []
    for p in predictions:
        first = base[(p.optimizer, p.link.network)]
        speedup = p.throughput / first.throughput * first.workers if first.throughput else None
        low, high = p.range_s
        rows.append([p.optimizer, p.link.network, p.workers, _seconds(p.step_s),
                     f"{_seconds(max(low, 0))}..{_seconds(high)}", _seconds(p.compute_s), _seconds(p.communication_s),
                     f"{p.throughput:.4g}", "-" if speedup is None else f"{speedup:.2f}x",
                     _seconds(p.time_to_goal_s)] + ([_usd(_cost(p, usd))] if usd is not None else []))
    headers = ["OPTIMIZER", "NETWORK", "WORKERS", "STEP", "RANGE", "COMPUTE", "COMMUNICATION", "SAMPLES/S",
               "SPEEDUP", "TIME TO GOAL"]
    return tabulate(rows, headers=headers + (["COST TO GOAL"] if usd is not None else []))


def _usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def _busy(busy_ok: bool) -> None:
    """Refuse to calibrate on a busy machine (its runs would measure the other jobs)."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load > BUSY_LOAD_PER_CORE * cores and not busy_ok:
        raise UsageError(f"the machine is busy (load {load:.2f} over the last minute on {cores} cores, above "
                         f"{BUSY_LOAD_PER_CORE * cores:g}): calibrate on an idle machine, or give --busy-ok",
                         option="calibrate")


def _check_sweeps(rows: list[list[dict[str, Any]]], label: str, busy_ok: bool = False) -> None:
    """Refuse sweeps of one network that disagree: the machine was too busy to measure it
    (``busy_ok``: say so and go on)."""
    times: dict[Any, list[float]] = {}
    for sweep in rows:
        for r in sweep:
            if r.get("dtype") == "fp32" and r.get("time_s", 0) > 0:
                times.setdefault(r["bytes"], []).append(r["time_s"])
    ratios = {size: max(ts) / min(ts) for size, ts in times.items() if len(ts) > 1}
    if not ratios:
        return
    spread = statistics.median(ratios.values())
    if spread > SWEEP_SPREAD:
        worst = max(ratios, key=lambda s: ratios[s])
        problem = (f"the {len(rows)} sweeps at {label} differ by {spread:.2f}x in the median (up to "
                   f"{ratios[worst]:.2f}x at {worst} bytes), more than {SWEEP_SPREAD}x")
        if busy_ok:
            click.echo(f"warning: {problem}; their median is used (--busy-ok)", err=True)
            return
        raise UsageError(f"{problem}: the machine is too busy to calibrate; try again when it is idle, "
                         "or give --busy-ok", option="calibrate")


def sweep_overrides(sweep_iterations: int | None) -> dict[str, float]:
    """Task 0a's ``--set`` for a calibration's sweeps: ``sweep_iterations`` timed all-reduces
    per size (:data:`CALIBRATION_ITERATIONS` if None) in a time budget per size that lets a
    small message run them all (:data:`CALIBRATION_SECONDS_PER_SIZE`, grown with more)."""
    iterations = CALIBRATION_ITERATIONS if sweep_iterations is None else sweep_iterations
    if iterations < 2:
        raise UsageError(f"--sweep-iterations {iterations}: give at least 2", option="sweep_iterations")
    return {"iterations": iterations,
            "seconds_per_size": CALIBRATION_SECONDS_PER_SIZE * max(1.0, iterations / CALIBRATION_ITERATIONS)}


def _calibrate(task: str, optimizers: list[str], networks: list[NetworkSettings | None], workers: list[int],
               steps: int, max_size: int, options: dict[str, Any], busy_ok: bool,
               sweep_iterations: int | None = None, repeat: int = 1) -> None:
    """The calibration's runs: :data:`SWEEPS` task-0a sweeps on 2 workers per network (and on the
    machine's own), then ``repeat`` runs of each optimizer's task at each calibration worker
    count (the model takes their median).
    ``sweep_iterations``: the timed all-reduces per size (task 0a's ``--set iterations``;
    :data:`CALIBRATION_ITERATIONS` if None), with a time budget per size that lets a small
    message run them all."""
    from mlbench import api

    _busy(busy_ok)
    sweep_set = sweep_overrides(sweep_iterations)
    shown_set = "".join(f" --set {k}={v:g}" for k, v in sweep_set.items())
    for settings in ([None] + [n for n in networks if n is not None]):
        network_args: dict[str, Any] = {}
        if settings is not None and settings.bandwidth_bps:
            network_args["bandwidth"] = f"{settings.bandwidth_bps:.0f}bit"
        if settings is not None and settings.latency_s:
            network_args["latency"] = f"{settings.latency_s * 1e6:.6g}us"
        label = settings.label() if settings else "the machine's own network"
        click.echo(f"calibrating the link at {label}: mlbench run task0a 2 --max-size {max_size} --repeat {SWEEPS}"
                   f"{shown_set}", err=True)
        started = api.start(api.plan("task0a", [2], max_size=max_size, repeat=SWEEPS, overrides=sweep_set,
                                     **network_args))
        sweeps = []
        for run in started.runs:
            if run.state != "finished" or not run.result:
                raise UsageError(f"the task0a sweep at {label} ({run.id}) {run.state}: {run.reason}",
                                 option="calibrate")
            sweeps.append(run.result.get("rows", []))
        _check_sweeps(sweeps, label, busy_ok)
    for optimizer in optimizers:
        for count in workers:   # the load is checked once, before: these runs raise it themselves
            click.echo(f"calibrating {optimizer}: mlbench run {task} {count} --optimizer {optimizer} "
                       f"--max-steps {steps}{f' --repeat {repeat}' if repeat > 1 else ''}", err=True)
            started = api.start(api.plan(task, [count], optimizer=optimizer, max_steps=steps,
                                         log_every=max(1, steps // 6), repeat=repeat, **options))
            for run in started.runs:
                if run.state != "finished":
                    raise UsageError(f"the calibration run {run.id} of {optimizer} {run.state}: {run.reason}",
                                     option="calibrate")


def predicted_line(store: Any, record: Any) -> str:
    """`status RUN --predicted`: the run's predicted step time beside its measured one."""
    prediction, measured = predict_run(store, record)
    error = prediction.step_s / measured.step_s - 1
    return (f"Predicted step {_seconds(prediction.step_s)} (compute {_seconds(prediction.compute_s)} + "
            f"communication {_seconds(prediction.communication_s)}, {prediction.link.network}); measured "
            f"{_seconds(measured.step_s)} (communication {_seconds(measured.communication_s)}): {100 * error:+.1f}%. "
            f"From runs {prediction.compute_from}, {prediction.traffic_from} and the link {prediction.link.source}.")


def _validate(run_refs: tuple[str, ...], output: str) -> None:
    """Each run's predicted step time beside its measured one, from a calibration without any of
    the runs given (one validated run never calibrates another)."""
    store = open_store(read_only=True)
    rows, out = [], []
    errors = []
    records = [store.get(ref) for ref in run_refs]
    for record in records:
        prediction, measured = predict_run(store, record, exclude=[r.id for r in records])
        optimizer = prediction.optimizer
        error = prediction.step_s / measured.step_s - 1
        errors.append(abs(error))
        rows.append([record.id, optimizer, prediction.link.network, record.workers,
                     _seconds(prediction.step_s), _seconds(measured.step_s), f"{100 * error:+.1f}%",
                     _seconds(prediction.communication_s), _seconds(measured.communication_s)])
        out.append({"run": record.id, "predicted": prediction.to_dict(), "measured_step_s": measured.step_s,
                    "measured_communication_s": measured.communication_s, "error": error})
    if output != "table":
        emit({"validation": out, "median_abs_error": statistics.median(errors)}, output)
        return
    click.echo(tabulate(rows, headers=["RUN", "OPTIMIZER", "NETWORK", "WORKERS", "PREDICTED", "MEASURED", "ERROR",
                                       "PRED. COMM", "MEAS. COMM"]))
    click.echo(f"median absolute error {100 * statistics.median(errors):.1f}% over {len(errors)} run(s)")


@cli.command()
@click.argument("args", metavar="TASK | RUN...", nargs=-1, required=True, shell_complete=complete_tasks)
@click.option("--workers", "-n", "workers_text", default="2,8,64", show_default=True,
              help="Worker counts to predict, comma-separated.")
@click.option("--bandwidth", help="Network rates, comma-separated (1gbit,10gbit) [the machine's own network].")
@click.option("--latency", help="One-way latency of every link (0.5ms, 50us).")
@click.option("--optimizer", "optimizers_text", help="Optimizers, comma-separated [the task's reference].")
@click.option("--calibrate", is_flag=True,
              help="First make the calibration's runs here: task0a sweeps per network, each optimizer's short runs.")
@click.option("--calibration-workers", default="1,2", show_default=True,
              help="Worker counts of the calibration's training runs.")
@click.option("--calibration-steps", default=60, show_default=True, help="Steps of each calibration run.")
@click.option("--calibration-repeat", type=click.IntRange(min=1), default=CALIBRATION_REPEATS, show_default=True,
              help="Calibration runs per optimizer and worker count; the model takes their median.")
@click.option("--max-size", default=1_000_000, show_default=True, help="Largest message of the calibration's sweeps, "
              "in elements.")
@click.option("--sweep-iterations", type=int, help="Timed all-reduces per message size in the calibration's "
              f"sweeps [{CALIBRATION_ITERATIONS}]; more make the link's times steadier.")
@click.option("--data-dir", help="The task's data for the calibration's runs (as mlbench run --data-dir).")
@click.option("--data", type=click.Choice(["real", "synthetic"]), help="synthetic: calibrate on random data.")
@click.option("--busy-ok", is_flag=True, help="Calibrate even though the machine is busy (its load, or two sweeps "
              "that disagree).")
@click.option("--validate", is_flag=True, help="The arguments are runs: show each one's predicted step time "
              "beside its measured one.")
@click.option("--straggler", type=click.FloatRange(min=1.0), default=1.0, show_default=True,
              help="One worker this many times slower for the whole run (as --inject slow:rank=R,factor=F).")
@click.option("--checkpoint-every", "checkpoints", metavar="Nsteps|DURATION|auto:MTBF",
              callback=lambda _c, _p, v: _checkpoint_rule(v),
              help="Checkpoints as mlbench run --checkpoint-every writes them (500steps, 2m, auto:2h), each at "
              "the cost the configuration's runs measured.")
@click.option("--chart", "chart_dir", type=click.Path(file_okay=False),
              help="Also draw the predictions: DIR/TASK-predicted.png and .svg (the charts extra).")
@pricing_options
@output_option
def predict(args, workers_text, bandwidth, latency, optimizers_text, calibrate, calibration_workers,
            calibration_steps, calibration_repeat, max_size, sweep_iterations, data_dir, data, busy_ok, validate,
            straggler, checkpoints, chart_dir, instance, price_per_hour, prices_file, output) -> None:
    """Predict step time, throughput, speedup and time to the goal at any worker count and
    network, from measured runs: task 0a's sweeps fit each link's latency and bandwidth, each
    optimizer's runs give its compute per step, bytes and collectives (docs/predict.md).

    \b
    Examples:
      mlbench predict task1a --workers 2,8,64 --bandwidth 1gbit,10gbit --optimizer centralized-sgd,powersgd
      mlbench predict task2a --calibrate --data-dir ~/data/epsilon --bandwidth 100mbit
      mlbench predict --validate 3f2a9c1d 7b0e44aa
      mlbench predict task2a --bandwidth 100mbit,1gbit --workers 2,4,8,16 --chart charts/
    """
    if validate:
        if straggler != 1.0 or checkpoints:
            raise UsageError("--validate reads each run's own stragglers and checkpoints; drop --straggler "
                             "and --checkpoint-every")
        _validate(tuple(args), output)
        return
    if len(args) != 1:
        raise UsageError("give one task (or --validate and runs)")
    task = args[0]
    spec = get_task(task)
    if not isinstance(spec, TaskSpec):
        raise UsageError(f"{task} is the sweep a prediction is calibrated with; predict a training task")
    counts = _counts(workers_text)
    networks = _networks(bandwidth, latency)
    usd = node_hour_price(instance, price_per_hour, prices_file)
    optimizers = [o.strip() for o in (optimizers_text or spec.optimizer).split(",") if o.strip()]
    if calibrate:
        options = {k: v for k, v in {"data_dir": data_dir, "data": data}.items() if v}
        _calibrate(task, optimizers, networks, _counts(calibration_workers), calibration_steps, max_size, options,
                   busy_ok, sweep_iterations, calibration_repeat)
    calibration = calibration_from(open_store(read_only=True), task, optimizers)
    predictions = [calibration.predict(o, n, calibration.link(settings), straggler, checkpoints)
                   for settings in networks for o in optimizers for n in counts]
    notes = crossovers(predictions)
    if chart_dir is not None:
        from mlbench.results.charts import prediction_chart, save_figure

        for path in save_figure(prediction_chart(task, predictions), chart_dir, f"{task}-predicted"):
            click.echo(f"Wrote {path}", err=True)   # stdout stays the table, or the -o document
    if output != "table":
        emit({"task": task, "predictions": [{**p.to_dict(), "cost_usd": _cost(p, usd)} for p in predictions],
              "usd_per_node_hour": usd, "crossovers": notes,
              "calibration": _calibration_document(calibration, optimizers)}, output)
        return
    click.echo(_table(predictions, usd))
    for line in sorted({describe_link(p.link) for p in predictions}):
        click.echo(f"link  {line}")
    for optimizer in optimizers:
        runs = calibration.runs.get(optimizer, [])
        click.echo(f"runs  {optimizer}: " + ", ".join(f"{m.run_id} ({m.workers}w, {m.machine})" for m in runs))
    for line in sorted({n for p in predictions for n in p.notes}):
        click.echo(f"note  {line}")
    for line in notes:
        click.echo(f"cross {line}")
    if any(p.steps_to_goal is None for p in predictions):
        click.echo("Time to goal is unknown where no run of that configuration and worker count reached the goal.")


def _calibration_document(calibration: Calibration, optimizers: list[str]) -> dict[str, Any]:
    return {"links": {k: v.to_dict() for k, v in calibration.links.items()},
            "runs": {o: [{"run": m.run_id, "workers": m.workers, "compute_s": m.compute_s, "step_s": m.step_s,
                          "communication_s": m.communication_s, "network": m.network,
                          "wire_bytes_per_step": m.traffic.wire_bytes,
                          "collectives_per_step": m.traffic.collectives, "shared_cores": m.shared_cores}
                         for m in calibration.runs.get(o, [])] for o in optimizers}}
