"""Task 2a's JAX and TensorFlow ports run a logging interval's steps in one call
(``HoldsTrainingSet.step_rows``: ``lax.scan``, a ``tf.range`` loop in the ``tf.function``),
since one call per step spent more time in the host's dispatch than in the 0.3 ms step
(docs/performance.md). The runs change nothing the run computes: steps in runs of any lengths
give the losses and weights of one call per step bit for bit; a run logged every 7 steps logs
the means of the per-step losses of a run logged every step, and evaluates to the same bits;
and every run length is compiled before the training clock starts."""

from __future__ import annotations

import numpy as np
import pytest

from mlbench.results.events import EventWriter
from mlbench.run_config import RunConfig
from mlbench.tasks.overrides import resolve
from mlbench.tasks.task2a import TASK2A
from tests.frameworks.in_process import one_tensorflow_thread, train_jax_in_process, train_tf_in_process, values
from tests.helpers import ListSink, requires

FEATURES = 40
SPLITS = ([12], [5, 7], [1] * 12, [3, 3, 3, 3])


def jax_port():
    import jax

    jax.config.update("jax_platforms", "cpu")
    from mlbench.tasks.task2a.jax_model import LogisticRegressionPort

    return LogisticRegressionPort


def tf_port():
    from mlbench.tasks.flops import load_flop_counter

    load_flop_counter()
    import tensorflow as tf

    one_tensorflow_thread(tf)
    from mlbench.tasks.task2a.tf_model import LogisticRegressionPort

    return LogisticRegressionPort


PORTS = [pytest.param(jax_port, marks=requires("jax", "optax"), id="jax"),
         pytest.param(tf_port, marks=requires("tensorflow"), id="tensorflow")]


@pytest.mark.parametrize("port_class", PORTS)
def test_steps_in_runs_of_any_length_equal_one_call_per_step_bit_for_bit(port_class):
    import dataclasses

    cls = port_class()
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((500, FEATURES)) / FEATURES ** 0.5).astype(np.float32)
    y = rng.choice(np.array([-1.0, 1.0], np.float32), 500)
    # momentum and weight decay on, so that the optimizer's state is carried from run to run
    settings = dataclasses.replace(TASK2A.settings, momentum=0.9, nesterov=True, weight_decay=1e-3)
    idx = rng.integers(0, 500, (12, settings.batch_per_worker))
    lrs = np.linspace(0.5, 0.05, 12)
    trained = []
    for splits in SPLITS:
        port = cls(settings, FEATURES)
        port.hold_training_set(x, y)
        losses, begin = [], 0
        for steps in splits:
            losses.append(np.asarray(port.step_rows(idx[begin:begin + steps], lrs[begin:begin + steps])).ravel())
            begin += steps
        trained.append((np.concatenate(losses), port.weights()))
    (losses, w), rest = trained[0], trained[1:]
    assert losses.shape == (12,) and losses[-1] < losses[0]
    for other_losses, other_w in rest:
        assert other_losses.tobytes() == losses.tobytes() and other_w.tobytes() == w.tobytes()


@pytest.mark.parametrize("train", [pytest.param(train_jax_in_process, marks=requires("jax", "optax"), id="jax"),
                                   pytest.param(train_tf_in_process, marks=requires("tensorflow"), id="tensorflow")])
def test_a_run_logged_every_7_steps_computes_what_one_logged_every_step_does(train, libsvm_dir):
    if train is train_tf_in_process:
        tf_port()
    spec, _ = resolve(TASK2A, {})

    def run(log_every: int) -> list[dict]:
        # 2,000 samples, batch 100: 20 steps an epoch; 45 steps end inside the third
        return train(RunConfig(task=spec, workers=1, data_dir=str(libsvm_dir), max_steps=45,
                               log_every=log_every, stop_at_goal=False))

    every_step, every_7 = run(1), run(7)
    per_step = values(every_step, "train/loss")
    assert len(per_step) == 45
    runs = [7, 7, 6, 7, 7, 6, 5]   # each epoch's intervals end at its end, the last at max_steps
    ends = np.cumsum(runs)
    means = [float(np.mean(per_step[end - n:end])) for n, end in zip(runs, ends, strict=True)]
    assert list(values(every_7, "train/loss")) == means
    assert [e["step"] for e in every_7 if e["name"] == "train/loss"] == list(ends)
    assert list(values(every_7, "train/lr")) == [values(every_step, "train/lr")[end - 1] for end in ends]
    for name in ("eval/loss", "eval/accuracy"):
        assert values(every_7, name).tobytes() == values(every_step, name).tobytes() != b""


@requires("jax", "optax")
def test_every_run_length_is_compiled_before_the_training_clock_starts(libsvm_dir):
    from mlbench.worker.jax_worker import JaxTrainer, _join

    jax_port()
    spec, _ = resolve(TASK2A, {})
    config = RunConfig(task=spec, workers=1, data_dir=str(libsvm_dir), max_steps=45, log_every=7,
                       stop_at_goal=False)
    _join(config, 0, "")
    trainer = JaxTrainer(config, 0, EventWriter(ListSink(), 0))
    assert trainer.run_lengths() == [7, 6, 5]
    compiled = []
    compile_step = trainer.compile_step

    def counted(rows, minibatches):
        seconds = compile_step(rows, minibatches)
        compiled.append(trainer.port._step_rows._cache_size())
        return seconds

    trainer.compile_step = counted
    trainer.train()
    assert compiled == [3] and trainer.port._step_rows._cache_size() == 3   # none compiled in training
