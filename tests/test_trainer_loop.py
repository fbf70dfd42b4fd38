"""The training loop in one process (no process group): what it evaluates and when."""

from mlbench.results.events import EventWriter
from mlbench.run_config import RunConfig
from mlbench.tasks.overrides import resolve
from mlbench.tasks.task2a import TASK2A
from mlbench.worker.trainer import Trainer


class ListSink:
    def __init__(self):
        self.events = []

    def write(self, event):
        self.events.append(event)

    def close(self):
        pass


def test_a_step_cap_at_an_epoch_boundary_evaluates_the_model_once():
    spec, _ = resolve(TASK2A, {"batch_per_worker": 10_000})  # synthetic epsilon: 4 steps an epoch
    sink = ListSink()
    trainer = Trainer(RunConfig(task=spec, workers=1, data="synthetic", max_steps=4, log_every=4),
                      0, EventWriter(sink, 0))
    trainer.setup()
    assert trainer.steps_per_epoch == 4
    result = trainer.train()
    assert (result.stop_reason, result.steps) == ("max-steps", 4)
    evals = [e for e in sink.events if e["name"] == "eval/accuracy"]
    assert [e["step"] for e in evals] == [4]
    assert len([e for e in sink.events if e["name"] == "time/eval"]) == 1
