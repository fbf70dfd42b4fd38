"""Tasks 3a and 4b end to end through the real CLI: 2 workers on small files in the real formats.

Each run is the user's command (`mlbench run TASK 2 --data-dir DIR` with a small model), real
gloo workers, the task's own data pipeline reading Wikitext-2's or WMT's file layout, and its
metric as the goal metric: `status -o json`, `compare -o json` and the MLLOG export must name
perplexity (lower is better) or BLEU, never accuracy.
"""

from __future__ import annotations

import json
import math
import re
import zipfile

import pytest

from tests.helpers import last_run, mlbench
from tests.language.corpus import write_parallel, write_wikitext

pytestmark = pytest.mark.slow

SMALL_3A = ("--set", "extra.hidden=32", "--set", "extra.embedding=16", "--set", "extra.layers=2",
            "--set", "batch_per_worker=4", "--set", "extra.bptt=12", "--set", "extra.eval_batch=4")
SMALL_4B = ("--set", "extra.dim=32", "--set", "extra.ffn=64", "--set", "extra.heads=2",
            "--set", "extra.encoder_layers=1", "--set", "extra.decoder_layers=1",
            "--set", "batch_per_worker=256", "--set", "extra.global_tokens=512", "--set", "extra.beam=2")


def _status(run_id: str) -> dict:
    return json.loads(mlbench("status", run_id, "-o", "json", check=True).stdout)


def _mllog(run_id: str, tmp_path) -> list[dict]:
    out = tmp_path / f"{run_id}.zip"
    mlbench("download", run_id, "--format", "mlperf", "-o", str(out), check=True)
    with zipfile.ZipFile(out) as archive:
        assert "run.json" in {n.rsplit("/", 1)[-1] for n in archive.namelist()}
    text = out.with_suffix(".mllog.txt").read_text()
    return [json.loads(line.split(":::MLLOG", 1)[1]) for line in text.splitlines() if ":::MLLOG" in line]


def test_task3a_with_two_workers_on_wikitext_files_reports_perplexity(tmp_path):
    data = write_wikitext(tmp_path / "wikitext")
    proc = mlbench("run", "task3a", "2", "--data-dir", str(data), "--max-steps", "4", "--log-every", "2",
                   *SMALL_3A, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "open division" in proc.stdout and "Traceback" not in proc.stderr
    run = last_run()
    assert run.state == "finished" and run.workers == 2
    status = _status(run.id)
    assert status["metric"] == "perplexity"
    # a freshly initialised model: about the vocabulary's size, and at least 1 whatever it learnt
    assert status["metric_value"] is not None and 1 < status["metric_value"] < 10_000
    assert status["goal"] == pytest.approx(70.0)
    assert "perplexity" in mlbench("status", run.id, check=True).stdout
    family = json.loads(mlbench("compare", run.id, "-o", "json", check=True).stdout)["families"][0]
    assert family["task"] == "task3a" and family["groups"][0]["workers"] == 2
    assert math.isclose(family["groups"][0]["final_accuracy"], status["metric_value"])
    evaluations = [e for e in _mllog(run.id, tmp_path) if e["key"] == "eval_accuracy"]
    assert evaluations and evaluations[-1]["metadata"]["metric"] == "perplexity"
    assert evaluations[-1]["value"] == pytest.approx(status["metric_value"])


def test_task4b_with_two_workers_on_wmt_files_reports_bleu(tmp_path):
    data = write_parallel(tmp_path / "wmt")
    proc = mlbench("run", "task4b", "2", "--data-dir", str(data), "--max-steps", "4", "--log-every", "2",
                   *SMALL_4B, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = last_run()
    assert run.state == "finished" and run.optimizer == "centralized-adam"
    status = _status(run.id)
    assert status["metric"] == "bleu"
    assert status["metric_value"] is not None and 0 <= status["metric_value"] <= 100
    assert status["goal"] == pytest.approx(25.0)
    assert json.loads((run.run_dir / "run.json").read_text())["config"]["task"]["metric"] == "bleu"
    evaluations = [e for e in _mllog(run.id, tmp_path) if e["key"] == "eval_accuracy"]
    assert evaluations and evaluations[-1]["metadata"]["metric"] == "bleu"


#: SMALL_4B without its global batch: task 4b's own 2^17 tokens per step.
TINY_MODEL_4B = tuple(arg for pair in zip(SMALL_4B[::2], SMALL_4B[1::2])
                      if "global_tokens" not in pair[1] for arg in pair)


def test_task4b_on_a_corpus_smaller_than_one_step_is_refused_before_a_run_is_recorded(tmp_path):
    """300 sentence pairs cannot fill one global step of 2^17 tokens: one line says so and which
    global_tokens fits, before any run exists; that value then trains."""
    from mlbench.results.store import RunStore

    data = write_parallel(tmp_path / "wmt")
    proc = mlbench("run", "task4b", "1", "--data-dir", str(data), "--max-steps", "1", *TINY_MODEL_4B)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    match = re.fullmatch(r"Error: task4b: the training data make (\d+) micro-batches of at most 256 tokens "
                         r"\(batch_per_worker\), fewer than the 512 of one step of 131,072 tokens \(global_tokens\) "
                         r"on 1 worker: --set global_tokens=(\d+) or less, or give more sentence pairs\n", proc.stderr)
    assert match, proc.stderr
    assert int(match.group(2)) == int(match.group(1)) * 256
    assert RunStore().list() == []
    fitting = mlbench("run", "task4b", "1", "--data-dir", str(data), "--max-steps", "1", *TINY_MODEL_4B,
                      "--set", f"global_tokens={match.group(2)}", timeout=600)
    assert fitting.returncode in (0, 3), fitting.stdout + fitting.stderr
    assert last_run().state == "finished"


def test_task4b_workers_refuse_synthetic_data_smaller_than_one_step_in_one_line():
    """Synthetic data are drawn by the workers, which then refuse (exit 4, a data error) and fail
    the run with that line: no traceback, no run that trains nothing."""
    proc = mlbench("run", "task4b", "1", "--data", "synthetic", "--max-steps", "1", *TINY_MODEL_4B,
                   "--set", "global_tokens=16777216", timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run = last_run()
    assert run.state == "failed" and run.reason.startswith("worker 0 exited with code 4: task4b: "), run.reason
    message = run.reason.split(": ", 1)[1]
    assert "micro-batches of at most 256 tokens (batch_per_worker), fewer than the 65536 of one step of " \
           "16,777,216 tokens (global_tokens) on 1 worker: --set global_tokens=" in message
    assert (run.run_dir / "logs" / "rank-0.log").read_text() == f"Error: {message}\n"
    assert "Traceback" not in proc.stdout + proc.stderr
