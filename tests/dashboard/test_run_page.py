"""A run's page in Debian's Chromium: its Cancel asks first, as the runs table's does; its curves
are drawn in the palette of the PNG charts; and they can be smoothed (TensorBoard's exponential
moving average) and drawn on a log scale, both kept while live updates redraw them.

The dashboard is the real `mlbench dashboard` command on recorded runs (tests/results/recorded.py)
recorded as running, with no process behind them: cancelling one marks it cancelled, and the
test appends training intervals to one's event file as its worker would, which the dashboard
streams to the open page. What is checked is what the page draws: buttons and controls inside
the viewport, the legend's colours, the values the legend shows under the cursor and where the
cursor's point on a curve is drawn.
"""

from __future__ import annotations

import math

import pytest

from mlbench.results.charts import COLOURS
from mlbench.results.compare import training_curve
from mlbench.results.events import FileSink, read_run_events
from mlbench.results.store import CANCELLED, RUNNING, RunStore
from tests.dashboard.browsing import (LEGEND, accept, box, dismiss_twice, in_viewport, inked, record_running,
                                      requests_to, rgb, screenshot)
from tests.dashboard.conftest import serving
from tests.results.recorded import T0

WIDTHS = {1280: 900, 1920: 1080}
#: the training intervals the growing run has when the page opens, and how many the test adds
FIRST, ADDED = 24, 6


def _interval(sink: FileSink, k: int) -> None:
    """Rank 0's k-th logging interval of 10 steps (0.5 s each) after the recorded two: a loss that
    falls over two decades and jumps up and down by 30% around its trend, and every 4th interval
    an evaluation."""
    step, t = 60 + 10 * k, 10.0 + 0.5 * (k + 1)
    loss = 1.5 * 0.85 ** k * (1.3 if k % 2 else 0.7)

    def emit(name: str, value, at: float = t) -> None:
        sink.write({"time": T0 + at, "rank": 0, "epoch": step / 50, "step": step, "name": name, "value": value})

    emit("train/loss", loss)
    emit("train/steps", 10)
    emit("train/samples", 320)
    emit("train/time", t)
    if k % 4 == 3:
        emit("eval/accuracy", min(0.95, 0.3 + 0.02 * k))
        emit("train/time", t)  # the evaluation's point in training time


def _grow(run_dir, start: int, count: int) -> None:
    sink = FileSink(run_dir, 0)
    for k in range(start, start + count):
        _interval(sink, k)
    sink.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("run-page")
    store = RunStore(base / "home")
    growing = record_running(store, workers=1, task="task1a", name="growing-1w")
    _grow(store.get(growing).run_dir, 0, FIRST)
    with serving(base) as lab:
        lab.growing = growing
        yield lab


def _open(lab, page, run_id: str, width: int) -> None:
    page.set_viewport_size({"width": width, "height": WIDTHS[width]})
    page.goto(f"{lab.base}/runs/{run_id}")
    page.wait_for_selector('#state .badge[data-state="running"]')


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_cancel_on_a_run_page_asks_first_and_nothing_happens_when_dismissed(lab, page, tmp_path, width):
    """The run page's Cancel asks the question of the runs table's Cancel, naming the run;
    dismissed (its keep button, Escape) nothing is sent and the run runs on; accepted, the run is
    cancelled and the page shows it."""
    store = lab.store()
    name = f"cancel-me-{width}"
    run_id = record_running(store, workers=2, name=name)
    _open(lab, page, run_id, width)
    cancel = page.locator("#cancel")
    assert in_viewport(page, box(page, "#cancel"))
    assert inked(screenshot(page, tmp_path / "run-page.png"), box(page, "#cancel"))
    sent = requests_to(page, r"/api/runs/")
    dismiss_twice(page, cancel, run_id, name, sent)
    assert cancel.is_visible() and store.get(run_id).state == RUNNING
    accept(page, cancel, tmp_path / "confirm-cancel.png")
    page.wait_for_selector(f'#state .badge[data-state="{CANCELLED}"]')
    assert store.get(run_id).state == CANCELLED
    assert sent == [f"POST {lab.base}/api/runs/{run_id}/cancel"]
    page.locator("#cancel").wait_for(state="hidden")


def test_the_curves_are_drawn_in_the_charts_palette(lab, page, tmp_path):
    """The goal metric, the training loss and the throughput are drawn in colours of the PNG
    charts' palette (mlbench.results.charts.COLOURS), a different one each on a chart; the goal
    is its black reference line."""
    _open(lab, page, lab.growing, 1280)
    page.wait_for_selector("#chart-time .uplot")
    palette = [rgb(c) for c in COLOURS]
    for chart in ("chart-time", "chart-epoch", "chart-throughput"):
        page.locator(f"#{chart}").scroll_into_view_if_needed()
        entries = [e for e in page.evaluate(LEGEND, chart) if e["label"] != "goal"]
        assert entries, chart
        colours = [e["colour"] for e in entries]
        assert all(c in palette for c in colours), (chart, colours, palette)
        assert len(set(colours)) == len(colours), (chart, colours)
        shot = screenshot(page, tmp_path / f"{chart}.png")
        for entry in entries:  # the marker's left border is drawn in its colour
            left, middle = round(entry["box"]["left"]), round((entry["box"]["top"] + entry["box"]["bottom"]) / 2)
            drawn = {"rgb({}, {}, {})".format(*shot.getpixel((x, middle))) for x in (left, left + 1)}
            assert entry["colour"] in drawn, (chart, entry, drawn)


def _ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased for its first points."""
    out, last = [], 0.0
    for i, value in enumerate(values):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight ** (i + 1)))
    return out


#: The plot area of the time chart, the x and loss values the legend shows under the cursor, and
#: where the cursor's point on the loss curve is drawn.
CURSOR = """() => {
  const chart = document.getElementById('chart-time');
  const rows = [...chart.querySelectorAll('.u-legend .u-series')];
  const at = rows.findIndex((row) => row.querySelector('.u-label').textContent === 'training loss');
  const point = chart.querySelectorAll('.u-cursor-pt')[at - 1].getBoundingClientRect();
  const over = chart.querySelector('.u-over').getBoundingClientRect();
  return {x: rows[0].querySelector('.u-value').textContent, loss: rows[at].querySelector('.u-value').textContent,
          y: (point.top + point.bottom) / 2,
          over: {left: over.left, top: over.top, width: over.width, height: over.height}};
}"""


def _hover(page, time_s: float, x_max: float) -> dict:
    """Moves the mouse over the time chart at ``time_s`` of training (its axis runs from 0 to
    x_max + 4%) and reads the legend and the loss curve's cursor point there."""
    over = page.evaluate(CURSOR)["over"]
    page.mouse.move(over["left"] + over["width"] * time_s / (x_max * 1.04), over["top"] + over["height"] / 2)
    return page.evaluate(CURSOR)


def _check_curve(page, run_dir, weight: float) -> None:
    """The legend shows the smoothed losses under the cursor, and the curve is drawn where a log
    scale puts them: equal ratios of loss, equal distances."""
    points = training_curve(read_run_events(run_dir))
    smoothed = _ema([p["loss"] for p in points], weight)
    x_max = points[-1]["time"]
    seen = {}
    for i in (2, len(points) // 2, len(points) - 1):
        shown = _hover(page, points[i]["time"], x_max)
        assert shown["x"] == f"{points[i]['time']:.1f}s", (shown, points[i])
        assert shown["loss"] == f"{smoothed[i]:.4f}", (i, shown, smoothed[i], points[i]["loss"])
        seen[i] = shown["y"]
    first, middle, last = sorted(seen)
    drawn = (seen[first] - seen[middle]) / (seen[first] - seen[last])
    log = [math.log(v) for v in smoothed]
    logs = (log[first] - log[middle]) / (log[first] - log[last])
    linear = (smoothed[first] - smoothed[middle]) / (smoothed[first] - smoothed[last])
    assert drawn == pytest.approx(logs, abs=0.02) and abs(drawn - linear) > 0.1, (drawn, logs, linear)


def test_smoothing_and_log_scale_are_kept_while_the_curves_grow(lab, page, tmp_path):
    """The smoothing slider (0 to 0.99, TensorBoard's weight) and the log-scale box sit above the
    curves, inside the viewport once scrolled to; set, the time chart shows the smoothed loss on
    a log scale, and after the run has logged more intervals (streamed to the page, which
    redraws) it still does, over the new points too, with the slider and the box as they were."""
    _open(lab, page, lab.growing, 1280)
    run_dir = lab.store().get(lab.growing).run_dir
    page.wait_for_function(f"document.getElementById('chart-time').dataset.training == {FIRST + 2}")
    slider, log_scale = page.locator("#smoothing"), page.locator("#log-scale")
    slider.scroll_into_view_if_needed()
    for control in ("#smoothing", "#log-scale", "#chart-time .u-over"):
        assert in_viewport(page, box(page, control)), control
    assert slider.input_value() == "0" and not log_scale.is_checked()
    slider.focus()
    for _ in range(60):
        page.keyboard.press("ArrowRight")
    assert slider.input_value() == "0.6" and page.inner_text("#smoothing-value") == "0.60"
    log_scale.check()
    page.locator("#chart-time").scroll_into_view_if_needed()
    _check_curve(page, run_dir, 0.6)
    screenshot(page, tmp_path / "smoothed-log.png")

    _grow(run_dir, FIRST, ADDED)
    page.wait_for_function(f"document.getElementById('chart-time').dataset.training == {FIRST + ADDED + 2}")
    assert slider.input_value() == "0.6" and log_scale.is_checked()
    _check_curve(page, run_dir, 0.6)
    screenshot(page, tmp_path / "smoothed-log-grown.png")
