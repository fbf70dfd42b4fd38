"""`mlbench charts` of twelve families, measured with matplotlib's own geometry.

Every figure that `charts` writes is drawn on the Agg canvas and measured in pixels: each legend
lies wholly inside the figure and below every plot, each title lies wholly inside the figure, no
legend covers a plotting area, a title or a text (the footnote), every plot keeps a legible size, no two
tick labels touch, and each family has a legend entry of its own colour and style (line style,
or hatch of a bar): twelve colours, then the same colours in other styles.
"""

from __future__ import annotations

import math
import warnings
from itertools import pairwise

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.transforms import Bbox

from mlbench.network.settings import NetworkSettings
from mlbench.results.charts import chart_figures, family_labels
from mlbench.results.compare import Comparison, compare_runs
from mlbench.results.events import FileSink
from mlbench.results.report import group_label
from mlbench.results.store import FINISHED, RunRecord, RunStore
from mlbench.tasks.records import spec_to_dict
from mlbench.tasks.registry import TASKS

from tests.results.recorded import T0, record_run

FAMILIES = 12
#: Mbit/s of the twelve emulated networks
RATES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
#: the smallest plotting area a figure keeps, in inches
MIN_PLOT = (2.0, 1.2)


@pytest.fixture
def store():
    return RunStore()


def optimizers(store: RunStore) -> list[RunRecord]:
    """Twelve optimizers on 1, 2 and 4 workers, two repeats on 2."""
    return [record_run(store, workers=k, tta=5.0 / k, wall=6.0 / k, seed=seed, optimizer=f"optimizer-{i:02d}",
                       communication=tuple(0.2 * (i + 1) for _ in range(k)))
            for i in range(FAMILIES) for k in (1, 2, 4) for seed in ((0, 1) if k == 2 else (0,))]


def networks(store: RunStore) -> list[RunRecord]:
    """Twelve emulated bandwidths on 1 and 2 workers: the network figure too."""
    return [record_run(store, workers=k, tta=5.0 + 100 / rate, wall=6.0 + 100 / rate,
                       network=NetworkSettings(rate * 1e6).to_dict())
            for rate in RATES for k in (1, 2)]


def optimizers_at_two_bandwidths(store: RunStore) -> list[RunRecord]:
    """Twelve optimizers on 2 workers at two bandwidths: 24 families, and 12 lines in the network figure."""
    return [record_run(store, workers=2, tta=5.0 + 100 / rate, wall=6.0 + 100 / rate, optimizer=f"optimizer-{i:02d}",
                       network=NetworkSettings(rate * 1e6).to_dict())
            for i in range(FAMILIES) for rate in (100, 1000)]


def long_labels(store: RunStore) -> list[RunRecord]:
    """Twelve `--set` variants of four settings each on 1, 2 and 4 workers: labels of 80-odd
    characters."""
    def config(i: int) -> dict:
        task = spec_to_dict(TASKS["task1a"])
        task["settings"].update(batch_per_worker=(32, 64, 128)[i % 3], momentum=(0.0, 0.5, 0.9, 0.99)[i // 3],
                                weight_decay=1e-4 * (i + 1), nesterov=bool(i % 2))
        return {"task": task}

    return [record_run(store, workers=k, tta=5.0 / k, wall=6.0 / k, config=config(i),
                       communication=tuple(0.2 * (i + 1) for _ in range(k)))
            for i in range(FAMILIES) for k in (1, 2, 4)]


def faults(store: RunStore) -> list[RunRecord]:
    """Twelve fault schedules on 2 and 4 workers: the figure of fault timelines too."""
    return [record_run(store, workers=k, tta=20.0 / k, wall=40.0 / k, train_time=60.0,
                       inject=(f"kill:rank=1,every={30 + i}s",), on_failure="restart",
                       restarts=({"lost_steps": i, "recovered_s": 2.5},))
            for i in range(FAMILIES) for k in (2, 4)]


def sweeps(store: RunStore) -> list[RunRecord]:
    """Task 0a's all-reduce sweep at twelve emulated bandwidths on 2 workers."""
    return [record_sweep(store, NetworkSettings(rate * 1e6).to_dict()) for rate in RATES]


def record_sweep(store: RunStore, network: dict) -> RunRecord:
    """A finished 2-worker task0a run, written as the workers write one."""
    rows = [{"dtype": "fp32", "elements": n, "bytes": 4 * n, "iterations": 20, "time_s": t,
             "algbw_gbps": 4 * n / t / 1e9, "busbw_gbps": 4 * n / t / 1e9, "wrong": 0}
            for n, t in ((1, 3e-4), (1000, 1e-3), (100_000, 1e-2))]
    record = store.create(task="task0a", workers=2, division="closed",
                          run_json={"task": "task0a", "division": "closed", "changed": [], "network": network,
                                    "config": {"task": spec_to_dict(TASKS["task0a"]), "workers": 2,
                                               "device": "cpu", "seed": 0}})
    sink = FileSink(record.run_dir, 0)
    for i, row in enumerate(rows):
        sink.write({"time": T0 + i, "rank": 0, "epoch": 0, "step": i + 1, "name": "allreduce", "value": row})
    result = {"goal": None, "kind": "allreduce", "backend": "gloo", "device": "cpu", "workers": 2, "rows": rows,
              "wrong": 0, "steps": 60, "epochs": 0.0, "train_time": 0.5, "eval_time": 0.0,
              "stop_reason": "sweep complete"}
    sink.write({"time": T0 + 3, "rank": 0, "epoch": 0, "step": 60, "name": "result", "value": result})
    sink.close()
    store.update(record.id, state=FINISHED, started_at=T0, finished_at=T0 + 3, result=result)
    return store.get(record.id)


def twelve(comparison: Comparison, kind: str) -> list[str]:
    """The texts that name the twelve (or more) in legend entries: the families' labels, the
    groups' (task 0a's lines) or the optimizers (the network figure's lines)."""
    if kind == "group":
        return [group_label(g, emulated=True) for g in comparison.groups]
    if kind == "optimizer":
        return sorted({f.optimizer for f in comparison.families()})
    return list(family_labels(list(comparison.families())).values())


def drawn(fig: Figure):
    """The figure laid out and drawn on the Agg canvas, and its renderer."""
    FigureCanvasAgg(fig)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a layout that could not be applied warns
        fig.canvas.draw()
    return fig.canvas.get_renderer()


def legends(fig: Figure) -> list[Legend]:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]


def titles(fig: Figure) -> list:
    """The figure's title and every axes' titles that have text (matplotlib keeps them private)."""
    texts = [fig._suptitle, *(t for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title))]
    return [t for t in texts if t is not None and t.get_text()]


def inside(inner: Bbox, outer: Bbox, slack: float = 0.5) -> bool:
    return (inner.x0 >= outer.x0 - slack and inner.y0 >= outer.y0 - slack
            and inner.x1 <= outer.x1 + slack and inner.y1 <= outer.y1 + slack)


def overlap(a: Bbox, b: Bbox) -> float:
    """Pixels² the two boxes share."""
    return max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0)) * max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))


def ticks_apart(ax, renderer) -> bool:
    """Whether no two of the axes' x tick labels touch: level ones by their boxes, slanted ones by
    the distance between their parallel baselines against the height of a line."""
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    slanted = [t for t in labels if t.get_rotation() % 180]
    if not slanted:
        boxes = [t.get_window_extent(renderer) for t in labels]
        return not any(overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    x = sorted(ax.transData.transform((value, 0))[0] for value in ax.get_xticks())
    height = max(t.get_fontsize() for t in slanted) * ax.figure.dpi / 72
    sine = abs(math.sin(math.radians(slanted[0].get_rotation())))
    return all((b - a) * sine >= height for a, b in pairwise(x))


def entry_styles(fig: Figure) -> dict[str, set[tuple[str, str]]]:
    """Each legend entry's text and the (colour as hex, style) of its key: a line's line style (of
    an error bar's key, its line's, not its bars'), or a bar's hatch."""
    styles: dict[str, set[tuple[str, str]]] = {}
    for legend in legends(fig):
        # matplotlib keeps an entry's drawn key private: columns of (key, text) rows
        for row in (row for column in legend._legend_handle_box.get_children() for row in column.get_children()):
            key, text = row.get_children()
            artists = key.get_children()
            lines = [a for a in artists if isinstance(a, Line2D)]
            drawn = [a for a in lines if a.get_linestyle() not in ("None", "none", "")] or lines
            if drawn:
                style = (to_hex(drawn[0].get_color()), str(drawn[0].get_linestyle()))
            else:  # a bar's patch
                patch = artists[0]
                style = (to_hex(patch.get_facecolor()), patch.get_hatch() or "")
            styles.setdefault(text.get_text().replace("\n", " "), set()).add(style)
    return styles


#: per scenario: the figures `charts` draws and, per figure, what names the twelve that have a colour
#: each (None: no twelve there, e.g. the fault timelines of six runs)
SCENARIOS = {
    "optimizers": (optimizers, {"speedup": "family", "cost": "family", "loss-accuracy": "family",
                                "communication": "family"}),
    "networks": (networks, {"speedup": "family", "cost": "family", "loss-accuracy": "family",
                            "communication": "family", "network": None}),
    "long labels": (long_labels, {"speedup": "family", "cost": "family", "loss-accuracy": "family",
                                  "communication": "family"}),
    "optimizers at two bandwidths": (optimizers_at_two_bandwidths, {  # 24 families: a colour and a style each
        "speedup": "family", "cost": "family", "loss-accuracy": "family", "communication": "family",
        "network": "optimizer"}),
    "faults": (faults, {"speedup": "family", "cost": "family", "loss-accuracy": "family",
                        "communication": "family", "faults": None}),
    "sweeps": (sweeps, {"bandwidth": "group"}),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_charts_of_twelve_families_keep_legends_below_the_plots_titles_whole_and_a_style_each(
        store, scenario):
    recorded, charts = SCENARIOS[scenario]
    comparison = compare_runs(recorded(store))
    figures = chart_figures(comparison)
    assert list(figures) == list(charts)
    for name, fig in figures.items():
        renderer = drawn(fig)
        where = f"{name}: "
        boxes = [legend.get_window_extent(renderer) for legend in legends(fig)]
        plots = [ax.get_window_extent(renderer) for ax in fig.axes]
        for title in titles(fig):
            box = title.get_window_extent(renderer)
            assert inside(box, fig.bbox), where + f"title {title.get_text()!r} is clipped"
            assert not any(overlap(box, legend) for legend in boxes), where + f"a legend covers {title.get_text()!r}"
        for text in [*fig.texts, *(t for ax in fig.axes for t in ax.texts)]:  # footnotes, ratios, faults' names
            box = text.get_window_extent(renderer)
            assert not any(overlap(box, legend) for legend in boxes), where + f"a legend covers {text.get_text()!r}"
        for legend, box in zip(legends(fig), boxes, strict=True):
            assert inside(box, fig.bbox), where + f"a legend runs off the figure: {box} in {fig.bbox}"
            assert box.y1 <= min(plot.y0 for plot in plots) + 0.5, where + f"a legend is not below the plots: {box}"
            assert min(t.get_fontsize() for t in legend.get_texts()) >= 7, where + "legend text too small"
            for plot in plots:
                assert overlap(box, plot) == 0, where + "a legend covers a plot"
        for ax, plot in zip(fig.axes, plots, strict=True):
            assert plot.width / fig.dpi >= MIN_PLOT[0] and plot.height / fig.dpi >= MIN_PLOT[1], \
                where + f"a plot of {plot.size} px"
            assert ticks_apart(ax, renderer), where + f"tick labels collide: {ax.get_xticklabels()}"
        if charts[name] is None:
            continue
        keys = twelve(comparison, charts[name])
        assert len(keys) >= FAMILIES
        styles = entry_styles(fig)
        assert not [t for t in styles if "time to accuracy" in t], where + "a legend says time to accuracy, not goal"
        family_styles = []
        for key in keys:
            named = [style for text, ss in styles.items() if key in text for style in ss]
            assert named, where + f"no legend entry names {key!r}: {sorted(styles)}"
            assert len(set(named)) == 1, where + f"{key!r} has several colours or styles: {named}"
            family_styles.append(named[0])
        assert len(set(family_styles)) == len(keys), where + f"families share a colour and style: {family_styles}"
