"""`mlbench charts`: the original's four figures per task, from the user's own runs.

The original published, per task (docs/tasks.md, "The original's published results"): the
speedup of time to accuracy against the number of workers, the cost of a run against the number
of workers, loss against time for each worker count with the target line, and the
communication/computation time ratio per worker count. Each
is drawn here from a :class:`~mlbench.results.compare.Comparison`, so the charts show exactly the
groups, repeats and families that `mlbench compare` prints. When the runs were made at several
emulated bandwidths (`mlbench run ... --bandwidth 100mbit,1gbit`), or at one bandwidth and
several latencies, a fifth figure shows time to accuracy, time per epoch and bytes per step
against that setting, a line per optimizer. When some run was put through faults (`--inject`)
or restarted, a figure of fault timelines follows: each such run's training loss over the wall
clock with its faults and restarts marked. Task 0a's runs (the all-reduce sweep) have one figure
instead: bandwidth against message size. Every value and target is labelled by the task's metric
(:mod:`mlbench.tasks.metrics`): a perplexity is never drawn as a percentage.
Figures are drawn on matplotlib's Agg canvas without pyplot: no display, no global state between
calls. A figure's legend stands below its plots, in as many columns as the figure's width holds,
and the figure grows taller to hold it; titles and legend entries wrap, so none is clipped; each
family has a colour of :data:`COLOURS` and, past twelve, another line style (or hatch) in it.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from collections.abc import Sequence

from mlbench.extras import needs
from mlbench.frameworks import DEFAULT_FRAMEWORK
from mlbench.network.settings import format_rate, format_time
from mlbench.results.compare import (TIME_TO_ACCURACY, Comparison, Family, Group, RunResult,
                                     sweep_bandwidth)
from mlbench.results.fingerprint import NAMED_KEYS, differing_keys
from mlbench.results.events import read_run_events
from mlbench.results.goodput import FAULTS_SECTION, recoveries
from mlbench.results.report import (differs_in_network, group_label, had_faults, is_sweep, task_metric,
                                    throughput_unit)
from mlbench.run_config import RunDocument
from mlbench.safefile import replacing

if TYPE_CHECKING:
    from mlbench.results.predict import Prediction
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

CHART_NAMES = ("speedup", "cost", "loss-accuracy", "communication")
#: Task 0a's figure: bandwidth against message size, a line per worker count, network and dtype.
SWEEP_CHART_NAMES = ("bandwidth",)
FORMATS = ("png", "svg")
#: The fault timelines drawn in one figure at most (the first runs with faults, in compare's order).
MAX_TIMELINES = 6
#: Twelve colours that colour-blind readers tell apart too: Paul Tol's qualitative scheme as CARTO
#: publishes it ("Safe", https://carto.com/carto-colors), the strongest first.
COLOURS = ("#332288", "#cc6677", "#117733", "#88ccee", "#aa4499", "#ddcc77", "#44aa99", "#882255",
           "#999933", "#661100", "#6699cc", "#888888")
#: The line styles, markers and hatches that tell apart the families that share a colour, one per
#: round of COLOURS (the markers also tell worker counts apart in the loss and accuracy figure).
_STYLES: tuple[Literal["-", "--", ":", "-."], ...] = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D")
_HATCHES = ("", "//", "..", "xx")
#: The ideal (linear) speedup's line: grey, apart from every family's colour.
_IDEAL: dict[str, Any] = {"linestyle": (0, (5, 2)), "color": "#444444", "alpha": 0.6, "lw": 1.0}
#: Legend text: its size (points) and the characters of a line before it wraps, the narrowest first.
_LEGEND_FONTSIZE = 8
_LEGEND_LINES = (40, 60, 90)


def write_charts(comparison: Comparison, out_dir: str | Path,
                 formats: Sequence[str] = FORMATS) -> list[Path]:
    """Draw the four charts and write each in every format; returns the files written."""
    with needs("charts"):  # before anything is written
        import matplotlib  # noqa: F401

    written = []
    for name, fig in chart_figures(comparison).items():
        written += save_figure(fig, out_dir, f"{comparison.task}-{name}", formats)
    return written


def save_figure(fig: Figure, out_dir: str | Path, stem: str, formats: Sequence[str] = FORMATS) -> list[Path]:
    """``fig`` as ``OUT_DIR/STEM.FORMAT`` in each format (the folder made if need be); the files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = out / f"{stem}.{fmt}"
        with replacing(path) as f:  # whole, and never through a link planted at its name
            fig.savefig(f, format=fmt, dpi=100, metadata=_metadata(fmt))
        written.append(path)
    return written


def prediction_chart(task: str, predictions: Sequence[Prediction]) -> Figure:
    """`mlbench predict --chart`: the predicted step time (its range shaded) and throughput
    against the worker count, a line per optimizer and network: the optimizer's colour, the
    network's line style (docs/predict.md). Step times on a log axis: a ring's latency steps
    and a slow link differ by orders of magnitude."""
    with needs("charts"):
        import matplotlib  # noqa: F401

    fig = _new_figure(figsize=(10, 4.2))
    step_ax, rate_ax = fig.subplots(1, 2)
    optimizers = list(dict.fromkeys(p.optimizer for p in predictions))
    networks = list(dict.fromkeys(p.link.network for p in predictions))
    counts = sorted({p.workers for p in predictions})
    unit = throughput_unit(task)
    for p_index, optimizer in enumerate(optimizers):
        for n_index, network in enumerate(networks):
            line = sorted((p for p in predictions if p.optimizer == optimizer and p.link.network == network),
                          key=lambda p: p.workers)
            if not line:
                continue
            label = optimizer if len(networks) == 1 else f"{optimizer}, {network}"
            style = dict(color=_colour(p_index), linestyle=_STYLES[n_index % len(_STYLES)], marker=_MARKERS[0], ms=4)
            x = [p.workers for p in line]
            step_ax.plot(x, [p.step_s for p in line], label=label, **style)
            step_ax.fill_between(x, [p.range_s[0] for p in line], [p.range_s[1] for p in line],
                                 color=_colour(p_index), alpha=0.12, lw=0)
            rate_ax.plot(x, [p.throughput for p in line], **style)
    step_ax.set_yscale("log")
    step_ax.set_ylabel("predicted seconds per step")
    step_ax.set_title("step time (shaded: the compute's quartiles to the slowest rank)", fontsize=9)
    rate_ax.set_ylabel(f"predicted {unit}")
    rate_ax.set_title("throughput, all workers", fontsize=9)
    for ax in (step_ax, rate_ax):
        _worker_axis(ax, counts, log=True)
        ax.grid(alpha=0.3)
    handles, texts = step_ax.get_legend_handles_labels()
    if handles:
        _legend(fig, handles, texts)
    _suptitle(fig, f"{task}: predicted step time and throughput per worker count "
                   f"({', '.join(networks)})")
    return fig


def chart_names(comparison: Comparison) -> tuple[str, ...]:
    """The figures `mlbench charts` draws of ``comparison``, in the order it writes them."""
    if is_sweep(comparison):
        return SWEEP_CHART_NAMES
    return (CHART_NAMES + (("network",) if network_axis(comparison) else ())
            + (("faults",) if had_faults(comparison) else ()))


def chart_figures(comparison: Comparison) -> dict[str, Figure]:
    """Every figure of :func:`chart_names`, drawn, by name."""
    drawers = {"speedup": speedup_chart, "cost": cost_chart, "loss-accuracy": loss_accuracy_chart,
               "communication": communication_chart, "network": network_chart, "bandwidth": bandwidth_chart,
               "faults": fault_chart}
    return {name: drawers[name](comparison) for name in chart_names(comparison)}


def family_labels(families: Sequence[Family]) -> dict[Family, str]:
    """Legend text per family: what tells the families apart (all of it when there is one),
    with every fingerprint setting they differ in (``opt.period 8``)."""
    fields = {
        "framework": lambda f: f.framework,
        "division": lambda f: f"{f.division} division",
        "optimizer": lambda f: f.optimizer,
        "model": lambda f: f"model {f.model}" if f.model else "the task's model",
        "hardware": lambda f: f.hardware,
        "goal": lambda f: (f"goal {task_metric(f.task).describe_goal(f.goal)}" if f.goal is not None
                           else "no goal"),
        "network": lambda f: f"network {f.network}" if f.network else "network not emulated",
        "faults": lambda f: f.faults or "no faults",
    }
    varying = [k for k, text in fields.items() if len({text(f) for f in families}) > 1]
    settings = [key for key in differing_keys([dict(f.fingerprint) for f in families]) if key not in NAMED_KEYS]
    shown = varying or ([] if settings else ["optimizer", "hardware"])
    if "framework" not in shown and not only_pytorch(families):  # a port is always named
        shown = ["framework", *shown]
    return {f: ", ".join([*(fields[k](f) for k in shown), *(f"{key} {f.setting(key)}" for key in settings)])
            for f in families}


def only_pytorch(families: Sequence[Family]) -> bool:
    """Whether every family trained with PyTorch, the default that legends leave unsaid; a
    figure of any other framework's runs names it in every legend entry, even a figure of one
    family."""
    return all(f.framework == DEFAULT_FRAMEWORK for f in families)


def speedup_chart(comparison: Comparison) -> Figure:
    fig, ax = _figure()
    families = comparison.families()
    labels = family_labels(list(families))
    counts = sorted({g.workers for g in comparison.groups})
    bases = set()
    for i, (family, groups) in enumerate(families.items()):
        # (workers, speedup, its range): the two are set together (compare._add_speedup)
        points = [(g.workers, g.speedup, g.speedup_range) for g in groups
                  if g.speedup is not None and g.speedup_range is not None]
        if not points:
            continue
        x = [k for k, _, _ in points]
        y = [s for _, s, _ in points]
        low = [s - r[0] for _, s, r in points]
        high = [r[1] - s for _, s, r in points]
        measure = "time to goal" if family.metric == TIME_TO_ACCURACY else family.metric
        ax.errorbar(x, y, yerr=[low, high], marker=_marker(i), linestyle=_style(i), capsize=4, color=_colour(i),
                    label=f"{labels[family]} ({measure})")
        bases.add(min(g.workers for g in groups))
    for base in sorted(bases):  # one line per base, not per family: twelve would hide the data
        ideal_x = [k for k in counts if k >= base]
        ax.plot(ideal_x, [k / base for k in ideal_x], **_IDEAL)
    _worker_axis(ax, counts, log=True)
    ax.set_ylabel("speedup (x)")
    _title(fig, ax, f"{comparison.task}: speedup relative to the fewest workers")
    if bases:
        from matplotlib.lines import Line2D

        base = min(bases)
        start = (f"from {base} worker{'s' if base > 1 else ''}" if len(bases) == 1
                 else "from each line's fewest workers")
        handles, texts = ax.get_legend_handles_labels()
        _legend(fig, [*handles, Line2D([], [], **_IDEAL)],
                [*texts, f"ideal (linear) {start}"])
        _footnote(fig, "median of the repeats; bars: slowest to fastest run")
    else:
        _empty(ax, "no run reached its goal: no time to goal to compare")
    return fig


def cost_chart(comparison: Comparison) -> Figure:
    fig, ax = _figure()
    families = {f: gs for f, gs in comparison.families().items() if f.metric == TIME_TO_ACCURACY}
    labels = family_labels(list(families))
    counts = sorted({g.workers for gs in families.values() for g in gs})
    width = 0.8 / max(1, len(families))
    drawn = False
    for i, (family, groups) in enumerate(families.items()):
        bars = [(g.workers, g.cost) for g in groups if g.cost is not None and math.isfinite(g.cost.median)]
        if not bars:
            continue
        drawn = True
        x = [counts.index(k) + (i - (len(families) - 1) / 2) * width for k, _ in bars]
        y = [cost.median for _, cost in bars]
        err = [[cost.median - cost.minimum for _, cost in bars],
               [cost.maximum - cost.median if math.isfinite(cost.maximum) else 0.0
                for _, cost in bars]]
        ax.bar(x, y, width=width, yerr=err, capsize=3, color=_colour(i), hatch=_hatch(i), edgecolor="white",
               label=labels[family])
    ax.set_xticks(range(len(counts)), [str(k) for k in counts])
    ax.set_xlabel("number of workers")
    ax.set_ylabel("cost to goal (USD)")
    _title(fig, ax, f"{comparison.task}: cost of training to the goal")
    if comparison.usd_per_node_hour is None:
        price = "no price given: local runs cost $0 (use --price-per-hour or --instance)"
    else:
        price = f"at ${comparison.usd_per_node_hour:.4g} per node-hour"
    if drawn:
        _legend(fig, *ax.get_legend_handles_labels())
        _footnote(fig, f"node-seconds to the goal (evaluation included) {price}")
    else:
        _empty(ax, "no run reached its goal: no cost to goal")
    return fig


def loss_accuracy_chart(comparison: Comparison) -> Figure:
    """Training loss and the goal metric (test accuracy, perplexity, BLEU: the task's) over
    training time, with the goal as the target line. Of several families, the colour and line
    style are the family's and the marker the worker count's, and the legend names each once
    (36 entries of family and worker count would not fit); of one, the colour is the worker
    count's."""
    from matplotlib.lines import Line2D

    fig = _new_figure(figsize=(10, 4.2))
    loss_ax, acc_ax = fig.subplots(1, 2)
    metric = task_metric(comparison.task)
    families = comparison.families()
    labels = family_labels(list(families))
    multi = len(families) > 1 or not only_pytorch(list(families))
    counts = sorted({g.workers for groups in families.values() for g in groups})
    goals = set()
    keys: dict[str, Line2D] = {}  # legend entries of several families: each family, then each worker count
    for f_index, (family, groups) in enumerate(families.items()):
        for g in groups:
            w_index = counts.index(g.workers)
            colour = _colour(f_index if multi else w_index)
            style = _style(f_index) if multi else "-"
            marker = _MARKERS[w_index % len(_MARKERS)] if multi else _marker(f_index)
            label = f"{g.workers} worker{'s' if g.workers > 1 else ''}"
            if multi:
                keys.setdefault(labels[family], Line2D([], [], color=colour, linestyle=style, lw=1.6))
            lead = representative(g)
            for run in g.runs:
                alpha, lw = (1.0, 1.6) if run is lead else (0.35, 0.9)
                name = label if run is lead and not multi else None
                if run.losses:
                    t, loss = zip(*run.losses)
                    loss_ax.plot(t, loss, style, color=colour, alpha=alpha, lw=lw, label=name,
                                 marker=marker if multi else "", ms=3, markevery=max(1, len(t) // 8))
                evals = [(e["time"], e[metric.name]) for e in run.summary.evaluations
                         if "time" in e and metric.name in e]
                if evals:
                    t, acc = zip(*evals)
                    acc_ax.plot(t, [metric.display(a) for a in acc], style, marker=marker, ms=3,
                                color=colour, alpha=alpha, lw=lw, label=name)
        if family.goal is not None:
            goals.add(family.goal)
    if multi:
        for w_index, k in enumerate(counts):
            keys[f"{k} worker{'s' if k > 1 else ''}"] = Line2D([], [], color="#444444", linestyle="",
                                                               marker=_MARKERS[w_index % len(_MARKERS)], ms=5)
    for goal in sorted(goals):
        acc_ax.axhline(metric.display(goal), color="black", lw=1.0, label=f"target {metric.format(goal)}")
    loss_ax.set_title("training loss vs training time")
    loss_ax.set_xlabel("training time (s)")
    loss_ax.set_ylabel("training loss")
    _title(fig, acc_ax, f"{metric.title} vs training time", columns=2)
    acc_ax.set_xlabel("training time (s)")
    acc_ax.set_ylabel(metric.axis_label)
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
    # the families and worker counts (or the worker counts' lines, with the metric's markers), the target last
    entries = {**keys, **{text: handle for ax in (loss_ax, acc_ax)
                          for handle, text in zip(*ax.get_legend_handles_labels())}}
    if entries:
        _legend(fig, list(entries.values()), list(entries))
    _suptitle(fig, f"{comparison.task}: loss and {metric.title} over time per worker count "
              "(bold: median run; faint: other repeats)")
    return fig


def communication_chart(comparison: Comparison) -> Figure:
    """The split of step time per worker count, a stacked bar per family in its colour:
    computation solid, communication light and hatched, the ratio of the two above it."""
    from matplotlib.patches import Patch

    fig, ax = _figure()
    families = comparison.families()
    labels = family_labels(list(families))
    named = len(families) > 1 or not only_pytorch(list(families))
    counts = sorted({g.workers for g in comparison.groups})
    width = 0.8 / max(1, len(families))
    keys: list[tuple[Patch, str]] = []
    for i, (family, groups) in enumerate(families.items()):
        bars = [g for g in groups if g.communication_share is not None]
        if not bars:
            continue
        x = [counts.index(g.workers) + (i - (len(families) - 1) / 2) * width for g in bars]
        comm = [100 * (g.communication_share or 0.0) for g in bars]
        comp = [100 - c for c in comm]
        computation, communication = _split_styles(_colour(i), _hatch(i))
        ax.bar(x, comp, width=width, **computation)
        ax.bar(x, comm, width=width, bottom=comp, **communication)
        if named:
            keys.append((Patch(**computation), labels[family]))
        for xx, g in zip(x, bars):
            ratio = g.communication_seconds / g.compute_seconds if g.compute_seconds else float("inf")
            ax.text(xx, 101, f"{ratio:.2f}", ha="center", va="bottom", fontsize=8 if len(families) < 4 else 7,
                    rotation=0 if len(families) < 4 else 90)
    ax.set_xticks(range(len(counts)), [str(k) for k in counts])
    ax.set_ylim(0, 112)
    ax.set_xlabel("number of workers")
    ax.set_ylabel("share of step time (%)")
    _title(fig, ax, f"{comparison.task}: communication vs computation time")
    if ax.patches:
        computation, communication = _split_styles(_colour(0) if not named else "#777777", "")
        keys += [(Patch(**computation), "computation"), (Patch(**communication), "communication")]
        _legend(fig, [key for key, _ in keys], [text for _, text in keys])
        _footnote(fig, "all workers of all runs; number above a bar: communication/computation ratio")
    else:
        _empty(ax, "no phase times recorded (runs made with --no-timing)")
    return fig


def _split_styles(colour: str, hatch: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The bar styles of computation (solid ``colour``) and communication (light, hatched in it)."""
    return ({"facecolor": colour, "edgecolor": "white", "linewidth": 0.5, "hatch": hatch},
            {"facecolor": _light(colour), "edgecolor": colour, "linewidth": 0.5, "hatch": "////"})


def network_axis(comparison: Comparison) -> str | None:
    """The network setting the emulated runs differ in, the x axis of the network figure:
    ``"bandwidth"`` (first), ``"latency"``, or None when they do not differ in either."""
    emulated = [g.family for g in comparison.groups if g.family.network]
    if len({f.bandwidth_bps for f in emulated if f.bandwidth_bps}) > 1:
        return "bandwidth"
    if len({f.latency_s for f in emulated}) > 1:
        return "latency"
    return None


def network_chart(comparison: Comparison) -> Figure:
    """Time to accuracy, time per epoch and bytes per step against the emulated bandwidth (or,
    for runs at one bandwidth, the latency), a line per optimizer.

    The question of the network dimension: at which bandwidth or latency does a compressing
    optimizer start to pay? Runs on the network as it was (not emulated) are left out.
    """
    fig = _new_figure(figsize=(14, 4.2))
    tta_ax, epoch_ax, bytes_ax = fig.subplots(1, 3)
    axis = network_axis(comparison) or "bandwidth"
    lines: dict[tuple, list[tuple[float, Group]]] = {}  # (x, group) per line
    for g in comparison.groups:
        f = g.family
        setting = f.bandwidth_bps if axis == "bandwidth" else f.latency_s if f.network else None
        if setting is None or (axis == "bandwidth" and not setting):
            continue
        # what the label says besides the axis' setting (the rate comes first in a label)
        first, _, rest = f.network.partition(", ")
        key = (f.optimizer, g.workers, f.division, f.hardware, f.goal, rest if axis == "bandwidth" else first,
               f.framework)
        lines.setdefault(key, []).append((setting, g))
    varying = [i for i in range(7) if len({k[i] for k in lines}) > 1]
    if 6 not in varying and any(k[6] != DEFAULT_FRAMEWORK for k in lines):  # a port is always named
        varying.append(6)
    scale, ticks = (1e6, format_rate) if axis == "bandwidth" else (1e-3, format_time)
    for i, (key, points) in enumerate(lines.items()):
        points.sort(key=lambda p: p[0])
        groups = [g for _, g in points]
        x = [value / scale for value, _ in points]
        label = ", ".join(_line_text(key, j, comparison.task) for j in ([0] + [j for j in varying if j]))
        tta = [g.time_to_accuracy.median for g in groups]
        if any(math.isfinite(t) for t in tta):
            tta_ax.plot([a for a, t in zip(x, tta, strict=True) if math.isfinite(t)],
                        [t for t in tta if math.isfinite(t)],
                        marker=_marker(i), linestyle=_style(i), color=_colour(i), label=label)
        for ax, series in ((epoch_ax, [_median_epoch_seconds(g) for g in groups]),
                           (bytes_ax, [g.bytes_per_step for g in groups])):
            if any(v is not None for v in series):
                ax.plot([a for a, v in zip(x, series, strict=True) if v is not None],
                        [v for v in series if v is not None], marker=_marker(i), linestyle=_style(i),
                        color=_colour(i), label=label)
    values = sorted({value for points in lines.values() for value, _ in points})
    for ax, title, ylabel in ((tta_ax, f"time to goal vs {axis}", "time to goal (s)"),
                              (epoch_ax, f"time per epoch vs {axis}", "training seconds per epoch"),
                              (bytes_ax, f"bytes per step vs {axis}", "bytes each worker sent per step")):
        if axis == "bandwidth":
            ax.set_xscale("log")
            ax.set_xlim(values[0] / scale / 1.5, values[-1] / scale * 1.5)
            ax.set_xlabel("emulated bandwidth per worker and direction")
        else:
            ax.set_xlabel("emulated one-way latency between workers")
        slant = {"rotation": 45, "ha": "right", "rotation_mode": "anchor"} if len(values) > 4 else {}
        ax.set_xticks([v / scale for v in values], [ticks(v) if v else "0" for v in values], **slant)
        ax.minorticks_off()
        ax.set_ylabel(ylabel)
        _title(fig, ax, title, columns=3)
        ax.grid(alpha=0.3)
        if not ax.get_legend_handles_labels()[0]:
            _empty(ax, "no run reached its goal" if ax is tta_ax else "no finished epoch" if ax is epoch_ax
                   else "no step")
    entries = {text: handle for ax in (tta_ax, epoch_ax, bytes_ax)
               for handle, text in zip(*ax.get_legend_handles_labels())}
    if entries:
        _legend(fig, list(entries.values()), list(entries))
    _suptitle(fig, f"{comparison.task}: the network dimension (median of the repeats)")
    return fig


def _line_text(key: tuple, index: int, task: str) -> str:
    optimizer, workers, division, hardware, goal, rest, framework = key
    return [optimizer, f"{workers} worker{'s' if workers > 1 else ''}", f"{division} division", hardware,
            f"goal {task_metric(task).format(goal)}" if goal is not None else "no goal",
            rest or "no latency", framework][index]


def bandwidth_chart(comparison: Comparison) -> Figure:
    """Task 0a: the headline bandwidth (bus; algorithm on one worker) against the message size in
    bytes, log-log, a line per worker count (and network, where runs differ in it) and dtype;
    medians of the repeats. The size at which the curve flattens is where the link is full."""
    fig, ax = _figure()
    emulated = differs_in_network(comparison)
    metrics = {g.metric.title for g in comparison.groups if g.metric is not None}
    drawn = False
    for i, g in enumerate(comparison.groups):
        sizes = {(row["dtype"], int(row["elements"])): int(row["bytes"])
                 for run in g.runs if run.sweep for row in run.sweep.rows}
        values = sweep_bandwidth(g)
        for j, dtype in enumerate(dict.fromkeys(dtype for dtype, _ in values)):
            points = sorted((sizes[key], value) for key, value in values.items()
                            if key[0] == dtype and value > 0)
            if not points:
                continue
            drawn = True
            ax.plot([b for b, _ in points], [v for _, v in points], _STYLES[j % len(_STYLES)],
                    marker=_marker(i), ms=3, color=_colour(i), label=f"{group_label(g, emulated)}, {dtype}")
    ax.set_xscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel(" / ".join(sorted(metrics)) + " (GB/s)" if metrics else "bandwidth (GB/s)")
    _title(fig, ax, f"{comparison.task}: all-reduce bandwidth vs message size")
    if drawn:
        ax.set_yscale("log")
        _legend(fig, *ax.get_legend_handles_labels())
        _footnote(fig, "nccl-tests' bus bandwidth (algorithm bandwidth on one worker); median of the repeats")
    else:
        _empty(ax, "no measurement above 0 GB/s")
    return fig


@dataclass(frozen=True)
class FaultTimeline:
    """One run on its wall clock, in seconds from the workers' start (the origin of goodput's
    wall time): rank 0's training loss as it was logged, each fault as it was applied and each
    restart of the group. The wall clock, not the training time, because a restarted group
    continues the training time of its checkpoint: on it, the work lost and redone would overlap
    and the time the recovery took would not show."""

    loss: list[tuple[float, float]]
    faults: list[tuple[float, str, bool]]          # (seconds, "kill of rank 1", missed)
    restarts: list[tuple[float, float | None]]     # (seconds of the verdict, seconds to recover)


def fault_timeline(run: RunResult) -> FaultTimeline:
    """:class:`FaultTimeline` of a run, from its events and run.json's ``faults`` section."""
    start = run.record.started_at or 0.0
    loss = [(float(e["time"]) - start, float(e["value"])) for e in read_run_events(run.record.run_dir)
            if e["name"] == "train/loss" and e.get("rank", 0) == 0]
    document = RunDocument.load_or_none(run.record.run_dir)
    section: dict[str, Any] = (document.extra.get(FAULTS_SECTION) if document is not None else None) or {}
    faults = [(float(e["time"]) - start, f"{e.get('kind')} of rank {e.get('rank')}", bool(e.get("missed")))
              for e in section.get("events") or [] if isinstance(e, dict) and _is_number(e.get("time"))]
    restarts = [(float(r["at"]) - start, float(r["recovered_s"]) if _is_number(r.get("recovered_s")) else None)
                for r in section.get("restarts") or [] if isinstance(r, dict) and _is_number(r.get("at"))]
    return FaultTimeline(loss, faults, restarts)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fault_chart(comparison: Comparison) -> Figure:
    """A timeline per run with faults (at most :data:`MAX_TIMELINES`): its training loss over the
    wall clock, a red line at each applied fault (dotted: missed, its worker was being restarted)
    and, per restart, a shaded span from the verdict to every rank's first step past the
    checkpoint (a line only, when it never got that far)."""
    runs = [run for g in comparison.groups for run in g.runs if run.had_faults]
    shown = runs[:MAX_TIMELINES]
    fig = _new_figure(figsize=(8, 1.2 + 2.4 * max(1, len(shown))))
    axes = fig.subplots(max(1, len(shown)), 1, squeeze=False)[:, 0]
    for ax, run in zip(axes, shown):
        timeline = fault_timeline(run)
        if timeline.loss:
            t, loss = zip(*timeline.loss)
            ax.plot(t, loss, color=_colour(0), lw=1.4, label="training loss (rank 0)")
        for i, (at, recovered) in enumerate(timeline.restarts):
            label = "restart: verdict to recovery" if i == 0 else None
            if recovered is None:
                ax.axvline(at, color="#ff7f0e", lw=1.2, label=label)
            else:
                ax.axvspan(at, at + recovered, color="#ff7f0e", alpha=0.25, lw=0, label=label)
        for i, (at, what, missed) in enumerate(timeline.faults):
            ax.axvline(at, color="#d62728", lw=1.2, linestyle=":" if missed else "-",
                       label="fault" if i == 0 else None)
            ax.text(at, 0.98, f" {what}{' (missed)' if missed else ''}", transform=ax.get_xaxis_transform(),
                    rotation=90, va="top", ha="left", fontsize=7, color="#d62728")
        faults = run.faults
        goodput = f"goodput {100 * faults['goodput']:.1f}%" if faults.get("goodput") is not None else "no goodput"
        title = (f"run {run.record.id}, {run.record.workers} workers: {goodput}, {recoveries(faults)}, "
                 f"{faults.get('lost_steps', 0)} steps lost")
        ax.set_title(_wrapped(title, fig.get_figwidth() - 1.0, 9), fontsize=9)
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("wall time since the workers' start (s)")
    entries = {text: handle for ax in axes for handle, text in zip(*ax.get_legend_handles_labels())}
    if entries:  # one legend for every timeline: their marks are the same
        _legend(fig, list(entries.values()), list(entries))
    if not shown:
        _empty(axes[0], "no run with faults")
    if len(runs) > len(shown):
        _footnote(fig, f"the first {len(shown)} of {len(runs)} runs with faults")
    _suptitle(fig, f"{comparison.task}: faults and restarts on the training loss")
    return fig


def _median_epoch_seconds(group: Group) -> float | None:
    values = sorted(r.result.train_time / r.result.epochs for r in group.runs
                    if r.result.train_time and r.result.epochs)
    return values[(len(values) - 1) // 2] if values else None


# -- helpers ------------------------------------------------------------------------------------
def _new_figure(figsize: tuple[float, float]) -> Figure:
    """A matplotlib figure on the Agg canvas, which measures its text (imported here: matplotlib
    is the ``charts`` extra)."""
    with needs("charts"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _figure() -> tuple[Figure, Axes]:
    fig = _new_figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    ax.grid(alpha=0.3)
    return fig, ax


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def _style(i: int) -> Literal["-", "--", ":", "-."]:
    """The line style of line ``i``: solid for the first len(COLOURS), another for each round after."""
    return _STYLES[i // len(COLOURS) % len(_STYLES)]


def _marker(i: int) -> str:
    """The marker of line ``i``: the same for the first len(COLOURS), another for each round after."""
    return _MARKERS[i // len(COLOURS) % len(_MARKERS)]


def _hatch(i: int) -> str:
    """The hatch of bar ``i``: none for the first len(COLOURS), another for each round after."""
    return _HATCHES[i // len(COLOURS) % len(_HATCHES)]


def _light(colour: str) -> tuple[float, float, float]:
    """``colour`` mixed 60:40 with white."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return (0.4 * r + 0.6, 0.4 * g + 0.6, 0.4 * b + 0.6)


def _legend(fig: Figure, handles: Sequence[Any], texts: Sequence[str]) -> None:
    """The figure's legend below its plots, in as many columns as the figure's width holds, its
    entries wrapped at the line of :data:`_LEGEND_LINES` that makes it the shortest (long labels
    in one wide column, short ones in many). The figure grows by the legend's height, so the
    plots keep theirs: twelve families' entries beside the plots once made a figure wider than a
    screen."""
    room = fig.bbox.width - 0.2 * fig.dpi
    best: tuple[float, int, list[str]] | None = None
    for line in _LEGEND_LINES:
        wrapped = [textwrap.fill(text, line, break_long_words=False, break_on_hyphens=False) for text in texts]
        one = _legend_box(fig, handles, wrapped, 1)
        columns = max(1, min(len(wrapped), int(room // one.width)))   # from the widest entry's column
        while columns > 1 and _legend_box(fig, handles, wrapped, columns).width > room:
            columns -= 1
        height = _legend_box(fig, handles, wrapped, columns).height
        if best is None or height < best[0]:
            best = (height, columns, wrapped)
    assert best is not None
    height, columns, wrapped = best
    fig.legend(handles, wrapped, loc="outside lower center", ncols=columns, fontsize=_LEGEND_FONTSIZE)
    fig.set_figheight(fig.get_figheight() + height / fig.dpi)


def _legend_box(fig: Figure, handles: Sequence[Any], texts: Sequence[str], columns: int) -> Bbox:
    """The box (pixels) of the figure's legend of ``texts`` in ``columns``, measured and removed."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas of _new_figure
    legend = fig.legend(handles, texts, loc="outside lower center", ncols=columns, fontsize=_LEGEND_FONTSIZE)
    box = legend.get_window_extent(renderer)
    legend.remove()
    return box


def _title(fig: Figure, ax: Axes, text: str, columns: int = 1) -> None:
    """The axes' title, wrapped into lines as wide as an axes of a row of ``columns``."""
    ax.set_title(_wrapped(text, fig.get_figwidth() / columns - 1.0, float(ax.title.get_fontsize())))


def _suptitle(fig: Figure, text: str) -> None:
    """The figure's title, centred over its plots, wrapped to their width."""
    fig.suptitle(_wrapped(text, fig.get_figwidth() - 0.4, 11), fontsize=11)


def _wrapped(text: str, inches: float, points: float) -> str:
    """``text`` in lines of at most ``inches``, at 0.6 em a character (wider than the mean)."""
    return textwrap.fill(text, max(20, int(inches * 72 / (0.6 * points))), break_long_words=False)


def _worker_axis(ax: Axes, counts: list[int], log: bool) -> None:
    if log and counts and max(counts) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(k) for k in counts])
    ax.minorticks_off()
    ax.set_xlabel("number of workers")


def _footnote(fig: Figure, text: str) -> None:
    """A note under the last axes' x-label: part of the axes, so the layout keeps it above the
    legend below them (as the figure's x-label, the legend covered it)."""
    ax = fig.axes[-1]
    ax.annotate(text, xy=(0.5, 0.0), xycoords=ax.xaxis.label, xytext=(0, -3), textcoords="offset points",
                ha="center", va="top", fontsize=7, color="#555555")


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10,
            color="#555555", wrap=True)


def representative(group: Group) -> RunResult:
    """The run whose time to accuracy is the group's median (a run that missed counts as slowest)."""
    ranked = sorted(group.runs, key=lambda r: math.inf if r.time_to_accuracy is None else r.time_to_accuracy)
    return ranked[(len(ranked) - 1) // 2]


def _metadata(fmt: str) -> dict:
    """No creation date in SVGs, so that the same runs give the same file."""
    return {"Date": None} if fmt == "svg" else {}
