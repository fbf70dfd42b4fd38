"""The surface matrix (issue 20, part 5): every task x every surface that shows a result.

Each task's goal metric (accuracy for 1a and 2a, perplexity for 3a, BLEU for 4b, bus bandwidth
for task 0a) must appear by its name, in its unit and with its value on every surface: the result
sentence, `status`, `status RUN`, `status -o json`, `compare`, `charts` (the SVG's text), the
dashboard's runs, run and compare pages in Debian's Chromium, and the MLPerf log through the
official checker's own command line (`download --format mlperf --check`). A perplexity or a BLEU
score is never shown as a percentage anywhere.

The runs: task 0a is a real 2-worker sweep to 1000 elements, task 2a the dashboard lab's real
light run (tests/dashboard/conftest.py); tasks 1a, 3a and 4b are recorded run documents with
known values (tests/results/recorded.py), read by the same code as real runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

import mlbench.cli.commands  # noqa: F401  (registers the commands)
from mlbench.cli import cli
from mlbench.network.settings import NetworkSettings
from mlbench.results.outcome import AllreduceResult, read_result
from mlbench.results.report import describe_result
from mlbench.results.store import RunRecord
from mlbench.tasks.metrics import Metric
from tests.helpers import mlbench
from tests.results.recorded import record_run

TASKS = ("task0a", "task1a", "task2a", "task3a", "task4b")
SURFACES = ("result line", "status table", "status RUN", "status -o json", "compare", "charts",
            "dashboard runs", "dashboard run", "dashboard compare", "mllog")


@dataclass
class Case:
    """One task's run and what its surfaces must show."""

    record: RunRecord
    metric: Metric
    value: float                       # the headline value (final goal metric, 0a's peak)
    goal: float | None

    @property
    def cell(self) -> str:
        """The value in a table of runs: '81.20%', 'ppl 915.69', 'BLEU 21.30', '0.0123 GB/s'."""
        return self.metric.cell(self.value)


@pytest.fixture(scope="module")
def cases(lab) -> dict[str, Case]:
    store = lab.store()
    sweep = mlbench("run", "task0a", "2", "--max-size", "1e3", env=lab.env, timeout=300, check=True)
    assert "Peak bus bandwidth" in sweep.stdout, sweep.stdout + sweep.stderr
    recorded = {
        "task1a": record_run(store, workers=2, task="task1a", tta=30.0, wall=35.0, goal=0.8, final=0.812,
                             result_extra={"test_samples": 10_000}),
        "task3a": record_run(store, workers=2, task="task3a", goal=90.0, final=915.69,
                             result_extra={"test_samples": 217_646}),
        "task4b": record_run(store, workers=2, task="task4b", tta=40.0, wall=44.0, goal=20.0, final=21.3,
                             result_extra={"test_samples": 3_003}),
    }
    runs = {"task0a": next(r for r in store.list() if r.task == "task0a"),
            "task2a": lab.finished_runs()[0], **recorded}
    out = {}
    for task, record in runs.items():
        result = read_result(record.result)
        assert result is not None and result.headline is not None, record
        out[task] = Case(record, result.goal_metric, result.headline, result.goal)
    return out


def invoke(lab, *args: str) -> str:
    """The CLI in this process, on the lab's run store; its output (it must succeed)."""
    result = CliRunner().invoke(cli, list(args), env=lab.env)
    assert result.exit_code == 0, f"mlbench {' '.join(args)}: {result.output}"
    return result.output


def svg_text(path: Path) -> str:
    """The text a figure shows (matplotlib writes each text element's string as a comment)."""
    return "\n".join(re.findall(r"<!-- (.*?) -->", path.read_text()))


def assert_never_a_percentage(case: Case, text: str) -> None:
    """A perplexity or BLEU value (or goal) never appears as a percentage: neither as is with a
    '%' (915.69%) nor scaled by 100 (91569.00%, a goal of 90 as 9000%)."""
    if case.metric.name not in ("perplexity", "bleu"):
        return
    for value in [case.value] + ([case.goal] if case.goal is not None else []):
        for number in (f"{value:.2f}", f"{value:g}", f"{100 * value:.2f}", f"{100 * value:.0f}"):
            assert not re.search(rf"(?<![\d.]){re.escape(number)}\s*%", text), \
                f"{case.metric.title} {number} shown as a percentage in:\n{text}"


def surface(lab, page, tmp_path: Path, case: Case, name: str) -> str:
    """What surface ``name`` shows of the case's run, checked for the metric's name, unit and
    value as that surface renders it; returns the text it shows."""
    record, metric = case.record, case.metric
    sweep = isinstance(read_result(record.result), AllreduceResult)
    if name == "result line":
        text = describe_result(record.result)  # names the metric as "accuracy", "validation perplexity"...
        assert metric.title.removeprefix("test ") in text and metric.format(case.value) in text, text
        return text
    if name == "status table":
        text = invoke(lab, "status")
        row = next(line for line in text.splitlines() if line.startswith(record.id))
        assert "METRIC" in text.splitlines()[0] and case.cell in row, text
        return text
    if name == "status RUN":
        text = invoke(lab, "status", record.id)
        if sweep:
            assert f"Peak {metric.title} {metric.format(case.value)}" in text and "busbw (GB/s)" in text, text
        else:
            last = re.search(rf"last {re.escape(metric.title)}\s+(\S+)", text)
            assert last and last.group(1) == metric.format(case.value), text
        return text
    if name == "status -o json":
        text = invoke(lab, "status", "-o", "json")
        row = next(r for r in json.loads(text)["runs"] if r["id"] == record.id)
        assert row["metric"] == metric.name and row["metric_title"] == metric.title
        assert row["metric_unit"] == ("fraction" if metric.percent else metric.unit)
        assert row["metric_value"] == pytest.approx(case.value) and row["metric_text"] == case.cell
        return text
    if name == "compare":
        text = invoke(lab, "compare", record.id)
        assert case.cell in text, text
        if sweep:
            assert "By message size" in text and f"({metric.title}, {metric.unit})" in text, text
        return text
    if name == "charts":
        out = tmp_path / "charts"
        invoke(lab, "charts", record.id, "--out-dir", str(out), "--format", "svg")
        if sweep:
            text = svg_text(out / f"{record.task}-bandwidth.svg")
            assert f"{metric.title} ({metric.unit})" in text and "message size (bytes)" in text, text
        else:
            text = svg_text(out / f"{record.task}-loss-accuracy.svg")
            assert metric.axis_label in text and f"{metric.title} vs training time" in text, text
            if case.goal is not None:
                assert f"target {metric.format(case.goal)}" in text, text
        return text
    if name == "dashboard runs":
        page.goto(lab.base + "/")
        cell = page.locator(f'#runs tr[data-id="{record.id}"] [data-col="metric"]')
        cell.wait_for()
        assert cell.inner_text() == case.cell
        return page.inner_text("#runs")
    if name == "dashboard run":
        page.goto(f"{lab.base}/runs/{record.id}")
        page.wait_for_function("document.querySelector('#result').textContent.length > 0")
        assert page.inner_text("#result") == describe_result(record.result)
        if sweep:
            page.wait_for_selector("#sweep-card:not(.hidden) #sweep tbody tr")
            assert page.locator("#sweep tbody tr").count() == len(record.result["rows"])
            assert f"{metric.title} {metric.format(case.value)}" in page.inner_text("#sweep-peak")
            assert page.get_attribute("#chart-sweep", "data-lines") == "3"  # fp32, fp16, bf16
            assert page.locator("#training-charts").is_hidden()
            # no training quantities on a measurement's page: no epochs, losses or phase times
            assert page.locator("#phases-card").is_hidden()
            assert page.inner_text(f'#progress dd[data-fact="peak {metric.title}"]') == metric.format(case.value)
            assert page.locator('#progress dd[data-fact="epoch"]').count() == 0
            assert page.locator('#spec dd[data-fact="optimizer"]').count() == 0
        else:
            last = page.inner_text(f'#progress dd[data-fact="last {metric.title}"]')
            assert last == metric.format(case.value)
            if case.goal is not None:
                assert metric.describe_goal(case.goal) in page.inner_text('#spec dd[data-fact="goal"]')
            assert page.inner_text("#chart-time-title").lower().startswith(metric.title.lower())
            page.wait_for_function("Number(document.querySelector('#chart-time').dataset.evaluations) > 0")
            assert page.get_attribute("#chart-time", "data-axis") == metric.axis_label  # drawn on the canvas
            assert metric.title in page.inner_text("#chart-time .u-legend")
        page.screenshot(path=tmp_path / "run.png", full_page=True)
        return page.inner_text("main")
    if name == "dashboard compare":
        page.goto(f"{lab.base}/compare?runs={record.id}")
        column = "PEAK BANDWIDTH" if sweep else "METRIC"
        cell = page.locator(f'table.compare td[data-col="{column}"]')
        cell.wait_for()
        assert cell.inner_text() == case.cell
        if sweep:
            page.wait_for_selector("#sweep-table tbody tr")
            assert page.locator("#sweep-card").is_visible() and page.locator("#training-charts").is_hidden()
        else:
            assert page.inner_text("#chart-accuracy-title").lower().startswith(metric.title.lower())
            assert page.get_attribute("#chart-accuracy", "data-axis") == metric.axis_label  # drawn on the canvas
            if case.goal is not None:
                assert f"target {metric.format(case.goal)}" in page.inner_text("#chart-accuracy .u-legend")
        page.screenshot(path=tmp_path / "compare.png", full_page=True)
        return page.inner_text("#content")
    if name == "mllog":
        proc = mlbench("download", record.id, "--format", "mlperf", "--check", "-o", str(tmp_path / "run.zip"),
                       env=lab.env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "compliance checker passes" in proc.stdout
        lines = [json.loads(line.split(" ", 1)[1]) for line in (tmp_path / "run.mllog.txt").read_text().splitlines()]
        if sweep:
            peak = next(line for line in lines if line["key"] == "mlbench_peak_bandwidth")
            assert peak["value"] == pytest.approx(case.value) and peak["metadata"]["unit"] == metric.unit
        else:
            last = [line for line in lines if line["key"] == "eval_accuracy"][-1]
            assert last["value"] == pytest.approx(case.value)
            assert last["metadata"].get("metric", "accuracy") == metric.name
            assert any(line["key"] == "eval_samples" for line in lines)
        return (tmp_path / "run.mllog.txt").read_text()
    raise AssertionError(f"no surface {name}")


@pytest.mark.parametrize("name", SURFACES)
@pytest.mark.parametrize("task", TASKS)
def test_every_surface_shows_the_metric_of_every_task(lab, cases, request, tmp_path, task, name):
    case = cases[task]
    page = request.getfixturevalue("page") if name.startswith("dashboard") else None  # Chromium only there
    text = surface(lab, page, tmp_path, case, name)
    assert_never_a_percentage(case, text)


def test_runs_on_two_networks_read_apart_everywhere(lab, page, tmp_path):
    """Two task1a runs at 10 and 100 Mbit/s: distinct headings, a network column and a network
    figure in `compare`, `charts` and the dashboard, and the CLI's label on the run's page."""
    store = lab.store()
    slow, fast = (record_run(store, workers=2, task="task1a", tta=tta, wall=tta + 5, group_id="nets",
                             network={**NetworkSettings(bandwidth_bps=rate).to_dict(), "mechanism": "tc"})
                  for rate, tta in ((1e7, 90.0), (1e8, 30.0)))
    text = invoke(lab, "compare", slow.id, fast.id)
    headings = [line for line in text.splitlines() if line.startswith("task1a |")]
    assert len(headings) == 2 and "network 10 Mbit/s" in headings[0] and "network 100 Mbit/s" in headings[1]
    assert "NETWORK" in text
    invoke(lab, "charts", slow.id, fast.id, "--out-dir", str(tmp_path), "--format", "svg")
    legend = svg_text(tmp_path / "task1a-loss-accuracy.svg")
    assert "network 10 Mbit/s" in legend and "network 100 Mbit/s" in legend
    assert "10 Mbit/s" in svg_text(tmp_path / "task1a-network.svg")

    page.goto(f"{lab.base}/runs/{slow.id}")
    page.wait_for_selector('#spec dd[data-fact="network"]')
    assert page.inner_text('#spec dd[data-fact="network"]') == "10 Mbit/s"
    page.goto(f"{lab.base}/compare?runs={slow.id},{fast.id}")
    page.wait_for_selector('table.compare td[data-col="NETWORK"]')
    shown = [h.inner_text() for h in page.locator("#tables h3").all()]
    assert len(set(shown)) == 2 and any("10 Mbit/s" in h for h in shown) and any("100 Mbit/s" in h for h in shown)
    assert sorted(page.locator('td[data-col="NETWORK"]').all_inner_texts()) == ["10 Mbit/s", "100 Mbit/s"]
    page.wait_for_selector("#network-card:not(.hidden)")
    lines = json.loads(page.get_attribute("#chart-network", "data-lines"))
    assert lines == ["2 workers, centralized-sgd, Test CPU (8 cores)"]
    page.screenshot(path=tmp_path / "compare-networks.png", full_page=True)


def test_runs_at_two_latencies_get_the_network_figure_by_latency(lab, page, tmp_path):
    """At one bandwidth and two latencies the network figure puts the latency on its x axis, in
    `charts` and on the compare page; the compare headings name each network."""
    store = lab.store()
    near, far = (record_run(store, workers=2, task="task1a", tta=tta, wall=tta + 5, group_id="latencies",
                            network={**NetworkSettings(bandwidth_bps=1e9, latency_s=delay).to_dict(),
                                     "mechanism": "tc"})
                 for delay, tta in ((5e-4, 20.0), (5e-3, 60.0)))
    text = invoke(lab, "compare", near.id, far.id)
    assert "network 1 Gbit/s, 0.5 ms |" in text and "network 1 Gbit/s, 5 ms |" in text, text
    invoke(lab, "charts", near.id, far.id, "--out-dir", str(tmp_path), "--format", "svg")
    figure = svg_text(tmp_path / "task1a-network.svg")
    assert "time to accuracy vs latency" in figure and "emulated one-way latency between workers" in figure
    assert "0.5 ms" in figure and "5 ms" in figure, figure
    page.goto(f"{lab.base}/compare?runs={near.id},{far.id}")
    page.wait_for_selector("#network-card:not(.hidden)")
    assert page.inner_text("#network-title") == "Time to accuracy vs emulated latency"
    assert json.loads(page.get_attribute("#chart-network", "data-lines")) == [
        "2 workers, centralized-sgd, Test CPU (8 cores)"]
