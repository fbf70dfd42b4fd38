"""Each framework's port against that framework's own plain training loop, in one run (issue 23).

    python benchmarks/frameworks.py                       # every installed framework, task 2a
    python benchmarks/frameworks.py --only jax --repeats 7 --steps 400

A comparison of frameworks should measure the frameworks, not mlbench's wrapper around them. So
for every framework the script measures, round by round (benchmarks/measure.py):

* **plain**: the training loop a user of that framework writes from its tutorials, in a fresh
  interpreter: task 2a's model (logistic regression, 2,000 features, batch 100, the closed
  division's L2 term and SGD), the data already in the framework's memory, one process; PyTorch:
  autograd and ``torch.optim.SGD``; JAX: ``jax.jit`` of ``jax.value_and_grad`` and an ``optax``
  update; TensorFlow: a ``tf.function`` around ``tf.GradientTape`` and the SGD update;
* **mlbench**: ``mlbench run task2a 1 --framework F --data synthetic --max-steps N``, the real
  launcher and the worker users get, its seconds per step read from rank 0's training clock
  after the first logging interval (warm-up and compilation excluded as for the plain loop). The
  worker also hands each minibatch over from NumPy (mlbench's data and sample order), records
  losses, heartbeats and (PyTorch) phase timings.

The table gives samples per second of each (median and range over the rounds) and mlbench's
rate over the plain loop's, per round. Frameworks that are not installed are skipped, saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import DEFAULT_REPEATS, interleave, machine_line, ratio_spread, spread

from mlbench.frameworks import FRAMEWORKS

BATCH, FEATURES, SAMPLES = 100, 2000, 8192
L2 = 2.5e-6      # task 2a's (mlbench/tasks/task2a); momentum 0, no weight decay
LR = 0.01        # a constant rate: the plain loop times the step, not the schedule
WARMUP = 20


def plain_seconds_per_step(framework: str, steps: int) -> float:
    """One framework's plain loop, timed in this process (called in a fresh interpreter)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, FEATURES), dtype=np.float32)
    y = (rng.integers(0, 2, SAMPLES) * 2 - 1).astype(np.float32)
    order = rng.integers(0, SAMPLES, (steps + WARMUP, BATCH))
    step = {"pytorch": _torch_step, "jax": _jax_step, "tensorflow": _tf_step}[framework](x, y)
    for i in range(WARMUP):
        step(order[i])
    start = time.perf_counter()
    for i in range(WARMUP, WARMUP + steps):
        step(order[i])
    return (time.perf_counter() - start) / steps


def _torch_step(x, y):
    import torch

    torch.manual_seed(0)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    model = torch.nn.Linear(FEATURES, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step(idx):
        idx = torch.from_numpy(idx)
        z = model(xs[idx]).squeeze(1)
        loss = torch.nn.functional.softplus(-ys[idx] * z).mean() + 0.5 * L2 * model.weight.pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()   # every framework's loop reads its loss back, as a training loop logs it
    return step


def _jax_step(x, y):
    import jax
    import jax.numpy as jnp
    import optax

    jax.config.update("jax_platforms", "cpu")
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    tx = optax.sgd(LR)
    state = {"w": jnp.zeros(FEATURES, jnp.float32)}
    state["opt"] = tx.init(state["w"])

    def objective(w, xb, yb):
        return jnp.mean(jax.nn.softplus(-yb * (xb @ w))) + 0.5 * L2 * jnp.sum(w * w)

    @jax.jit
    def update(w, opt_state, idx):
        loss, grad = jax.value_and_grad(objective)(w, xs[idx], ys[idx])
        updates, opt_state = tx.update(grad, opt_state, w)
        return optax.apply_updates(w, updates), opt_state, loss

    def step(idx):
        state["w"], state["opt"], loss = update(state["w"], state["opt"], idx)
        float(loss)
    return step


def _tf_step(x, y):
    import tensorflow as tf

    xs, ys = tf.constant(x), tf.constant(y)
    w = tf.Variable(tf.zeros([FEATURES], tf.float32))
    opt = tf.keras.optimizers.SGD(learning_rate=LR)

    @tf.function
    def update(idx):
        with tf.GradientTape() as tape:
            xb, yb = tf.gather(xs, idx), tf.gather(ys, idx)
            loss = tf.reduce_mean(tf.nn.softplus(-yb * tf.linalg.matvec(xb, w))) + 0.5 * L2 * tf.reduce_sum(w * w)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return loss

    def step(idx):
        float(update(tf.constant(idx)))
    return step


def plain_case(framework: str, steps: int):
    """Samples per second of ``framework``'s plain loop, in a fresh interpreter per round."""
    def measure() -> float:
        out = subprocess.run([sys.executable, __file__, "--plain", framework, "--steps", str(steps)],
                             check=True, capture_output=True, text=True)
        return BATCH / json.loads(out.stdout.strip().splitlines()[-1])["seconds_per_step"]
    return measure


def mlbench_case(framework: str, steps: int, env: dict[str, str]):
    """Samples per second of ``mlbench run task2a 1 --framework F`` (rank 0's training clock)."""
    from mlbench.results.events import read_run_events

    log_every = max(10, steps // 10)

    def measure() -> float:
        out = subprocess.run([sys.executable, "-m", "mlbench", "run", "task2a", "1", "--framework", framework,
                              "--data", "synthetic", "--max-steps", str(steps + log_every),
                              "--log-every", str(log_every), "--detach", "-o", "json"],
                             check=True, capture_output=True, text=True, env=env)
        run_id = json.loads(out.stdout)["id"]
        subprocess.run([sys.executable, "-m", "mlbench", "wait", run_id], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        run_dir = Path(env["MLBENCH_HOME"]) / "runs" / run_id
        clock = [(e["step"], e["value"]) for e in read_run_events(run_dir)
                 if e["name"] == "train/time" and e["rank"] == 0]
        (s0, t0), (s1, t1) = clock[0], clock[-1]   # the first interval is warm-up and compilation
        return (s1 - s0) * BATCH / (t1 - t0)
    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(FRAMEWORKS), default=list(FRAMEWORKS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--plain", choices=list(FRAMEWORKS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain:
        print(json.dumps({"seconds_per_step": plain_seconds_per_step(args.plain, args.steps)}))
        return
    frameworks = [FRAMEWORKS[name] for name in args.only]
    missing = [f.name for f in frameworks if not f.installed()]
    for name in missing:
        print(f"# {name}: not installed, skipped (pip install 'mlbench-suite[{FRAMEWORKS[name].extra}]')")
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, MLBENCH_HOME=str(Path(scratch) / "home"),
                   MLBENCH_CONFIG_DIR=str(Path(scratch) / "config"))
        cases = {}
        for f in frameworks:
            if f.name in missing:
                continue
            cases[(f.name, "plain")] = plain_case(f.name, args.steps)
            cases[(f.name, "mlbench")] = mlbench_case(f.name, args.steps, env)
        results = interleave(cases, args.repeats)
    print(machine_line(f"{args.repeats} rounds, interleaved, {args.steps} timed steps each"))
    rows = []
    for f in frameworks:
        if f.name in missing:
            continue
        plain, ours = results[(f.name, "plain")], results[(f.name, "mlbench")]
        rows.append([f.title, spread(plain), spread(ours), ratio_spread(ours, plain)])
    print(tabulate(rows, headers=["task 2a, batch 100, 1 process", "plain samples/s", "mlbench samples/s",
                                  "mlbench / plain"], tablefmt="github"))


if __name__ == "__main__":
    main()
