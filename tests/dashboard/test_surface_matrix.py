"""The surface matrix (issue 20, part 5): every task x every surface that shows a result.

Each task's goal metric (accuracy for 1a and 2a, perplexity for 3a, BLEU for 4b, bus bandwidth
for task 0a) must appear by its name, in its unit and with its value on every surface: the result
sentence, `status`, `status RUN`, `status -o json`, `compare`, `charts` (the SVG's text), the
dashboard's runs, run and compare pages in Debian's Chromium, and the MLPerf log through the
official checker's own command line (`download --format mlperf --check`). A perplexity or a BLEU
score is never shown as a percentage anywhere. A training task's throughput is named in what it
counts (images/s, examples/s, tokens/s, target tokens/s) wherever it is shown.

The runs: task 0a is a real 2-worker sweep to 1000 elements, task 2a the dashboard lab's real
light run (tests/dashboard/conftest.py); tasks 1a, 3a and 4b are recorded run documents with
known values (tests/results/recorded.py), read by the same code as real runs.

The framework (issue 23) is shown on the same surfaces: a recorded JAX run of task 2a beside the
lab's real PyTorch run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

import mlbench.cli.commands
from mlbench.cli import cli
from mlbench.network.settings import NetworkSettings
from mlbench.results.outcome import AllreduceResult, read_result
from mlbench.results.report import describe_result
from mlbench.results.store import RunRecord
from mlbench.tasks.metrics import Metric
from tests.helpers import mlbench
from tests.results.recorded import ENVIRONMENT, record_run

TASKS = ("task0a", "task1a", "task2a", "task3a", "task4b")
#: What each training task's throughput counts, as every surface that shows it must name it
UNITS = {"task1a": "images/s", "task2a": "examples/s", "task3a": "tokens/s", "task4b": "target tokens/s"}
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
            assert re.search(rf"throughput\s+\d+ {UNITS[record.task]} \(all workers\)", text), text
            details = json.loads(invoke(lab, "status", record.id, "-o", "json"))
            assert details["summary"]["throughput_unit"] == UNITS[record.task]
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
        if not sweep:
            assert UNITS[record.task].upper() in text.splitlines()[1] and "SAMPLES/S" not in text, text
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
        if not sweep:
            rate = page.inner_text(f'#runs tr[data-id="{record.id}"] [data-col="throughput"]')
            assert re.fullmatch(rf"[\d,]+ {UNITS[record.task]}", rate), rate
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
            rate = page.inner_text('#progress dd[data-fact="throughput"]')
            assert re.fullmatch(rf"[\d,]+ {UNITS[record.task]} \(all workers\)", rate), rate
            assert page.get_attribute("#chart-throughput", "data-axis") == UNITS[record.task]
            assert UNITS[record.task] in page.inner_text("#chart-throughput .u-legend")
        page.screenshot(path=tmp_path / "run.png", full_page=True)
        return page.inner_text("main")
    if name == "dashboard compare":
        page.goto(f"{lab.base}/compare?runs={record.id}")
        column = "PEAK BANDWIDTH" if sweep else "METRIC"
        cell = page.locator(f'table.compare td[data-col="{column}"]')
        cell.wait_for()
        assert cell.inner_text() == case.cell
        if not sweep:
            assert page.locator(f'table.compare td[data-col="{UNITS[record.task].upper()}"]').count() == 1
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
    status_row = next(line for line in invoke(lab, "status", slow.id).splitlines() if line.startswith("network "))
    assert page.inner_text('#spec dd[data-fact="network"]') == status_row.split(None, 1)[1].strip() \
        == "10 Mbit/s, emulated (tc)"   # status RUN's words
    page.goto(f"{lab.base}/compare?runs={slow.id},{fast.id}")
    page.wait_for_selector('table.compare td[data-col="NETWORK"]')
    shown = [h.inner_text() for h in page.locator("#tables h3.family").all()]   # a family's heading each
    assert len(shown) == 2 and page.locator("#bandwidth-table").count() == 1   # and the By bandwidth table
    assert len(set(shown)) == 2 and any("10 Mbit/s" in h for h in shown) and any("100 Mbit/s" in h for h in shown)
    assert sorted(page.locator('td[data-col="NETWORK"]').all_inner_texts()) == ["10 Mbit/s", "100 Mbit/s"]
    page.wait_for_selector("#network-card:not(.hidden)")
    lines = json.loads(page.get_attribute("#chart-network", "data-lines"))
    assert lines == ["2 workers, centralized-sgd, Test CPU (8 cores)"]
    page.screenshot(path=tmp_path / "compare-networks.png", full_page=True)


def test_optimizers_at_two_bandwidths_get_the_by_bandwidth_table_on_the_compare_page(lab, page):
    """`run --optimizer A,B --bandwidth R1,R2`'s table: time to goal per rate, a row per optimizer,
    and the bytes per step, in `compare` and on the dashboard's compare page alike."""
    store = lab.store()
    runs = [record_run(store, workers=2, task="task1a", tta=tta, wall=tta + 5, group_id="matrix",
                       optimizer=optimizer, config={"optimizer": optimizer, "optimizer_options": options},
                       network={**NetworkSettings(bandwidth_bps=rate).to_dict(), "mechanism": "tc"})
            for optimizer, options, by_rate in (("centralized-sgd", {}, ((1e7, 90.0), (1e9, 20.0))),
                                                ("diloco", {"H": "10"}, ((1e7, 30.0), (1e9, 25.0))))
            for rate, tta in by_rate]
    ids = [run.id for run in runs]
    text = invoke(lab, "compare", *ids)
    matrix = text[text.index("By bandwidth"):].splitlines()[3:5]
    cli_rows = sorted(line.split() for line in matrix)
    page.goto(f"{lab.base}/compare?runs={','.join(ids)}")
    page.wait_for_selector("#bandwidth-table")
    headers = page.locator("#bandwidth-table th").all_text_contents()   # as written, before CSS capitals
    assert headers == ["OPTIMIZER", "WORKERS", "TIME TO GOAL 10 Mbit/s", "TIME TO GOAL 1 Gbit/s", "BYTES/STEP"]
    shown = sorted(" ".join(row.locator("td").all_inner_texts()).split()
                   for row in page.locator("#bandwidth-table tbody tr").all())
    assert shown == cli_rows and [row[0] for row in shown] == ["centralized-sgd", "diloco"]
    assert [row[2:4] for row in shown] == [["0:01:30", "20.0s"], ["30.0s", "25.0s"]]


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
    assert "time to goal vs latency" in figure and "emulated one-way latency between workers" in figure
    assert "0.5 ms" in figure and "5 ms" in figure, figure
    page.goto(f"{lab.base}/compare?runs={near.id},{far.id}")
    page.wait_for_selector("#network-card:not(.hidden)")
    assert page.inner_text("#network-title") == "Time to goal vs emulated latency"
    assert json.loads(page.get_attribute("#chart-network", "data-lines")) == [
        "2 workers, centralized-sgd, Test CPU (8 cores)"]


@pytest.fixture(scope="module")
def jax_pair(lab, cases) -> tuple[RunRecord, RunRecord]:
    """A recorded JAX run of task 2a (its environment event names JAX 0.4.30) beside the lab's
    real PyTorch run of the same task."""
    run = record_run(lab.store(), workers=2, task="task2a", tta=12.0, wall=14.0, goal=0.8, final=0.85,
                     framework="jax", environment={**ENVIRONMENT, "framework": "jax", "jax": "0.4.30"},
                     result_extra={"test_samples": 100})
    return run, cases["task2a"].record


def column(table: str, header: str, row_id: str) -> str:
    """The cell of column ``header`` in the row of run ``row_id`` of a plain-text table."""
    lines = table.splitlines()
    start = lines[0].index(header)
    row = next(line for line in lines if line.startswith(row_id))
    return row[start:].split()[0]


@pytest.mark.parametrize("name", SURFACES[1:])
def test_every_surface_names_the_framework_and_never_merges_two(lab, jax_pair, request, tmp_path, name):
    """Issue 23: the framework is a column of `status`, a line of `status RUN` and its JSON, a
    heading of its own in `compare` (never one row with PyTorch's), a legend entry of `charts`
    and of the dashboard's figures, a column and a fact on the dashboard's pages, and the
    MLPerf log's platform names it with its version."""
    run, torch_run = jax_pair
    page = request.getfixturevalue("page") if name.startswith("dashboard") else None
    if name == "status table":
        text = invoke(lab, "status")
        assert column(text, "FRAMEWORK", run.id) == "jax" and column(text, "FRAMEWORK", torch_run.id) == "pytorch"
    elif name == "status RUN":
        assert re.search(r"^framework\s+jax$", invoke(lab, "status", run.id), re.M)
        assert re.search(r"^framework\s+pytorch$", invoke(lab, "status", torch_run.id), re.M)
    elif name == "status -o json":
        rows = {r["id"]: r for r in json.loads(invoke(lab, "status", "-o", "json"))["runs"]}
        assert (rows[run.id]["framework"], rows[torch_run.id]["framework"]) == ("jax", "pytorch")
        ordered = [r["id"] for r in json.loads(invoke(lab, "status", "--sort", "framework", "-o", "json"))["runs"]]
        assert ordered.index(run.id) < ordered.index(torch_run.id)
    elif name == "compare":
        text = invoke(lab, "compare", run.id, torch_run.id)
        headings = [line for line in text.splitlines() if line.startswith("task2a |")]
        assert len(headings) == 2 and headings[0].startswith("task2a | jax | closed division"), text
        assert not headings[1].startswith("task2a | jax"), text
        families = json.loads(invoke(lab, "compare", run.id, torch_run.id, "-o", "json"))["families"]
        assert [(f["framework"], [g["run_ids"] for g in f["groups"]]) for f in families] == [
            ("jax", [[run.id]]), ("pytorch", [[torch_run.id]])]
    elif name == "charts":
        out = tmp_path / "charts"
        invoke(lab, "charts", run.id, torch_run.id, "--out-dir", str(out), "--format", "svg")
        # the legend names each family once (its framework first) and each worker count once
        legend = svg_text(out / "task2a-loss-accuracy.svg").splitlines()
        assert any(line.startswith("jax, ") for line in legend) and any(line.startswith("pytorch, ") for line in legend)
        assert "2 workers" in legend, legend
        invoke(lab, "charts", run.id, "--out-dir", str(out / "one"), "--format", "svg")
        alone = svg_text(out / "one" / "task2a-loss-accuracy.svg").splitlines()
        assert any(line.startswith("jax") for line in alone) and "2 workers" in alone, alone  # alone, still named
    elif name == "dashboard runs":
        page.goto(lab.base + "/")
        cell = page.locator(f'#runs tr[data-id="{run.id}"] [data-col="framework"]')
        cell.wait_for()
        assert cell.inner_text() == "jax"
        assert page.inner_text(f'#runs tr[data-id="{torch_run.id}"] [data-col="framework"]') == "pytorch"
        page.select_option("#filter-framework", "jax")
        page.wait_for_function(f"!document.querySelector('#runs tr[data-id=\"{torch_run.id}\"]')")
        assert page.locator(f'#runs tr[data-id="{run.id}"]').count() == 1
    elif name == "dashboard run":
        page.goto(f"{lab.base}/runs/{run.id}")
        page.wait_for_selector('#spec dd[data-fact="framework"]')
        assert page.inner_text('#spec dd[data-fact="framework"]') == "jax"
        # no table of zeros: the phases are said not to be measured, in status RUN's words
        page.wait_for_selector('#phases[data-note^="not measured"]')
        said = next(line for line in invoke(lab, "status", run.id).splitlines() if line.startswith("Time per phase"))
        assert page.inner_text("#phases").strip() == said == (
            "Time per phase: not measured: a JAX step is one compiled program, whose all-reduce cannot be timed "
            "apart (the step time is the wall clock's).")
    elif name == "dashboard compare":
        page.goto(f"{lab.base}/compare?runs={run.id},{torch_run.id}")
        page.wait_for_selector("#tables h3.family")
        headings = [h.inner_text() for h in page.locator("#tables h3.family").all()]
        assert len(headings) == 2 and headings[0].startswith("task2a | jax | "), headings
        assert len(page.locator("table.compare tbody tr").all()) == 2  # a row per framework
        page.wait_for_function("document.querySelector('#chart-accuracy .u-legend')")
        legend = page.inner_text("#chart-accuracy .u-legend")
        assert "2 workers, jax" in legend and "pytorch" in legend, legend
    elif name == "mllog":
        proc = mlbench("download", run.id, "--format", "mlperf", "--check", "-o", str(tmp_path / "run.zip"),
                       env=lab.env, timeout=300)
        assert proc.returncode == 0 and "compliance checker passes" in proc.stdout, proc.stdout + proc.stderr
        lines = {(body := json.loads(line.split(" ", 1)[1]))["key"]: body
                 for line in (tmp_path / "run.mllog.txt").read_text().splitlines()}
        assert lines["submission_platform"]["value"].endswith(", 2 worker(s), local, JAX 0.4.30")
        assert (lines["mlbench_framework"]["value"], lines["mlbench_framework"]["metadata"]) == (
            "jax", {"release": "JAX 0.4.30"})
    else:
        raise AssertionError(f"no surface {name}")
