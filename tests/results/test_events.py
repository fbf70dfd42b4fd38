"""Metric event files with wrongly typed lines: skipped and counted, never a crash."""

from __future__ import annotations

import json
import zipfile

from click.testing import CliRunner

import mlbench.cli.commands  # noqa: F401  (registers the commands)
from mlbench.cli import cli
from mlbench.results.events import parse_lines, read_rank_events, read_run_events
from mlbench.results.store import RunStore
from mlbench.results.summary import summarize
from tests.results.recorded import record_run

GOOD = {"time": 1.0, "rank": 0, "epoch": 0.5, "step": 3, "name": "train/loss", "value": 0.25}
#: one wrong field each: what a hand edit, a buggy tool or a bit flip leaves behind
BAD = [
    {**GOOD, "time": "x"},
    {**GOOD, "time": None},
    {**GOOD, "rank": True},
    {**GOOD, "rank": "0"},
    {**GOOD, "step": 2.5},
    {**GOOD, "step": "x"},
    {**GOOD, "epoch": [1]},
    {**GOOD, "name": 7},
    {**GOOD, "value": None},
    {**GOOD, "value": "0.3"},
    {**GOOD, "name": "eval/accuracy", "value": None},
    {**GOOD, "name": "time/forward", "value": {"s": 1}},
    {**GOOD, "name": "sys/rss_bytes", "value": "1 GB"},
    {**GOOD, "name": "result", "value": None},
    {**GOOD, "name": "environment", "value": "a laptop"},
    {key: value for key, value in GOOD.items() if key != "step"},
]


def test_each_wrongly_typed_line_is_skipped_and_counted(tmp_path):
    lines = [json.dumps(GOOD)] + [json.dumps(e) for e in BAD] + ["{not json", "[1, 2]", "",
                                                                  json.dumps({**GOOD, "step": 4})]
    path = tmp_path / "rank-0.jsonl"
    path.write_text("\n".join(lines) + "\n" + '{"time": 2.0, "ra')  # and a torn last line
    events = read_rank_events(path)
    assert [e["step"] for e in events] == [3, 4]
    assert events.skipped == len(BAD) + 2      # the torn last line is being written: not counted
    # kinds of values that are right stay accepted
    fine = [{**GOOD, "name": "error", "value": "boom"}, {**GOOD, "name": "result", "value": {"steps": 3}},
            {**GOOD, "name": "train/steps", "value": 25}, {**GOOD, "name": "custom", "value": None}]
    assert list(parse_lines(json.dumps(e) for e in fine)) == fine


def test_status_download_and_compare_read_a_run_with_wrongly_typed_lines(tmp_path):
    store = RunStore()
    runs = [record_run(store, workers=k, tta=10.0 / k, wall=12.0 / k) for k in (1, 2)]
    with open(runs[1].run_dir / "events" / "rank-0.jsonl", "a") as f:
        for event in BAD:
            f.write(json.dumps(event) + "\n")
    assert read_run_events(runs[1].run_dir).skipped == len(BAD)
    assert summarize(read_run_events(runs[1].run_dir)).skipped_events == len(BAD)

    runner = CliRunner()
    status = runner.invoke(cli, ["status", runs[1].id])
    assert status.exit_code == 0 and status.exception is None, status.output
    assert f"Skipped {len(BAD)} unreadable metric event lines" in status.stdout
    assert runner.invoke(cli, ["status"]).exit_code == 0
    target = tmp_path / "run.zip"
    download = runner.invoke(cli, ["download", runs[1].id, "-o", str(target)])
    assert download.exit_code == 0 and download.exception is None, download.output
    with zipfile.ZipFile(target) as zf:
        assert json.loads(zf.read("run.json"))["skipped_event_lines"] == len(BAD)
        assert len(zf.read("metrics.jsonl").splitlines()) == len(read_run_events(runs[1].run_dir))
    compare = runner.invoke(cli, ["compare", *[r.id for r in runs]])
    assert compare.exit_code == 0 and compare.exception is None, compare.output
    assert "2.00x" in compare.stdout


def test_download_never_follows_a_link_planted_at_its_partial_file(tmp_path):
    run = record_run(RunStore(), workers=1, tta=1.0, wall=2.0)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    target = tmp_path / "run.zip"
    part = tmp_path / "run.zip.part"
    for planted in (victim, tmp_path / "would-be-created"):
        part.symlink_to(planted)
        result = CliRunner().invoke(cli, ["download", run.id, "-o", str(target)])
        assert result.exit_code == 1, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "run.zip.part already exists" in lines[0], result.output
        assert part.is_symlink() and victim.read_text() == "precious\n"
        assert not (tmp_path / "would-be-created").exists() and not target.exists()
        part.unlink()
    result = CliRunner().invoke(cli, ["download", run.id, "-o", str(target)])
    assert result.exit_code == 0 and zipfile.is_zipfile(target) and not part.exists()


def test_a_resumed_run_counts_the_steps_and_samples_its_killed_worker_left_unrecorded():
    """Rank 0 recorded steps 400 and 800, was killed after the checkpoint at step 1000 and resumed
    from it: its first record after the restart counts 200 steps (1000 -> 1200). The run made 1200
    steps of 100 samples, and its interval 800 -> 1200 ran 400 of them (status, compare, charts)."""
    from mlbench.results.compare import training_curve

    events = []
    for step, counted, seconds in ((400, 400, 4.0), (800, 400, 8.0), (1200, 200, 12.0)):
        for name, value in (("train/loss", 0.5), ("train/steps", counted), ("train/samples", counted * 100),
                            ("train/time", seconds)):
            events.append({"time": 0.0, "rank": 0, "epoch": step / 400, "step": step, "name": name, "value": value})
    summary = summarize(events)
    assert (summary.steps, summary.samples, summary.throughput) == (1200, 120_000, 10_000.0)
    assert [point["throughput"] for point in training_curve(events)] == [10_000.0, 10_000.0, 10_000.0]
