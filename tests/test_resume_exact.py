"""N steps, a stop with a checkpoint, a resume and M more steps give bit-identical parameters to
N+M steps uninterrupted, for every training task and a stateful optimizer.

The trainer runs in this process (one worker, no process group: the state a checkpoint must hold
is the same per rank with any number of them; tests/test_resume.py resumes 2 real workers through
the CLI). The stop is a real one (``max_steps`` N writes the checkpoint, then the stop's
evaluation runs, as in a run), and the resumed trainer is a new one built from the configuration,
as a resumed worker process is. Each task's dropout is on where it has one, so that the random
generators' state matters; task 2a crosses an epoch boundary after the resume.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mlbench.results.checkpoints import complete_checkpoints
from mlbench.results.events import EventWriter
from mlbench.run_config import RunConfig
from mlbench.tasks.overrides import resolve
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.task2a import TASK2A
from mlbench.tasks.task3a import TASK3A
from mlbench.tasks.task4b import TASK4B
from mlbench.worker.trainer import Trainer
from tests.language.corpus import write_parallel, write_wikitext
from tests.helpers import ListSink

SMALL_3A = {"extra.hidden": 16, "extra.embedding": 8, "extra.layers": 2, "batch_per_worker": 4, "extra.bptt": 8,
            "extra.eval_batch": 4}
SMALL_4B = {"extra.dim": 16, "extra.ffn": 32, "extra.heads": 2, "extra.encoder_layers": 1,
            "extra.decoder_layers": 1, "batch_per_worker": 256, "extra.global_tokens": 512, "extra.beam": 1}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train(config: RunConfig, run_dir, max_steps: int, resume_step: int | None = None):
    config = dataclasses.replace(config, max_steps=max_steps, resume_step=resume_step)
    sink = ListSink()
    trainer = Trainer(config, 0, EventWriter(sink, 0), run_dir=run_dir)
    trainer.setup()
    result = trainer.train()
    return trainer, result, sink.events


def assert_resume_is_exact(config: RunConfig, tmp_path, n: int, m: int) -> None:
    reference, ref_result, _ = _train(config, None, n + m)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stopped = dataclasses.replace(config, checkpoint_every_steps=1000)  # only the stop's checkpoint
    _, first, events = _train(stopped, run_dir, n)
    assert (first.stop_reason, first.steps) == ("max-steps", n)
    assert [e["value"]["step"] for e in events if e["name"] == "checkpoint"] == [n]
    assert complete_checkpoints(run_dir / "checkpoints", 1).steps == (n,)
    resumed, result, _ = _train(stopped, run_dir, n + m, resume_step=n)
    assert result.steps == ref_result.steps == n + m
    expected, actual = reference.model.state_dict(), resumed.model.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    assert result.bytes_sent == ref_result.bytes_sent
    assert result.final_accuracy == ref_result.final_accuracy


def test_task2a_resumes_exactly_across_an_epoch_boundary(tmp_path):
    spec, _ = resolve(TASK2A, {"batch_per_worker": 10_000})  # synthetic epsilon: 4 steps an epoch
    assert_resume_is_exact(RunConfig(task=spec, workers=1, data="synthetic", log_every=2), tmp_path, 3, 3)


def test_powersgd_resumes_exactly_with_its_error_feedback_and_q_matrices(tmp_path):
    spec, _ = resolve(TASK2A, {"batch_per_worker": 500})
    config = RunConfig(task=spec, workers=1, data="synthetic", log_every=2, optimizer="powersgd")
    assert_resume_is_exact(config, tmp_path, 3, 3)


@pytest.mark.parametrize("optimizer,options,n", [
    ("diloco", {"H": "2"}, 3),                                        # stops one step into a round
    ("streaming-diloco", {"H": "4", "fragments": "2", "overlap": "1", "outer_dtype": "bf16"}, 4),  # in flight
    ("sparseloco", {"H": "2", "density": "0.05"}, 3),                 # with its error feedback
])
def test_the_diloco_family_resumes_exactly(tmp_path, optimizer, options, n):
    spec, _ = resolve(TASK2A, {"batch_per_worker": 500})
    config = RunConfig(task=spec, workers=1, data="synthetic", log_every=2, optimizer=optimizer,
                       optimizer_options=options)
    assert_resume_is_exact(config, tmp_path, n, 4)


def test_task1a_resumes_exactly(tmp_path, cifar_small_dir):
    spec, _ = resolve(TASK1A, {"batch_per_worker": 16})
    config = RunConfig(task=spec, workers=1, data_dir=str(cifar_small_dir), log_every=2, eval_batch_size=500)
    assert_resume_is_exact(config, tmp_path, 2, 2)


def test_task3a_resumes_exactly_with_its_hidden_state_and_dropout(tmp_path, monkeypatch):
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path / "cache"))
    spec, _ = resolve(TASK3A, SMALL_3A)
    config = RunConfig(task=spec, workers=1, data_dir=str(write_wikitext(tmp_path / "wikitext")), log_every=2)
    assert_resume_is_exact(config, tmp_path, 3, 3)


def test_task4b_resumes_exactly_with_adam_and_dropout(tmp_path, monkeypatch):
    monkeypatch.setenv("MLBENCH_DATA", str(tmp_path / "cache"))
    spec, _ = resolve(TASK4B, SMALL_4B)
    config = RunConfig(task=spec, workers=1, data_dir=str(write_parallel(tmp_path / "wmt")), log_every=2,
                       optimizer="centralized-adam")
    assert_resume_is_exact(config, tmp_path, 2, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_task1a_on_a_gpu_resumes_its_captured_step_exactly(tmp_path, cifar_small_dir, monkeypatch):
    """On a GPU, task 1a's step is a CUDA graph captured at the run's first step, after three
    warm-up steps at learning rate 0; a resumed run captures it after loading its checkpoint. The
    warm-up must then change neither the momentum the checkpoint holds (it was zeroed: a resumed
    or restarted GPU run went on without momentum) nor the random stream of the augmentation's
    crops and flips (three steps ahead of the checkpoint's). cuDNN deterministic and TF32 off:
    the resumed and the uninterrupted run then do the same arithmetic, to the bit."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    spec, _ = resolve(TASK1A, {"batch_per_worker": 16})
    config = RunConfig(task=spec, workers=1, data_dir=str(cifar_small_dir), log_every=2, eval_batch_size=500,
                       device="cuda", graph=True)
    assert_resume_is_exact(config, tmp_path, 3, 3)
