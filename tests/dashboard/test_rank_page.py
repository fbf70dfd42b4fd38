"""A run's page in Debian's Chromium: a metric per worker (one line per rank, or their mean) and
the System chart (each worker's memory and CPU over time), for a real 2-worker run.

The run is a real `mlbench run task2a 2` on synthetic data (40 steps, an interval every 5), served
by the real `mlbench dashboard`. What is checked is what the page draws: the uPlot series of each
chart (their labels and colours, from the legend), that the System chart has the points the
workers recorded (the ``sys/`` events of every interval), and, on a screenshot, that each
line's colour is drawn inside its plot.
"""

from __future__ import annotations

import pytest

from mlbench.results.charts import COLOURS
from mlbench.results.events import read_run_events
from tests.dashboard.browsing import LEGEND, box, in_viewport, rgb, screenshot
from tests.dashboard.conftest import serving
from tests.dashboard.test_run_page import _ema
from tests.helpers import mlbench

STEPS, EVERY = 40, 5


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("rank-page")) as lab:
        mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", str(STEPS), "--log-every", str(EVERY),
                env=lab.env, check=True)
        lab.run = lab.store().list()[0]
        yield lab


def _open(lab, page) -> None:
    page.set_viewport_size({"width": 1360, "height": 900})
    page.goto(f"{lab.base}/runs/{lab.run.id}")
    page.wait_for_selector('#state .badge[data-state="finished"]')
    page.wait_for_selector("#chart-ranks .uplot")


def _series(page, chart: str) -> list[dict]:
    """The chart's uPlot series (their legend entries: label, colour, marker box), x excepted."""
    return page.evaluate(LEGEND, chart)


def _drawn(image, area: dict, colour: str) -> bool:
    """Whether the screenshot has pixels of ``colour`` (within anti-aliasing) inside ``area``."""
    want = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    crop = image.crop((round(area["left"]) + 1, round(area["top"]) + 1, round(area["right"]) - 1,
                       round(area["bottom"]) - 1))
    data = crop.tobytes()
    return any(abs(r - want[0]) + abs(g - want[1]) + abs(b - want[2]) < 40
               for r, g, b in zip(data[0::3], data[1::3], data[2::3]))


def test_a_metric_is_drawn_as_one_line_per_rank_or_as_their_mean(lab, page, tmp_path):
    """"all ranks" draws one line; "per rank" one per worker of the 2-worker run, labelled by
    rank in the palette's colours, each with a point per logging interval; another metric
    (a phase's seconds) keeps the lines per rank."""
    _open(lab, page)
    page.wait_for_selector('#chart-ranks[data-lines="1"]')
    assert [s["label"] for s in _series(page, "chart-ranks")] == ["all ranks"]
    page.select_option("#rank-lines", "each")
    page.wait_for_selector('#chart-ranks[data-mode="each"][data-lines="2"]')
    series = _series(page, "chart-ranks")
    assert [s["label"] for s in series] == ["rank 0", "rank 1"]
    assert [s["colour"] for s in series] == [rgb(COLOURS[0]), rgb(COLOURS[1])]
    intervals = STEPS // EVERY
    assert page.get_attribute("#chart-ranks", "data-points") == str(2 * intervals)

    page.locator("#chart-ranks").scroll_into_view_if_needed()
    plot = box(page, "#chart-ranks .u-over")
    assert in_viewport(page, plot) and in_viewport(page, box(page, "#rank-lines"))
    shot = screenshot(page, tmp_path / "per-rank.png")
    for colour in COLOURS[:2]:
        assert _drawn(shot, plot, colour), colour

    assert "time/forward" in page.eval_on_selector_all("#rank-metric option", "os => os.map((o) => o.value)")
    page.select_option("#rank-metric", "time/forward")
    page.wait_for_selector('#chart-ranks[data-metric="time/forward"][data-mode="each"][data-lines="2"]')
    assert page.get_attribute("#chart-ranks", "data-points") == str(2 * intervals)
    assert [s["label"] for s in _series(page, "chart-ranks")] == ["rank 0", "rank 1"]


def test_the_system_chart_shows_each_workers_memory_and_cpu_over_time(lab, page, tmp_path):
    """The System chart has a memory and a CPU line per worker, with a point per logging
    interval each (what the workers recorded as sys/rss_bytes and sys/cpu_percent), drawn in
    its rank's colour."""
    events = read_run_events(lab.run.run_dir)
    recorded = [e for e in events if e["name"] in ("sys/rss_bytes", "sys/cpu_percent")]
    assert {(e["rank"], e["name"]) for e in recorded} == {(r, n) for r in (0, 1)
                                                         for n in ("sys/rss_bytes", "sys/cpu_percent")}
    assert all(e["value"] > 0 for e in recorded if e["name"] == "sys/rss_bytes")
    _open(lab, page)
    page.wait_for_selector("#chart-system .uplot")
    page.wait_for_function(f"document.getElementById('chart-system').dataset.points == {len(recorded)}")
    series = _series(page, "chart-system")
    assert sorted(s["label"] for s in series) == ["CPU, rank 0", "CPU, rank 1", "memory, rank 0", "memory, rank 1"]
    for entry in series:
        rank = int(entry["label"][-1])
        assert entry["colour"] == rgb(COLOURS[rank]), entry
    page.locator("#chart-system").scroll_into_view_if_needed()
    plot = box(page, "#chart-system .u-over")
    assert in_viewport(page, plot)
    shot = screenshot(page, tmp_path / "system.png")
    for colour in COLOURS[:2]:
        assert _drawn(shot, plot, colour), colour


#: The per-worker chart's plot area and the value its legend shows for its first line.
RANK_CURSOR = """() => {
  const chart = document.getElementById('chart-ranks');
  const rows = [...chart.querySelectorAll('.u-legend .u-series')];
  const over = chart.querySelector('.u-over').getBoundingClientRect();
  return {value: rows[1].querySelector('.u-value').textContent,
          over: {left: over.left, top: over.top, width: over.width, height: over.height}};
}"""


def test_the_page_asks_for_both_charts_in_one_request(lab, page):
    """Each update of the run page reads the run's events once: the per-worker chart's metric
    and the System chart's come in one ``/ranks`` request (``each=``)."""
    asked = []
    page.on("request", lambda request: asked.append(request.url) if "/ranks?" in request.url else None)
    _open(lab, page)
    page.wait_for_selector("#chart-system .uplot")
    assert asked and all("each=sys" in url for url in asked), asked


def test_the_per_worker_chart_follows_the_smoothing_and_the_log_scale(lab, page):
    """Set above the curves, the smoothing weight applies to the per-worker chart too: under the
    cursor at its last point, the legend shows the smoothed mean loss of the ranks; the log-scale
    box redraws it on a log axis (its tick labels then change)."""
    import json

    _open(lab, page)
    answer = page.evaluate(f"fetch('/api/runs/{lab.run.id}/ranks?metric=train/loss&lines=all').then((r) => r.json())")
    values = [v for _, v in answer["lines"][0]["points"]]
    page.wait_for_selector('#chart-ranks[data-lines="1"]')
    slider = page.locator("#smoothing")
    slider.scroll_into_view_if_needed()
    slider.focus()
    for _ in range(60):
        page.keyboard.press("ArrowRight")
    assert slider.input_value() == "0.6"
    page.locator("#chart-ranks").scroll_into_view_if_needed()
    over = page.evaluate(RANK_CURSOR)["over"]
    page.mouse.move(over["left"] + over["width"] - 2, over["top"] + over["height"] / 2)
    expected = format(float(f"{_ema(values, 0.6)[-1]:.4g}"), "g")
    assert page.evaluate(RANK_CURSOR)["value"] == expected != format(float(f"{values[-1]:.4g}"), "g")
    ticks = page.eval_on_selector_all("#chart-ranks .u-axis", "axes => axes.map((a) => a.textContent)")
    page.locator("#log-scale").check()
    page.wait_for_function(f"JSON.stringify([...document.querySelectorAll('#chart-ranks .u-axis')]"
                           f".map((a) => a.textContent)) != {json.dumps(json.dumps(ticks))}")
