"""`mlbench predict`'s model (mlbench.results.predict) held to cases computed by hand from its
formulas (docs/predict.md), and its refusals."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mlbench.checkpoint_schedule import CheckpointRule
from mlbench.cli.predict import _checkpoint_rule
from mlbench.errors import UsageError
from mlbench.network.settings import NetworkSettings
from mlbench.results.predict import (Calibration, Link, Measured, Traffic, crossovers, ddp_buckets, fit_link,
                                     hops, nominal_link, whole_run_slowdown, wire_factor)

#: a two-worker sweep: 4 bytes in 100 us (latency only), 4 MB in 34.1 ms
ROWS = [{"dtype": "fp32", "bytes": 4, "time_s": 100e-6, "time_max_s": 100e-6},
        {"dtype": "fp32", "bytes": 4_000_000, "time_s": 0.0341, "time_max_s": 0.0441},
        {"dtype": "bf16", "bytes": 2, "time_s": 1.0}]          # another dtype: not read
ALPHA = 100e-6 / 2                                        # the smallest message's time over 2 (N - 1) = 2
BETA = (0.0341 - 2 * ALPHA) / 4e6                         # 8.5e-9 s per byte a rank sends


def scaled_rows(factor: float) -> list[dict]:
    """:data:`ROWS` with every time ``factor`` times longer: ``alpha`` and ``beta`` times ``factor``."""
    return [{**row, **{k: factor * row[k] for k in ("time_s", "time_max_s") if k in row}} for row in ROWS]


def link() -> Link:
    return fit_link(ROWS, 2, "1 Gbit/s", "sweep1")


def measured(workers: int, traffic: Traffic, compute: float = 0.05, goal: int | None = None,
             shared: bool = False, run_id: str = "run") -> Measured:
    return Measured(run_id, workers, compute, (0.8 * compute, 1.2 * compute), 0.0, compute, 32.0 * workers,
                    traffic, "not emulated", shared, goal, 0.0, "lab")


def test_the_ring_factors_are_nccl_tests():
    assert [hops("allreduce", n) for n in (1, 2, 8)] == [0, 2, 14]
    assert [hops("allgather", n) for n in (1, 2, 8)] == [0, 1, 7]
    assert wire_factor("allreduce", 8) == 2 * 7 / 8          # the bus-bandwidth factor
    assert wire_factor("allgather", 8) == 7
    assert wire_factor("gossip", 8, peers=4) == 4
    assert wire_factor("allreduce", 1) == 0                  # one worker sends nothing


def test_the_link_is_the_sweep_at_its_sizes_and_its_per_byte_cost_carries_to_n_workers():
    fitted = link()
    assert fitted.alpha_s == pytest.approx(ALPHA)
    assert fitted.per_byte(4e6) == pytest.approx(BETA)
    # at the sweep's own worker count the model gives back the sweep's times
    assert fitted.seconds("allreduce", 2, 4e6) == pytest.approx(0.0341)
    assert fitted.seconds("allreduce", 2, 4) == pytest.approx(100e-6)
    # 8 workers: 14 latency steps, 2 x 7/8 of the message per rank
    assert fitted.seconds("allreduce", 8, 4e6) == pytest.approx(14 * ALPHA + 1.75 * 4e6 * BETA)
    assert fitted.seconds("allreduce", 8, 4e6) == pytest.approx(0.0602)
    # between two measured sizes, the time is interpolated in log-log
    between = math.exp(math.log(100e-6) + (4 / 6) * (math.log(0.0341) - math.log(100e-6)))
    assert fitted.seconds("allreduce", 2, 4e4) == pytest.approx(between)
    # the slowest rank's times bound it from above
    assert fitted.seconds("allreduce", 8, 4e6, slowest=True) == pytest.approx(
        14 * ALPHA + 1.75 * 4e6 * (0.0441 - 2 * ALPHA) / 4e6)


def test_a_size_the_noise_timed_below_the_latency_costs_the_latency_and_no_bytes():
    """Three small sizes (median 100 us) and a 4 KB one timed at 80 us: at 4 KB the link gives
    its two latency steps, never less, so a run's communication beyond the link is measured
    from that floor."""
    rows = [{"dtype": "fp32", "bytes": b, "time_s": t} for b, t in
            ((4, 90e-6), (64, 100e-6), (1024, 110e-6), (4096, 80e-6), (4_000_000, 0.0341))]
    noisy = fit_link(rows, 2, "not emulated", "sweep")
    assert noisy.alpha_s == pytest.approx(50e-6)
    assert noisy.per_byte(4096) == 0.0
    assert noisy.seconds("allreduce", 2, 4096) == pytest.approx(100e-6)
    assert noisy.seconds("allreduce", 4, 4096) == pytest.approx(6 * 50e-6)


def test_a_message_of_fewer_elements_than_ranks_is_no_latency_sample():
    """One fp32 element over 2 ranks leaves one rank's chunk empty: fewer steps than a ring's, so
    its 20 us is left out of alpha, the mean of the 10- and 100-element messages' steps."""
    rows = [{"dtype": "fp32", "elements": n, "bytes": 4 * n, "time_s": t} for n, t in
            ((1, 20e-6), (10, 100e-6), (100, 140e-6), (1_000_000, 0.0341))]
    fitted = fit_link(rows, 2, "not emulated", "sweep")
    assert fitted.alpha_s == pytest.approx((100e-6 + 140e-6) / 2 / 2)
    # on 16 ranks, 10 elements leave chunks empty too: only the 100-element message's steps count
    assert fit_link(rows, 16, "not emulated", "sweep").alpha_s == pytest.approx(140e-6 / 30)


def test_the_repeats_of_a_sweep_give_each_size_the_median_of_their_times_and_the_latency_their_mean():
    slower = [{**r, "time_s": 3 * r["time_s"]} for r in ROWS]
    faster = [{**r, "time_s": 0.5 * r["time_s"], "time_max_s": 0.5 * r["time_s"]} for r in ROWS]
    repeated = fit_link(ROWS + slower + faster, 2, "1 Gbit/s", "a, b, c")
    assert repeated.times == link().times
    # the small messages' 100, 300 and 50 us: a step's collectives add up, so the mean, 150 us
    assert repeated.alpha_s == pytest.approx(150e-6 / 2)
    # the slowest rank's too, each repeat's no faster than its mean: at 4 MB the median of
    # 44.1 ms, 102.3 ms (a mean above the recorded max) and 17.05 ms
    assert repeated.slowest == pytest.approx((100e-6, 0.0441))


def test_a_network_no_sweep_measured_adds_its_nominal_rate_and_latency_to_the_machines_own():
    nominal = nominal_link(link(), NetworkSettings(bandwidth_bps=1e9, latency_s=1e-3))
    assert nominal.network == "1 Gbit/s, 1 ms" and nominal.source == "nominal, with sweep1"
    assert nominal.seconds("allreduce", 2, 4e6) == pytest.approx(2 * (ALPHA + 1e-3) + 4e6 * (BETA + 8e-9))
    assert nominal.seconds("allreduce", 2, 4e6) == pytest.approx(0.0681)


def test_each_collective_carries_the_measured_bytes_and_collectives_to_n_workers():
    # an all-reduce method: 8 MB on the wire per step at 2 workers (factor 1) in 2 collectives
    allreduce = Traffic("allreduce", 2, 8e6, 2.0)
    assert allreduce.message_bytes() == 8e6
    assert allreduce.seconds(link(), 8) == pytest.approx(2 * (14 * ALPHA + 1.75 * 4e6 * BETA))
    assert allreduce.seconds(link(), 8) == pytest.approx(0.1204)
    # an all-gather method: 4 MB per step at 2 workers (its share to 1 peer), one collective
    allgather = Traffic("allgather", 2, 4e6, 1.0)
    assert allgather.seconds(link(), 4) == pytest.approx(3 * ALPHA + 3 * 4e6 * BETA)
    assert allgather.seconds(link(), 4) == pytest.approx(0.10215)
    # gossip on a ring: 1 neighbour at 2 workers (a send and a receive), 2 at 8
    gossip = Traffic("gossip", 2, 4e6, 2.0, peers=1)
    assert gossip.seconds(link(), 8, peers=2) == pytest.approx(ALPHA + 2 * 4e6 * BETA)
    assert gossip.seconds(link(), 8, peers=2) == pytest.approx(0.06805)
    assert allreduce.seconds(link(), 1) == 0.0


def test_a_prediction_adds_compute_and_communication_and_knows_steps_only_where_runs_reached_the_goal():
    traffic = Traffic("allreduce", 2, 8e6, 2.0)
    calibration = Calibration("task1a", runs={"centralized-sgd": [
        measured(1, Traffic("allreduce", 1, 0.0, 0.0), compute=0.04, run_id="one"),
        measured(2, traffic, compute=0.05, goal=1000, run_id="two")]})
    at_eight = calibration.predict("centralized-sgd", 8, link())
    assert at_eight.compute_s == 0.05 and at_eight.compute_from == "two"     # the nearest count below
    assert at_eight.step_s == pytest.approx(0.05 + 0.1204)
    assert at_eight.throughput == pytest.approx(32 * 8 / (0.05 + 0.1204))   # samples per worker x 8
    assert at_eight.steps_to_goal is None and at_eight.time_to_goal_s is None   # never guessed
    assert any("each worker is taken to have resources of its own" in note for note in at_eight.notes)
    at_two = calibration.predict("centralized-sgd", 2, link())
    assert at_two.step_s == pytest.approx(0.05 + 2 * 0.0341)
    assert at_two.time_to_goal_s == pytest.approx(1000 * at_two.step_s)
    assert at_two.range_s == pytest.approx((0.04 + 2 * 0.0341, 0.06 + 2 * 0.0441))
    at_one = calibration.predict("centralized-sgd", 1, link())
    assert at_one.step_s == 0.04 and at_one.communication_s == 0.0
    from mlbench.cli.predict import _cost

    # cost to goal: a node per worker for the time to goal, at USD per node-hour
    assert _cost(at_two, 3.6) == pytest.approx(1000 * at_two.step_s * 2 * 3.6 / 3600)
    assert _cost(at_eight, 3.6) is None and _cost(at_two, None) is None


def test_compute_at_a_count_whose_workers_shared_the_cores_is_that_counts_own_and_said_so():
    traffic = Traffic("allreduce", 2, 8e6, 2.0)
    calibration = Calibration("task1a", runs={"centralized-sgd": [
        measured(2, traffic, compute=0.05, run_id="two"),
        measured(4, traffic, compute=0.11, shared=True, run_id="four")]})
    at_four = calibration.predict("centralized-sgd", 4, link())
    assert at_four.compute_s == 0.11
    assert at_four.notes[0] == "compute measured at 4 workers sharing the machine's cores (four)"
    # at 8 the oversubscribed count is not carried: each worker of a cluster has its own cores
    assert calibration.predict("centralized-sgd", 8, link()).compute_s == 0.05
    # below the count asked for too, a run without emulation first, however old: tc's shaping
    # costs the cores as well
    shaped = dataclasses.replace(measured(2, traffic, compute=0.07, run_id="shaped"), network="30 Mbit/s",
                                 created_at=1.0)
    calibration.runs["centralized-sgd"].append(shaped)
    assert calibration.predict("centralized-sgd", 8, link()).compute_s == 0.05


def test_a_straggler_multiplies_the_step_and_a_checkpoint_adds_its_measured_cost_over_its_interval():
    """--inject slow:rank=R,factor=F sleeps (F - 1) x the slowed rank's step after each step, so
    every peer waits for it: the step is F times the step without it. A checkpoint every N steps
    adds its measured seconds over N, outside that factor (it is written between steps)."""
    traffic = Traffic("allreduce", 2, 8e6, 2.0)
    writes = dataclasses.replace(measured(2, traffic, compute=0.05, run_id="two"), checkpoint_s=0.3)
    calibration = Calibration("task1a", runs={"centralized-sgd": [writes]})
    plain = calibration.predict("centralized-sgd", 2, link())
    slowed = calibration.predict("centralized-sgd", 2, link(), straggler=3.0, checkpoints=CheckpointRule(steps=10))
    assert slowed.step_s == pytest.approx(3 * (0.05 + 2 * 0.0341) + 0.3 / 10)
    assert slowed.range_s == pytest.approx((3 * plain.range_s[0] + 0.03, 3 * plain.range_s[1] + 0.03))
    assert slowed.to_dict()["straggler_factor"] == 3.0 and slowed.to_dict()["checkpoint_s"] == pytest.approx(0.03)
    assert "one worker 3x slower: every step waits for it" in slowed.notes
    # no run of the configuration wrote a checkpoint: its cost is unknown, left out, and said so
    none = Calibration("task1a", runs={"centralized-sgd": [measured(2, traffic, compute=0.05)]})
    unknown = none.predict("centralized-sgd", 2, link(), checkpoints=CheckpointRule(steps=10))
    assert unknown.step_s == pytest.approx(plain.step_s)
    assert any(n.startswith("checkpoint cost unknown: no run of this configuration wrote one") for n in unknown.notes)


def test_a_checkpoint_by_duration_or_auto_shares_its_cost_among_the_steps_of_its_interval():
    """By duration T: a checkpoint is due T after the last ended and written at the first clock
    check after that (every c = max(1, min(1000, floor(0.25 s / step))) steps), so T plus half a
    check passes between two, and its steps share the cost. auto:MTBF: T is Daly's optimum for
    the measured cost, as the workers choose it."""
    traffic = Traffic("allreduce", 2, 8e6, 2.0)
    writes = dataclasses.replace(measured(2, traffic, compute=0.05, run_id="two"), checkpoint_s=0.3)
    calibration = Calibration("task1a", runs={"centralized-sgd": [writes]})
    step = 0.05 + 2 * 0.0341          # the plain step (compute, two all-reduces): 0.1182 s, so c = 2
    every_minute = calibration.predict("centralized-sgd", 2, link(), checkpoints=CheckpointRule(seconds=60.0))
    assert every_minute.checkpoint_s == pytest.approx(0.3 * step / (60 + 2 * step / 2))
    assert every_minute.step_s == pytest.approx(step + 0.3 * step / (60 + step))
    assert "a checkpoint every 60s, 300 ms each as measured" in every_minute.notes
    # a step longer than the check's 0.25 s: the workers check at every step (c = 1)
    slowed = calibration.predict("centralized-sgd", 2, link(), straggler=4.0, checkpoints=CheckpointRule(seconds=2.0))
    assert slowed.checkpoint_s == pytest.approx(0.3 * 4 * step / (2 + 4 * step / 2))
    # auto:2h: Daly's interval for d = 0.3 s, M = 7200 s, by hand
    daly = math.sqrt(2 * 0.3 * 7200) * (1 + math.sqrt(0.3 / 14400) / 3 + 0.3 / 14400 / 9) - 0.3
    auto = calibration.predict("centralized-sgd", 2, link(), checkpoints=CheckpointRule(auto_mtbf_s=7200.0))
    assert auto.checkpoint_s == pytest.approx(0.3 * step / (daly + step))
    assert any(n.startswith(f"a checkpoint every {daly:.3g}s (auto: Daly's optimum for an MTBF of 7200s)")
               for n in auto.notes), auto.notes
    # as `mlbench predict --checkpoint-every` reads them; auto alone has no --inject schedule here
    assert _checkpoint_rule("500steps") == CheckpointRule(steps=500)
    assert _checkpoint_rule("2m") == CheckpointRule(seconds=120.0)
    assert _checkpoint_rule("auto:2h") == CheckpointRule(auto_mtbf_s=7200.0)
    with pytest.raises(UsageError, match="give the mean time between failures"):
        _checkpoint_rule("auto")
    none = Calibration("task1a", runs={"centralized-sgd": [measured(2, traffic, compute=0.05)]})
    unknown = none.predict("centralized-sgd", 2, link(), checkpoints=CheckpointRule(auto_mtbf_s=7200.0))
    assert unknown.checkpoint_s == 0.0
    assert any("--checkpoint-every auto:7200s); left out" in n for n in unknown.notes), unknown.notes


def test_only_a_straggler_for_the_whole_run_has_one_step_time():
    slow = {"kind": "slow", "rank": 1, "factor": 2.0}
    assert whole_run_slowdown([]) == 1.0
    assert whole_run_slowdown([slow, {**slow, "rank": 0, "factor": 3.0}, {"kind": "kill", "rank": 0, "at": 5}]) == 3.0
    for part in ({"at": 10.0}, {"for": 30.0}, {"every": 60.0}):
        assert whole_run_slowdown([{**slow, **part}]) is None


def test_the_crossover_is_named_where_one_optimizer_overtakes_another():
    # all-reduce SGD: little compute, 4 MB a step; a compressor: more compute, 4 KB a step
    calibration = Calibration("task1a", runs={
        "centralized-sgd": [measured(2, Traffic("allreduce", 2, 4e6, 1.0), compute=0.001)],
        "powersgd": [measured(2, Traffic("allreduce", 2, 4e3, 1.0), compute=0.05)]})
    predictions = {(p.optimizer, p.workers): p for p in (calibration.predict(o, n, link())
                                                         for o in ("centralized-sgd", "powersgd") for n in (2, 64))}
    kilobytes = 1e-4 * math.sqrt(341)        # the sweep at 4 KB: half-way between 4 B and 4 MB in log-log
    assert predictions["centralized-sgd", 2].step_s == pytest.approx(0.001 + 0.0341)
    assert predictions["powersgd", 2].step_s == pytest.approx(0.05 + kilobytes)
    assert predictions["centralized-sgd", 64].step_s == pytest.approx(0.001 + 126 * ALPHA + 2 * 63 / 64 * 4e6 * BETA)
    assert predictions["powersgd", 64].step_s == pytest.approx(
        0.05 + 126 * ALPHA + 2 * 63 / 64 * (kilobytes - 2 * ALPHA))
    assert crossovers(list(predictions.values())) == [
        "at 1 Gbit/s, powersgd overtakes centralized-sgd by step time between 2 and 64 workers"]
    # one worker count: nothing to overtake
    assert not crossovers([predictions["centralized-sgd", 2], predictions["powersgd", 2]])


def test_the_chart_draws_each_optimizer_and_network_as_predicted(tmp_path):
    """Two optimizers on two links at 2..64 workers: a line each in the step-time plot, with the
    predictions' step times and throughputs, the optimizer's colour and the link's line style,
    a legend entry each below the plots; written as PNG and SVG."""
    from mlbench.results.charts import COLOURS, prediction_chart, save_figure
    from matplotlib.colors import to_hex

    calibration = Calibration("task1a", runs={
        "centralized-sgd": [measured(2, Traffic("allreduce", 2, 4e6, 1.0), compute=0.001)],
        "powersgd": [measured(2, Traffic("allreduce", 2, 4e3, 1.0), compute=0.05)]})
    slow = nominal_link(link(), NetworkSettings(bandwidth_bps=1e8))
    predictions = [calibration.predict(o, n, each) for each in (link(), slow)
                   for o in ("centralized-sgd", "powersgd") for n in (2, 8, 64)]
    fig = prediction_chart("task1a", predictions)
    step_ax, rate_ax = fig.axes
    lines = {line.get_label(): line for line in step_ax.get_lines()}
    assert set(lines) == {f"{o}, {n}" for o in ("centralized-sgd", "powersgd") for n in ("1 Gbit/s", "100 Mbit/s")}
    for p in predictions:
        line = lines[f"{p.optimizer}, {p.link.network}"]
        assert p.step_s == pytest.approx(dict(zip(line.get_xdata(), line.get_ydata()))[p.workers])
        assert to_hex(line.get_color()) == COLOURS[("centralized-sgd", "powersgd").index(p.optimizer)]
        assert line.get_linestyle() == ("-" if p.link.network == "1 Gbit/s" else "--")
    rates = {tuple(line.get_xdata()): line for line in rate_ax.get_lines()}
    assert len(rate_ax.get_lines()) == 4 and all(len(x) == 3 for x in rates)
    assert step_ax.get_yscale() == "log" and rate_ax.get_ylabel() == "predicted images/s"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(lines)
    written = save_figure(fig, tmp_path, "task1a-predicted")
    assert [p.name for p in written] == ["task1a-predicted.png", "task1a-predicted.svg"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_what_cannot_be_predicted_is_refused_in_one_line():
    with pytest.raises(UsageError, match="no finished run of task1a with --optimizer powersgd"):
        Calibration("task1a").predict("powersgd", 8, link())
    one_worker = Calibration("task1a", runs={"centralized-sgd": [measured(1, Traffic("allreduce", 1, 0.0, 0.0))]})
    with pytest.raises(UsageError, match="on 2 or more workers measured what it sends"):
        one_worker.predict("centralized-sgd", 8, link())
    with pytest.raises(UsageError, match="no task0a sweep on 2 or more workers at 1 Gbit/s"):
        Calibration("task1a").link(NetworkSettings(bandwidth_bps=1e9))
    with pytest.raises(UsageError, match="a link needs two or more sizes"):
        fit_link(ROWS[:1], 2, "x", "sweep1")


def test_two_sweeps_that_disagree_and_a_busy_machine_refuse_to_calibrate(monkeypatch):
    from mlbench.cli import predict

    steady = [dict(r) for r in ROWS]
    predict._check_sweeps([ROWS, steady], "1 Gbit/s")                  # equal: accepted
    shaky = [{**r, "time_s": r["time_s"] * 3} for r in ROWS]
    with pytest.raises(UsageError, match=r"the 2 sweeps at 1 Gbit/s differ by 3\.00x in the median"):
        predict._check_sweeps([ROWS, shaky], "1 Gbit/s")
    predict._check_sweeps([ROWS, shaky], "1 Gbit/s", busy_ok=True)    # said, and accepted
    monkeypatch.setattr(predict.os, "getloadavg", lambda: (7.5, 7.0, 6.0))
    monkeypatch.setattr(predict.os, "cpu_count", lambda: 2)
    with pytest.raises(UsageError, match=r"the machine is busy \(load 7\.50 over the last minute on 2 cores"):
        predict._busy(busy_ok=False)
    predict._busy(busy_ok=True)


def test_the_communication_phase_the_link_does_not_explain_is_carried_to_every_count():
    """PowerSGD's encoding and decoding are in its communication phase: the calibration run's
    phase beyond what its own network's sweep explains is added at every worker count."""
    traffic = Traffic("allreduce", 2, 8e6, 2.0)
    explained = 2 * 0.0341                       # the run's 2 collectives of 4 MB on its sweep's link
    run = Measured("two", 2, 0.05, (0.04, 0.06), explained + 0.012, 0.2, 64.0, traffic, "1 Gbit/s", False, None,
                   0.0, "lab")
    calibration = Calibration("task1a", runs={"powersgd": [run]}, links={"1 Gbit/s": link()})
    at_two = calibration.predict("powersgd", 2, link())
    assert at_two.communication_s == pytest.approx(explained + 0.012)
    at_eight = calibration.predict("powersgd", 8, link())
    assert at_eight.communication_s == pytest.approx(0.1204 + 0.012)
    assert any("12 ms a step of two's communication phase is not its link's" in n for n in at_eight.notes)
    # a phase the link over-explains adds nothing; a run on a network no sweep measured neither
    faster = dataclasses.replace(run, communication_s=0.5 * explained)
    assert Calibration("task1a", runs={"powersgd": [faster]}, links={"1 Gbit/s": link()}).predict(
        "powersgd", 8, link()).communication_s == pytest.approx(0.1204)
    assert Calibration("task1a", runs={"powersgd": [run]}).predict("powersgd", 8, link()).communication_s == \
        pytest.approx(0.1204)


def test_where_the_workers_shared_the_cores_a_links_latency_passes_within_their_wait_for_a_core():
    """4 workers on 2 cores: a message step waits for the receiving rank to get a core, and a
    link's own latency passes within that wait; moving the bytes takes their time besides. The
    run's communication phase less the optimizer's own cost (from the run with cores of its
    own) and less its bytes' time on its link is what its message steps took: at that count it
    replaces a link's latency terms where it is longer. At a count no run shared cores at,
    only the optimizer's own cost is carried."""
    two_traffic, four_traffic = Traffic("allreduce", 2, 8e6, 2.0), Traffic("allreduce", 4, 12e6, 2.0)
    latency_four, bytes_four = 2 * 6 * ALPHA, 2 * 1.5 * 4e6 * BETA      # 0.6 ms and 102 ms on link()
    two = Measured("two", 2, 0.05, (0.04, 0.06), 2 * 0.0341 + 0.012, 0.2, 64.0, two_traffic, "1 Gbit/s", False,
                   None, 0.0, "lab")
    four = Measured("four", 4, 0.05, (0.04, 0.06), 0.5, 0.6, 128.0, four_traffic, "1 Gbit/s", True, None, 0.0,
                    "lab")
    calibration = Calibration("task1a", runs={"powersgd": [two, four]}, links={"1 Gbit/s": link()})
    waited = 0.5 - 0.012 - bytes_four                                   # 0.386 s of message steps
    assert calibration.predict("powersgd", 4, link()).communication_s == pytest.approx(0.5)

    def with_alpha(alpha: float) -> Link:   # link()'s bytes, a latency step of ``alpha`` (as nominal_link)
        return dataclasses.replace(link(), extra_alpha_s=alpha - ALPHA)

    slower = calibration.predict("powersgd", 4, with_alpha(5e-3))   # 60 ms of latency: within the wait
    assert slower.communication_s == pytest.approx(0.012 + bytes_four + waited)
    assert slower.overhead_s == pytest.approx(0.012)        # two's, not four's 0.5 - 0.1026
    assert any("four's 4 workers shared the machine's cores" in n for n in slower.notes)
    far = calibration.predict("powersgd", 4, with_alpha(50e-3))     # 600 ms of latency: longer than the wait
    assert far.communication_s == pytest.approx(0.012 + bytes_four + 2 * 6 * 50e-3)
    twice = fit_link(scaled_rows(2), 2, "300 Mbit/s", "sweep2")    # alpha and beta doubled: the bytes add
    assert calibration.predict("powersgd", 4, twice).communication_s == pytest.approx(0.012 + 2 * bytes_four + waited)
    at_eight = calibration.predict("powersgd", 8, link())     # the traffic of four, the own cost of two
    assert at_eight.traffic_from == "four"
    assert at_eight.communication_s == pytest.approx(0.1204 + 0.012)
    # a run that shared cores but whose phase its link explains has no wait to carry
    steady = dataclasses.replace(four, communication_s=latency_four + bytes_four + 0.012)
    assert Calibration("task1a", runs={"powersgd": [two, steady]}, links={"1 Gbit/s": link()}).predict(
        "powersgd", 4, with_alpha(5e-3)).communication_s == pytest.approx(0.012 + bytes_four + 2 * 6 * 5e-3)


def test_a_calibration_run_counts_as_the_median_of_its_repeats():
    """`predict --calibrate` makes 3 runs per optimizer and count (one `mlbench run --repeat 3`
    group): each per-step figure is their median, so that one noisy run does not carry into
    every prediction of its optimizer. A run of another group, count or network is not mixed in."""
    from mlbench.results.predict import median_of_repeats

    traffic, explained = Traffic("allreduce", 2, 8e6, 2.0), 2 * 0.0341
    base = Measured("a", 2, 0.05, (0.04, 0.06), explained + 0.010, 0.2, 64.0, traffic, "1 Gbit/s", False, None,
                    1.0, "lab", group="g")
    runs = [base,
            dataclasses.replace(base, run_id="b", compute_s=0.07, communication_s=explained + 0.030, created_at=2.0),
            dataclasses.replace(base, run_id="c", compute_s=0.06, communication_s=explained + 0.002, created_at=3.0),
            dataclasses.replace(base, run_id="d", compute_s=0.5, communication_s=1.0, created_at=4.0, group="h"),
            dataclasses.replace(base, run_id="e", compute_s=0.5, communication_s=1.0, created_at=5.0,
                                network="30 Mbit/s")]
    median = median_of_repeats(runs[2], runs)
    assert median.run_id == "a, b, c"
    assert median.compute_s == pytest.approx(0.06) and median.communication_s == pytest.approx(explained + 0.010)
    assert median_of_repeats(runs[3], runs) == runs[3]          # alone in its group
    calibration = Calibration("task1a", runs={"powersgd": runs[:3]}, links={"1 Gbit/s": link()})
    at_two = calibration.predict("powersgd", 2, link())
    assert at_two.overhead_s == pytest.approx(0.010)            # not the newest run's 0.002
    assert at_two.compute_s == pytest.approx(0.06) and at_two.compute_from == "a, b, c"


def test_a_calibrations_sweeps_time_200_small_all_reduces_a_size_unless_told():
    """A small all-reduce here takes under 1 ms most times and a 4-ms scheduler tick about one
    time in four: the mean of task 0a's own 20 is off by about 20%, of 200 by about 7%."""
    from mlbench.cli.predict import sweep_overrides

    assert sweep_overrides(None) == {"iterations": 200, "seconds_per_size": 1.0}
    assert sweep_overrides(30) == {"iterations": 30, "seconds_per_size": 1.0}
    assert sweep_overrides(800) == {"iterations": 800, "seconds_per_size": 4.0}
    with pytest.raises(UsageError, match="--sweep-iterations 1: give at least 2"):
        sweep_overrides(1)


def test_a_task_with_a_fixed_global_batch_scales_compute_by_its_micro_batches_and_refuses_counts_it_cannot_run():
    """Task 5a's step is the global batch whatever the count: each of N workers accumulates
    global / (batch_per_worker x N) micro-batches, so compute per step halves from 2 to 4."""
    from mlbench.tasks.task5a.settings import GPTSettings

    settings = GPTSettings(global_batch=16, batch_per_worker=2)
    traffic = Traffic("allreduce", 2, 8e6, 2.0)
    run = Measured("two", 2, 0.4, (0.3, 0.5), 0.0, 0.5, 16.0, traffic, "not emulated", False, None, 0.0, "lab")
    calibration = Calibration("task5a", runs={"centralized-adamw": [run]}, settings={"centralized-adamw": settings})
    at_four = calibration.predict("centralized-adamw", 4, link())
    assert at_four.compute_s == pytest.approx(0.4 * 2 / 4)          # 4 micro-batches at 2 workers, 2 at 4
    assert at_four.samples_per_step == 16.0                          # the global batch, not 4 x 8
    assert calibration.predict("centralized-adamw", 1, link()).compute_s == pytest.approx(0.4 * 8 / 4)
    with pytest.raises(UsageError, match="task5a on 16 workers: a global batch of 16 sequences is not a whole"):
        calibration.predict("centralized-adamw", 16, link())


def test_ddp_hides_the_buckets_whose_all_reduce_ends_inside_the_backward_pass():
    """DDP's buckets fill in backward order, the first at 1 MiB, the rest at ``bucket_mb`` MiB;
    a bucket's all-reduce starts once the backward pass has made its bytes (at an even rate)
    and the one before it is done. What runs past the backward pass is exposed. A DDP run's
    backward phase held its own exposed all-reduces: that part is no compute."""
    assert ddp_buckets(8e6, 25.0) == [2 ** 20, 8e6 - 2 ** 20]
    assert ddp_buckets(3 * 2 ** 20, 1.0) == [2 ** 20] * 3
    assert ddp_buckets(1000.0, 25.0) == [1000.0]
    share = 2 ** 20 / 8e6                                          # the first bucket's share of the bytes
    traffic = Traffic("allreduce", 2, 8e6, 2.0)                    # 8 MB a step in 2 buckets
    run = dataclasses.replace(measured(2, traffic, compute=0.3, run_id="two"), network="1 Gbit/s", backward_s=0.2)
    calibration = Calibration("task1a", runs={"ddp": [run]}, links={"1 Gbit/s": link()})
    exposed_at_two = 2 * 0.0341 * (1 - share)                     # the second bucket, after the backward pass
    at_eight = calibration.predict("ddp", 8, link())
    assert at_eight.compute_s == pytest.approx(0.3 - exposed_at_two)
    assert at_eight.communication_s == pytest.approx(0.1204)
    assert at_eight.hidden_s == pytest.approx(0.1204 * share)     # the first bucket, inside the backward pass
    assert at_eight.step_s == pytest.approx(0.3 - exposed_at_two + 0.1204 * (1 - share))
    assert at_eight.to_dict()["hidden_s"] == pytest.approx(0.1204 * share)
    assert any("runs beside the backward pass" in note for note in at_eight.notes)
    # a backward pass too short for the first bucket's all-reduce hides what remains of it after
    # that bucket is made (a run on a network no sweep measured: its backward phase is taken whole)
    short = dataclasses.replace(run, compute_s=0.1, backward_s=0.01, network="not emulated")
    at_eight = Calibration("task1a", runs={"ddp": [short]}).predict("ddp", 8, link())
    assert at_eight.compute_s == 0.1
    assert at_eight.hidden_s == pytest.approx(0.01 * (1 - share))
    # centralized SGD waits for each all-reduce where it is issued: nothing hidden
    plain = Calibration("task1a", runs={"centralized-sgd": [run]}, links={"1 Gbit/s": link()})
    assert plain.predict("centralized-sgd", 8, link()).hidden_s == 0.0


def test_streaming_diloco_hides_each_fragments_all_reduce_behind_its_overlap_inner_steps():
    """A fragment's all-reduce runs beside ``overlap`` (tau) inner steps: each collective is hidden
    up to their compute, amortised over the steps between collectives."""
    traffic = Traffic("allreduce", 2, 0.4e6, 0.1)                 # one 4-MB all-reduce every 10 steps
    run = measured(2, traffic, compute=0.05, run_id="two")
    calibration = Calibration("task1a", runs={"streaming-diloco": [run]})
    at_two = calibration.predict("streaming-diloco", 2, link())
    assert at_two.communication_s == pytest.approx(0.1 * 0.0341)
    assert at_two.hidden_s == pytest.approx(0.1 * 0.0341)          # 34 ms beside one 50-ms step: all of it
    assert at_two.step_s == pytest.approx(0.05)
    at_eight = calibration.predict("streaming-diloco", 8, link())
    assert at_eight.hidden_s == pytest.approx(0.1 * 0.05)          # 60 ms beside 50 ms: 10 ms left
    assert at_eight.step_s == pytest.approx(0.05 + 0.1 * (0.0602 - 0.05))
    waiting = Calibration("task1a", runs={"streaming-diloco": [run]},
                          configuration={"streaming-diloco": {"opt.overlap": "0"}})
    assert waiting.predict("streaming-diloco", 8, link()).hidden_s == 0.0     # tau = 0: waited for at once
    twice = Calibration("task1a", runs={"streaming-diloco": [run]},
                        configuration={"streaming-diloco": {"opt.overlap": "2"}})
    assert twice.predict("streaming-diloco", 8, link()).step_s == pytest.approx(0.05)
