"""Tasks 3a and 4b end to end through the real CLI: 2 workers on small files in the real formats.

Each run is the user's command (`mlbench run TASK 2 --data-dir DIR` with a small model), real
gloo workers, the task's own data pipeline reading Wikitext-2's or WMT's file layout, and its
metric as the goal metric: `status -o json`, `compare -o json` and the MLLOG export must name
perplexity (lower is better) or BLEU, never accuracy.
"""

from __future__ import annotations

import json
import math
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
