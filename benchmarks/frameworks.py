"""Each framework's port against that framework's own plain training loop, in one run (issue 23).

    python benchmarks/frameworks.py                       # every installed framework, tasks 2a and 1a
    python benchmarks/frameworks.py --only jax --tasks task2a --repeats 7 --steps 400

A comparison of frameworks should measure the frameworks, not mlbench's wrapper around them. So
for every framework the script measures, round by round (benchmarks/measure.py):

* **plain**: the training loop a user of that framework writes, in a fresh interpreter, one
  process, the data already in memory (random, of the task's shape; no augmentation). Task 2a
  (logistic regression, 2,000 features, batch 100, the L2 term, SGD): PyTorch's autograd and
  ``torch.optim.SGD``; JAX's ``jax.jit`` of ``jax.value_and_grad`` and an ``optax`` update;
  TensorFlow's ``tf.function`` around ``tf.GradientTape``. Task 1a (ResNet-20, batch 32,
  Nesterov SGD): PyTorch's tutorial loop (benchmarks/throughput.py); for JAX and TensorFlow,
  which ship no ResNet-20 for CIFAR, the port's own model and jitted (``tf.function``) step
  called in a bare loop (mlbench/tasks/task1a/jax_model.py, tf_model.py): the framework's cost of
  the step without mlbench's worker around it;
* **plain, fused** (task 2a, JAX and TensorFlow): the same plain step, a logging interval's
  steps in one call (``lax.scan``; a ``tf.range`` loop in the ``tf.function``, as Keras'
  ``steps_per_execution``), its losses read once a call. mlbench's ports of task 2a run that
  way, so this is the loop their parity is measured against;
* **mlbench**: ``mlbench run TASK 1 --framework F --data synthetic --max-steps N
  --threads-per-worker CORES`` (every core, as the plain loop has), the real
  launcher and the worker users get, its seconds per step read from rank 0's training clock
  after the first logging interval (warm-up and compilation excluded as for the plain loop). The
  worker also gathers (task 1a: augments) each minibatch with mlbench's own code and hands it
  over from NumPy, records losses, heartbeats and (PyTorch) phase timings.

The table gives samples per second of each (median and range over the rounds) and mlbench's
rate over each plain loop's, per round. Frameworks that are not installed are skipped, saying so.

    python benchmarks/frameworks.py --goal DATA_DIR --repeats 1   # time to task 1a's light goal

With ``--goal``, the script instead runs ``mlbench run task1a 2 --framework F --light --data-dir
DATA_DIR`` for each framework, round by round, and prints each one's throughput, test accuracy
after every epoch and time to the light goal (70%: training alone, and with the evaluations), as
the run's own result records them: the comparison of frameworks on the real data set (CIFAR-10
in DATA_DIR, downloaded there by the first run if it is not). A run takes 15-30 minutes on a
2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import DEFAULT_REPEATS, interleave, machine_line, ratio_spread, spread

from mlbench.frameworks import FRAMEWORKS
from mlbench.run_config import RunConfig
from mlbench.tasks.datasets import SYNTHETIC_EPSILON_TRAIN

FEATURES, SAMPLES = 2000, 8192
#: Task 2a's plain loops train on as many rows as mlbench's runs (--data synthetic): 320 MB, whose
#: random gathers run from main memory (8,192 rows ran partly from the caches, 1.15x faster).
TASK2A_SAMPLES = SYNTHETIC_EPSILON_TRAIN
#: Per task: the batch of one worker and the timed steps by default (task 1a's steps are ~50x dearer).
TASKS = {"task2a": (100, 1000), "task1a": (32, 40)}
L2 = 2.5e-6      # task 2a's (mlbench/tasks/task2a); momentum 0, no weight decay
LR = 0.01        # a constant rate: the plain loop times the step, not the schedule
WARMUP = 5


def log_interval(steps: int) -> int:
    """The steps between log lines of the mlbench runs (and the steps of one call of a fused
    loop): mlbench's default (50), fewer for a short run, so that it has ten intervals."""
    return min(RunConfig.log_every, max(5, steps // 10))


def plain_seconds_per_step(framework: str, task: str, steps: int, fused: bool = False) -> float:
    """One framework's plain loop, timed in this process (called in a fresh interpreter);
    ``fused``: a logging interval's steps in one call (task 2a, JAX and TensorFlow)."""
    import numpy as np

    rng = np.random.default_rng(0)
    batch = TASKS[task][0]
    if fused:
        x = rng.standard_normal((TASK2A_SAMPLES, FEATURES), dtype=np.float32)
        y = (rng.integers(0, 2, TASK2A_SAMPLES) * 2 - 1).astype(np.float32)
        run = {"jax": _jax_steps, "tensorflow": _tf_steps}[framework](x, y)
        interval = log_interval(steps)
        calls = steps // interval
        order = rng.integers(0, len(y), (calls + 1, interval, batch))
        run(order[0])
        start = time.perf_counter()
        for chunk in order[1:]:
            run(chunk)
        return (time.perf_counter() - start) / (calls * interval)
    if task == "task2a":
        x = rng.standard_normal((TASK2A_SAMPLES, FEATURES), dtype=np.float32)
        y = (rng.integers(0, 2, TASK2A_SAMPLES) * 2 - 1).astype(np.float32)
        step = {"pytorch": _torch_step, "jax": _jax_step, "tensorflow": _tf_step}[framework](x, y)
    else:
        x = rng.standard_normal((SAMPLES // 4, 3, 32, 32), dtype=np.float32)
        y = rng.integers(0, 10, SAMPLES // 4)
        step = {"pytorch": _torch_resnet_step, "jax": _port_resnet_step, "tensorflow": _port_resnet_step}[
            framework](x, y, framework)
    order = rng.integers(0, len(y), (steps + WARMUP, batch))
    for i in range(WARMUP):
        step(order[i])
    start = time.perf_counter()
    for i in range(WARMUP, WARMUP + steps):
        step(order[i])
    return (time.perf_counter() - start) / steps


def _torch_resnet_step(x, y, framework):
    import torch
    from throughput import plain_loop

    torch.set_num_threads(os.cpu_count() or 1)
    step = plain_loop("resnet20-v1", TASKS["task1a"][0], torch.device("cpu"), "fp32", False)
    return lambda idx: step(int(idx[0]))


def _port_resnet_step(x, y, framework):
    """The port's model and step (JAX's shard_map over one device, or TensorFlow's tf.function)
    in a bare loop, from the reference weights."""
    import torch

    from mlbench.tasks.models import build_model
    from mlbench.tasks.task1a import TASK1A

    settings = TASK1A.settings
    torch.manual_seed(0)
    state = {k: v.detach().numpy().copy() for k, v in build_model(settings.model).state_dict().items()}
    if framework == "jax":
        import jax

        jax.config.update("jax_platforms", "cpu")
        from mlbench.tasks.task1a.jax_model import ResNetPort as JaxResNet

        port = JaxResNet(settings, 20, 1, state)
    else:
        from mlbench.tasks.task1a.tf_model import ResNetPort as TfResNet

        port = TfResNet(settings, 20, 1, state)
    return lambda idx: port.step(x[idx], y[idx], LR)


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


def _jax_steps(x, y):
    """JAX's loop of several steps in one call: ``lax.scan`` of the plain step, the losses read
    once per call."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    jax.config.update("jax_platforms", "cpu")
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    tx = optax.sgd(LR)
    w = jnp.zeros(FEATURES, jnp.float32)
    state = {"w": w, "opt": tx.init(w)}

    def objective(w, xb, yb):
        return jnp.mean(jax.nn.softplus(-yb * (xb @ w))) + 0.5 * L2 * jnp.sum(w * w)

    def one(carry, idx):
        w, opt_state = carry
        loss, grad = jax.value_and_grad(objective)(w, xs[idx], ys[idx])
        updates, opt_state = tx.update(grad, opt_state, w)
        return (optax.apply_updates(w, updates), opt_state), loss

    @jax.jit
    def update(w, opt_state, idx):
        (w, opt_state), losses = jax.lax.scan(one, (w, opt_state), idx)
        return w, opt_state, losses

    def run(idx):
        state["w"], state["opt"], losses = update(state["w"], state["opt"], idx)
        np.asarray(losses)
    return run


def _tf_steps(x, y):
    """TensorFlow's loop of several steps in one call: a ``tf.range`` loop inside the
    ``tf.function``, as Keras' ``steps_per_execution`` runs it, the losses read once per call."""
    import tensorflow as tf

    xs, ys = tf.constant(x), tf.constant(y)
    w = tf.Variable(tf.zeros([FEATURES], tf.float32))
    opt = tf.keras.optimizers.SGD(learning_rate=LR)

    @tf.function
    def update(idx):
        losses = tf.TensorArray(tf.float32, size=tf.shape(idx)[0])
        for s in tf.range(tf.shape(idx)[0]):
            with tf.GradientTape() as tape:
                xb, yb = tf.gather(xs, idx[s]), tf.gather(ys, idx[s])
                loss = tf.reduce_mean(tf.nn.softplus(-yb * tf.linalg.matvec(xb, w))) + 0.5 * L2 * tf.reduce_sum(w * w)
            opt.apply_gradients([(tape.gradient(loss, w), w)])
            losses = losses.write(s, loss)
        return losses.stack()

    def run(idx):
        update(tf.constant(idx)).numpy()
    return run


#: The frameworks whose task-2a plain loop is also timed fused (a logging interval per call).
FUSED = ("jax", "tensorflow")


def plain_case(framework: str, task: str, steps: int, fused: bool = False):
    """Samples per second of ``framework``'s plain loop, in a fresh interpreter per round."""
    def measure() -> float:
        out = subprocess.run([sys.executable, __file__, "--plain", framework, "--task", task, "--steps", str(steps),
                              *(["--fused"] if fused else [])],
                             check=True, capture_output=True, text=True)
        return TASKS[task][0] / json.loads(out.stdout.strip().splitlines()[-1])["seconds_per_step"]
    return measure


def mlbench_case(framework: str, task: str, steps: int, env: dict[str, str]):
    """Samples per second of ``mlbench run TASK 1 --framework F`` (rank 0's training clock)."""
    from mlbench.results.events import read_run_events

    batch = TASKS[task][0]
    log_every = log_interval(steps)

    def measure() -> float:
        out = subprocess.run([sys.executable, "-m", "mlbench", "run", task, "1", "--framework", framework,
                              "--data", "synthetic", "--max-steps", str(steps + log_every),
                              "--log-every", str(log_every), "--threads-per-worker", str(os.cpu_count() or 1),
                              "--detach", "-o", "json"],
                             check=True, capture_output=True, text=True, env=env)
        run_id = json.loads(out.stdout)["id"]
        subprocess.run([sys.executable, "-m", "mlbench", "wait", run_id], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        run_dir = Path(env["MLBENCH_HOME"]) / "runs" / run_id
        clock = [(e["step"], e["value"]) for e in read_run_events(run_dir)
                 if e["name"] == "train/time" and e["rank"] == 0]
        (s0, t0), (s1, t1) = clock[0], clock[-1]   # the first interval is warm-up and compilation
        return (s1 - s0) * batch / (t1 - t0)
    return measure


#: ``--goal``: the task and its workers (the issue's comparison: task 1a's light goal on 2 workers)
GOAL_RUN = ("task1a", "2", "--light")


def goal_case(framework: str, data_dir: str, env: dict[str, str]) -> Callable[[], dict[str, Any]]:
    """One ``mlbench run task1a 2 --framework F --light`` to its end: its result, as `status -o
    json` gives it, and rank 0's test accuracy after each epoch."""
    from mlbench.results.events import read_run_events

    def measure() -> dict[str, Any]:
        def mlbench(*args: str, check: bool = True) -> str:
            return subprocess.run([sys.executable, "-m", "mlbench", *args], check=check, capture_output=True,
                                  text=True, env=env).stdout

        started = mlbench("run", *GOAL_RUN, "--framework", framework, "--data-dir", data_dir, "--detach", "-o", "json")
        run_id = json.loads(started)["id"]
        mlbench("wait", run_id, check=False)   # exit 3: the goal was missed, which the table shows
        status = json.loads(mlbench("status", run_id, "-o", "json"))
        run_dir = Path(env["MLBENCH_HOME"]) / "runs" / run_id
        accuracy = [e["value"] for e in read_run_events(run_dir) if e["name"] == "eval/accuracy" and e["rank"] == 0]
        return {**status["result"], "state": status["state"], "accuracy": accuracy}
    return measure


def goal_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Per framework: samples/s, accuracy by epoch (the first round's), the epoch of the goal and
    the times to it (median and range over the rounds, in minutes)."""
    rows = []
    for name, runs in results.items():
        reached = [r for r in runs if r.get("reached")]
        rate = [r["steps"] * TASKS["task1a"][0] * int(GOAL_RUN[1]) / r["train_time"] for r in runs]
        rows.append([FRAMEWORKS[name].title, spread(rate),
                     " / ".join(f"{a:.2%}" for a in runs[0]["accuracy"]),
                     f"{len(reached)}/{len(runs)}",
                     spread([r["epochs_to_accuracy"] for r in reached], "{:.0f}") if reached else "-",
                     spread([r["time_to_accuracy"] / 60 for r in reached], "{:.1f}") if reached else "-",
                     spread([r["wall_time_to_accuracy"] / 60 for r in reached], "{:.1f}") if reached else "-"])
    return tabulate(rows, headers=["task1a light goal (70%), 2 workers", "samples/s", "test accuracy after each epoch",
                                   "reached", "epoch", "minutes of training", "with evaluation"], tablefmt="github")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(FRAMEWORKS), default=list(FRAMEWORKS))
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--steps", type=int, help="timed steps [task 2a 1000, task 1a 40]")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--plain", choices=list(FRAMEWORKS), help=argparse.SUPPRESS)
    parser.add_argument("--task", choices=list(TASKS), default="task2a", help=argparse.SUPPRESS)
    parser.add_argument("--fused", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--goal", metavar="DATA_DIR",
                        help="time task 1a's light goal on 2 workers per framework, CIFAR-10 in DATA_DIR")
    args = parser.parse_args()
    if args.plain:
        steps = args.steps or TASKS[args.task][1]
        print(json.dumps({"seconds_per_step": plain_seconds_per_step(args.plain, args.task, steps, args.fused)}))
        return
    frameworks = [FRAMEWORKS[name] for name in args.only]
    missing = [f.name for f in frameworks if not f.installed()]
    for name in missing:
        print(f"# {name}: not installed, skipped (pip install 'mlbench-suite[{FRAMEWORKS[name].extra}]')")
    present = [f for f in frameworks if f.name not in missing]
    if args.goal:
        with tempfile.TemporaryDirectory() as scratch:
            env = dict(os.environ, MLBENCH_HOME=str(Path(scratch) / "home"),
                       MLBENCH_CONFIG_DIR=str(Path(scratch) / "config"))
            goals = {f.name: goal_case(f.name, args.goal, env) for f in present}
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in goals}
            for _ in range(args.repeats):
                for name, measure in goals.items():
                    runs[name].append(measure())
        print(machine_line(f"{args.repeats} rounds, interleaved"))
        print()
        print(goal_table(runs))
        return
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, MLBENCH_HOME=str(Path(scratch) / "home"),
                   MLBENCH_CONFIG_DIR=str(Path(scratch) / "config"))
        cases = {}
        for task in args.tasks:
            steps = args.steps or TASKS[task][1]
            for f in present:
                cases[(task, f.name, "plain")] = plain_case(f.name, task, steps)
                if task == "task2a" and f.name in FUSED:
                    cases[(task, f.name, "fused")] = plain_case(f.name, task, steps, fused=True)
                cases[(task, f.name, "mlbench")] = mlbench_case(f.name, task, steps, env)
        results = interleave(cases, args.repeats)
    print(machine_line(f"{args.repeats} rounds, interleaved"))
    for task in args.tasks:
        batch, steps = TASKS[task][0], args.steps or TASKS[task][1]
        fused = any((task, f.name, "fused") in results for f in present)
        rows = []
        for f in present:
            mlbench, plain = results[(task, f.name, "mlbench")], results[(task, f.name, "plain")]
            row = [f.title, spread(plain), spread(mlbench), ratio_spread(mlbench, plain)]
            if fused:
                steps_fused = results.get((task, f.name, "fused"))
                row += [spread(steps_fused), ratio_spread(mlbench, steps_fused)] if steps_fused else ["-", "-"]
            rows.append(row)
        headers = [f"{task}, batch {batch}, 1 process, {steps} steps", "plain samples/s", "mlbench samples/s",
                   "mlbench / plain"]
        if fused:
            headers += [f"plain, {log_interval(steps)} steps a call", "mlbench / that"]
        print()
        print(tabulate(rows, headers=headers, tablefmt="github"))


if __name__ == "__main__":
    main()
