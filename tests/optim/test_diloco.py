"""The DiLoCo example (examples/diloco/), installed with pip as a package of its own and run through
its entry point on 2 real workers, equals a reference computed here from the algorithm.

The reference is the paper's Algorithm 1 written out with torch's own optimizers: each worker's
AdamW (weight decay 0.1) on its share; every H steps the mean pseudo-gradient is the gradient of
a torch.optim.SGD(nesterov=True) step of the global model, which every worker then copies. At the
paper's outer values (0.7, 0.9), and at ``outer_lr=1 outer_momentum=0`` (model averaging of
AdamW). 5 steps end mid-round, so each rank's last step is its own, and the run's last
evaluation must score the global model, not a worker's nor their average.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlbench.results.summary import summarize
from mlbench.tasks.classification import learning_rate
from mlbench.tasks.data.sharding import epoch_batches, steps_per_epoch
from mlbench.tasks.datasets import load_splits
from mlbench.tasks.losses import get_loss, regulariser
from mlbench.tasks.models import build_model
from mlbench.tasks.overrides import resolve
from mlbench.tasks.pipeline import Pipeline
from mlbench.tasks.scoring import metrics_of, score_outputs
from mlbench.tasks.task2a import TASK2A
from tests.helpers import checkpoint, events, last_run, mlbench

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "diloco"
K, STEPS, BATCH, H, INNER_LR_SCALE, INNER_WEIGHT_DECAY = 2, 5, 50, 2, 0.08, 0.1


@pytest.fixture(scope="module")
def diloco_site(tmp_path_factory) -> Path:
    """A folder in which the example is installed (pip --target: the shared environment is untouched)."""
    root = tmp_path_factory.mktemp("diloco")
    source = root / "source"
    shutil.copytree(EXAMPLE, source)   # setuptools writes build/ and egg-info beside the sources
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(site), str(source)],
                   check=True, capture_output=True, timeout=300)
    return site


@pytest.fixture
def diloco_env(diloco_site):
    """The test's environment (its own run store) with the installed example on the path."""
    path = os.pathsep.join(p for p in (str(diloco_site), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def reference(spec, data_dir, outer_lr: float, outer_momentum: float):
    """Each rank's parameters, and the global model's test loss and accuracy after STEPS steps."""
    train, test = load_splits(spec.dataset, "real", str(data_dir))
    pipe = Pipeline(train, test, torch.device("cpu"), images=False)
    models, optimizers = [], []
    for _ in range(K):
        torch.manual_seed(0)
        models.append(build_model(spec.model, in_features=pipe.num_features))
        optimizers.append(torch.optim.AdamW(models[-1].parameters(), lr=0.0, weight_decay=INNER_WEIGHT_DECAY))
    torch.manual_seed(0)
    global_model = build_model(spec.model, in_features=pipe.num_features)
    outer = torch.optim.SGD(global_model.parameters(), lr=outer_lr, momentum=outer_momentum,
                            nesterov=outer_momentum > 0)
    spe = steps_per_epoch(pipe.num_train, K, BATCH)
    for step in range(STEPS):
        lr = learning_rate(spec.lr, workers=K, batch_per_worker=BATCH, step=step, steps_per_epoch=spe)
        for rank, (model, opt) in enumerate(zip(models, optimizers)):
            batches = epoch_batches(pipe.num_train, workers=K, rank=rank, batch_per_worker=BATCH, seed=0, epoch=0)
            x, y = pipe.train_batch(batches[step])
            opt.zero_grad()
            (get_loss(spec.loss).value(model(x), y, "mean") + regulariser(model, spec.l2)).backward()
            for group in opt.param_groups:
                group["lr"] = lr * INNER_LR_SCALE
            opt.step()
        if (step + 1) % H == 0:
            with torch.no_grad():
                for g, *params in zip(global_model.parameters(), *(m.parameters() for m in models)):
                    g.grad = torch.stack([g.detach() - p for p in params]).mean(dim=0)
            outer.step()
            with torch.no_grad():
                for g, *params in zip(global_model.parameters(), *(m.parameters() for m in models)):
                    for p in params:
                        p.copy_(g)
    with torch.no_grad():
        x, y = pipe.test_batch(0, pipe.num_test)
        scored = metrics_of(score_outputs(spec.loss, global_model(x).numpy(), y.numpy()),
                            float(regulariser(global_model, spec.l2)))
    return [{name: p.detach() for name, p in m.named_parameters()} for m in models], scored


@pytest.mark.parametrize("outer_lr, outer_momentum", [(0.7, 0.9), (1.0, 0.0)], ids=["paper", "averaging"])
def test_diloco_installed_with_pip_runs_through_its_entry_point_and_equals_the_algorithm(
        diloco_env, libsvm_dir, outer_lr, outer_momentum):
    listed = mlbench("optimizers", "-o", "json", env=diloco_env, check=True).stdout
    plugin = next(o for o in json.loads(listed)["optimizers"] if o["name"] == "example-diloco")["plugin"]
    assert (plugin["entry_point"], plugin["distribution"]) == ("example-diloco", "mlbench-diloco 0.1.0")

    mlbench("run", "task2a", str(K), "--data-dir", str(libsvm_dir), "--max-steps", str(STEPS),
            "--set", f"batch_per_worker={BATCH}", "--optimizer", "example-diloco", "--opt", f"H={H}",
            "--opt", f"outer_lr={outer_lr}", "--opt", f"outer_momentum={outer_momentum}", "--save-model",
            "--log-every", "1", env=diloco_env, check=True)
    run = last_run()
    record = json.loads((Path(run.run_dir) / "run.json").read_text())["config"]["optimizer_plugin"]
    assert (record["kind"], record["module"], record["distribution"]) == \
        ("entry-point", "mlbench_diloco.optimizer", "mlbench-diloco 0.1.0")
    assert (Path(run.run_dir) / record["file"]).read_bytes() == \
        (EXAMPLE / "mlbench_diloco" / "optimizer.py").read_bytes()
    assert record["options"]["inner_weight_decay"] == INNER_WEIGHT_DECAY   # the paper's, not the task's
    spec, _ = resolve(TASK2A, {"batch_per_worker": BATCH})
    expected, scored = reference(spec, libsvm_dir, outer_lr, outer_momentum)
    assert not torch.equal(expected[0]["linear.weight"], expected[1]["linear.weight"])  # step 5 is local
    for rank in range(K):
        state = checkpoint(run, rank)
        for name, want in expected[rank].items():
            torch.testing.assert_close(state[name], want, rtol=1e-5, atol=1e-6, msg=f"rank {rank} {name}")
    last = summarize(events(run)).evaluations[-1]
    assert last["step"] == STEPS
    assert last["loss"] == pytest.approx(scored["loss"], rel=1e-6) and last["accuracy"] == scored["accuracy"]
