"""Optimizer plug-ins (issue 22): loaded from a file, a module or an entry point, checked before a
run exists, kept with the run and executed from the run folder's copy.

In-process checks of the loader and the CLI's refusals; one real 2-worker run of the documented
example (examples/plugins/my_sgd.py, copied outside the repository) and one of a plug-in that
raises in its step.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from mlbench.cli import (
    cli,
    commands,  # noqa: F401  (registers the commands)
)
from mlbench.dashboard.views import run_spec
from mlbench.errors import UsageError
from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.optim.plugins import PluginError, load_recorded, resolve_optimizer
from mlbench.plugins import bundle_sha256
from mlbench.results.summary import summarize
from mlbench.tasks.registry import get_task
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper
from tests.helpers import install_plugin_package, last_run, mlbench, mount_plugin_configmap, run_ids, run_json

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "plugins" / "my_sgd.py"

HEADER = """
from mlbench.optim.base import DistributedOptimizer
from mlbench.optim.descriptors import Option, OptimizerInfo
"""

GOOD = HEADER + """
class Halve(DistributedOptimizer):
    info = OptimizerInfo(name="halve", reference="a test", summary="p -= lr * grad / 2",
                         options={"factor": Option("the share of the step", 0.5, kind="float", minimum=0.0)})

    def step(self, lr):
        for p in self.params:
            p.data.add_(p.grad, alpha=-lr * self.opts["factor"])
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def context(options: dict[str, str] | None = None) -> OptimizerContext:
    model = torch.nn.Linear(2, 1, bias=False)
    model.weight.data.fill_(1.0)
    model.weight.grad = torch.ones_like(model.weight)
    return OptimizerContext(model=model, hyper=task_hyper(get_task("task2a"), 1), world_size=1, rank=0,
                            timer=PhaseTimer(torch.device("cpu"), enabled=False), options=options or {})


def test_a_file_plugin_resolves_to_its_class_info_and_source_hash(tmp_path):
    path = write(tmp_path, "halve.py", GOOD)
    plugin = resolve_optimizer(f"{path}:Halve")
    assert plugin is not None and plugin.kind == "file" and plugin.class_name == "Halve"
    assert plugin.info.name == "halve" and plugin.source == path.read_bytes()
    assert plugin.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert plugin.label == f"halve@{plugin.sha256[:12]}" and plugin.copy_path == "plugin/halve/halve.py"
    assert plugin.record({"factor": 0.25})["options"] == {"factor": 0.25}
    assert resolve_optimizer("powersgd") is None   # a built-in's name never loads anything


def test_a_module_plugin_and_an_entry_point_plugin_resolve_from_the_installed_source(tmp_path, monkeypatch):
    install_plugin_package(tmp_path, "myopts.halving", GOOD, "myopts-1.2", "mlbench.optimizers",
                           "half-sgd = myopts.halving:Halve")
    monkeypatch.syspath_prepend(str(tmp_path))
    by_module = resolve_optimizer("myopts.halving:Halve")
    by_entry = resolve_optimizer("half-sgd")
    assert by_module is not None and by_entry is not None
    assert by_module.kind == "module" and by_entry.kind == "entry-point"
    assert by_module.module == by_entry.module == "myopts.halving"
    assert by_entry.distribution == "myopts 1.2" and by_entry.sha256 == by_module.sha256
    assert by_entry.copy_path == "plugin/myopts.halving/myopts/halving.py"

    # the listing names it by its entry point with its source's hash, without importing it;
    # asked for by name, it is imported and shows its options
    result = CliRunner().invoke(cli, ["optimizers"])
    assert result.exit_code == 0, result.output
    assert (f"half-sgd (plug-in, open division; from entry point half-sgd = myopts.halving:Halve of myopts 1.2, "
            f"sha256 {by_entry.sha256[:12]})\n  Not imported: `mlbench optimizers half-sgd`") in result.output
    listed = json.loads(CliRunner().invoke(cli, ["optimizers", "-o", "json"]).output)["optimizers"]
    assert listed[-1]["plugin"]["sha256"] == by_entry.sha256 and listed[-1]["closed_division"] is False
    one = CliRunner().invoke(cli, ["optimizers", "half-sgd"])
    assert one.exit_code == 0, one.output
    assert one.output.startswith(f"halve (plug-in, open division; from {by_entry.origin} of myopts 1.2, "
                                 f"sha256 {by_entry.sha256[:12]})\n")
    assert "--opt factor=" in one.output


BAD_CLASSES = {
    "not_a_subclass.py": ("class Halve:\n    pass\n",
                          "Halve is not a subclass of mlbench.optim.base.DistributedOptimizer"),
    "no_info.py": (HEADER + "class Halve(DistributedOptimizer):\n    def step(self, lr):\n        pass\n",
                   "Halve has no `info = OptimizerInfo(...)`"),
    "builtin_name.py": (GOOD.replace('name="halve"', 'name="powersgd"'), "calls itself powersgd, a built-in"),
    "no_step.py": (GOOD.replace("def step(self, lr)", "def other(self, lr)"), "Halve does not implement step(lr)"),
    "import_error.py": ("import os\nraise ValueError('no GPU here')\n",
                        "importing it failed: ValueError: no GPU here (line 2)"),
    "syntax_error.py": ("def broken(:\n", "importing it failed: SyntaxError:"),
}


@pytest.mark.parametrize("args,message", [
    (("{tmp}/missing.py:Halve",), "no such file {tmp}/missing.py"),
    (("{tmp}/good.py:Other",), "good.py defines no Other"),
    (("no_such_module_xyz:Halve",), "no module named no_such_module_xyz"),
    (("no-such-optimizer",), "unknown optimizer 'no-such-optimizer'"),
    (("{tmp}/good.py:Halve", "--opt", "rank=2"), "optimizer halve has no option rank; valid options: factor"),
    (("{tmp}/good.py:Halve", "--opt", "factor=-1"), "factor=-1: expected a value in [0, inf]"),
    *[((f"{{tmp}}/{name}:Halve",), message) for name, (_, message) in BAD_CLASSES.items()],
])
def test_a_bad_plugin_is_one_line_and_exit_2_before_any_run(tmp_path, args, message):
    write(tmp_path, "good.py", GOOD)
    for name, (text, _) in BAD_CLASSES.items():
        write(tmp_path, name, text)
    spec, *rest = (a.format(tmp=tmp_path) for a in args)
    result = CliRunner().invoke(cli, ["run", "task2a", "2", "--data", "synthetic", "--optimizer", spec, *rest])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message.format(tmp=tmp_path) in lines[0], lines
    assert "Traceback" not in result.output and run_ids() == []


def test_the_run_keeps_the_source_and_its_workers_execute_the_copy_not_the_users_file(tmp_path):
    path = write(tmp_path, "halve.py", GOOD)
    result = CliRunner().invoke(cli, ["run", "task2a", "2", "--data", "synthetic", "--record-only",
                                      "--optimizer", f"{path}:Halve", "--opt", "factor=0.25"])
    assert result.exit_code == 0, result.output
    run = last_run()
    record = run_json(run)["config"]["optimizer_plugin"]
    copy = Path(run.run_dir) / "plugin" / "halve" / "halve.py"
    assert copy.read_bytes() == path.read_bytes()
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["options"] == {"factor": 0.25} and record["spec"] == f"{path}:Halve"
    assert run.optimizer == f"halve@{record['sha256'][:12]}" and run.division == "open"
    assert run_json(run)["changed"][0] == f"optimizer={run.optimizer}"
    spec = run_spec(run, run_json(run), summarize([]))   # the dashboard's run page
    assert spec["plugin"] == f"halve, sha256 {record['sha256'][:12]} ({path}:Halve, kept as plugin/halve/halve.py)"
    assert spec["plugin_sha256"] == record["sha256"] and spec["optimizer"] == run.optimizer

    path.write_text("raise SystemExit('edited after the run was created')\n")
    ctx = context({"factor": "0.25"})
    optimizer = build_optimizer(run.optimizer, ctx, record, Path(run.run_dir))
    optimizer.step(2.0)
    assert ctx.model.weight.data.tolist() == [[0.5, 0.5]]   # 1 - 2 x 0.25 x 1, exactly

    copy.write_text(copy.read_text() + "\n# changed\n")
    with pytest.raises(PluginError, match="has changed since the run was created"):
        build_optimizer(run.optimizer, context(), record, Path(run.run_dir))


def test_a_plugin_that_raises_in_its_step_names_itself_and_the_step(tmp_path):
    path = write(tmp_path, "flaky.py", GOOD.replace("        for p in self.params:",
                                                    "        if lr > 1:\n            raise RuntimeError('lr too big')\n"
                                                    "        for p in self.params:"))
    plugin = resolve_optimizer(f"{path}:Halve")
    assert plugin is not None
    run_dir = tmp_path / "run"
    (run_dir / "plugin" / "flaky").mkdir(parents=True)
    (run_dir / "plugin" / "flaky" / "flaky.py").write_bytes(plugin.source)
    optimizer = build_optimizer(plugin.label, context(), plugin.record({}), run_dir)
    optimizer.step(0.5)
    with pytest.raises(PluginError) as err:
        optimizer.step(2.0)
    assert str(err.value) == f"optimizer plug-in {plugin.label} raised in step 2: RuntimeError: lr too big"


def test_the_documented_example_runs_on_two_workers_and_status_and_compare_name_its_source(tmp_path):
    """docs/plugins.md's example, copied outside the repository: a real 2-worker local run."""
    plugin = shutil.copy(EXAMPLE, tmp_path / "my_sgd.py")
    sha = hashlib.sha256(Path(plugin).read_bytes()).hexdigest()
    label = f"my-sgd@{sha[:12]}"
    mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "3", "--log-every", "1",
            "--optimizer", f"{plugin}:MySGD", "--opt", "lr_scale=0.5", check=True)
    run = last_run()
    assert run.state == "finished" and run.optimizer == label
    assert run_json(run)["config"]["optimizer_plugin"]["sha256"] == sha
    assert (Path(run.run_dir) / "plugin" / "my_sgd" / "my_sgd.py").read_bytes() == Path(plugin).read_bytes()
    details = mlbench("status", run.id, check=True).stdout
    assert f"my-sgd, sha256 {sha[:12]} ({plugin}:MySGD, kept as plugin/my_sgd/my_sgd.py)" in details
    assert f"open: optimizer={label} (+1 more)" in mlbench("status", check=True).stdout
    doc = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)
    assert doc["optimizer_plugin"]["sha256"] == sha and doc["summary"]["steps"] == 3
    assert f"| {label} |" in mlbench("compare", "--task", "task2a", check=True).stdout


def test_torchrun_workers_of_a_recorded_run_execute_the_kept_copy(tmp_path):
    """The torchrun launcher (`--record-only`, then the user's own torchrun): its workers load the
    run folder's copy; the user's file, broken after the run was recorded, is never read."""
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun is not installed")
    plugin = shutil.copy(EXAMPLE, tmp_path / "my_sgd.py")
    sha = hashlib.sha256(Path(plugin).read_bytes()).hexdigest()
    mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "3", "--log-every", "1",
            "--optimizer", f"{plugin}:MySGD", "--record-only", check=True)
    run = last_run()
    Path(plugin).write_text("raise SystemExit('the user edited the file after recording the run')\n")
    workers = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "mlbench.worker",
                              str(run.run_dir)], capture_output=True, text=True, timeout=300)
    assert workers.returncode == 0, workers.stdout[-2000:] + workers.stderr[-2000:]
    shown = mlbench("status", run.id, check=True).stdout       # status reconciles the recorded run
    assert re.search(r"state\s+finished", shown) and f"my-sgd, sha256 {sha[:12]} " in shown, shown
    assert last_run().optimizer == f"my-sgd@{sha[:12]}"


def test_a_plugin_failing_in_a_worker_fails_the_run_naming_it_and_the_step(tmp_path):
    """Rank 1 raises in its second step while rank 0 waits in the all-reduce: the run fails with
    rank 1's sentence and no worker is left."""
    source = EXAMPLE.read_text().replace(
        "        flat = torch.cat(",
        "        if self.ctx.rank == 1 and getattr(self, 'calls', 0) == 1:\n"
        "            raise ValueError('rank 1 gives up')\n"
        "        self.calls = getattr(self, 'calls', 0) + 1\n"
        "        flat = torch.cat(", 1)
    plugin = write(tmp_path, "failing.py", source)
    proc = mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "5", "--log-every", "1",
                   "--optimizer", f"{plugin}:MySGD")
    run = last_run()
    assert proc.returncode == 1 and run.state == "failed", proc.stderr
    sha = hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert f"optimizer plug-in my-sgd@{sha[:12]} raised in step 2: ValueError: rank 1 gives up" in run.reason
    assert "Traceback" not in proc.stdout + proc.stderr
    pids = json.loads((Path(run.run_dir) / "pids.json").read_text())
    for pid in pids.get("workers", []):
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_sys_modules_keeps_a_file_plugin_under_a_name_of_its_own(tmp_path):
    path = write(tmp_path, "halve.py", GOOD)
    plugin = resolve_optimizer(f"{path}:Halve")
    assert plugin is not None and plugin.cls.__module__ in sys.modules
    assert plugin.cls.__module__.startswith("_mlbench_plugin_halve_")
    with pytest.raises(UsageError):
        resolve_optimizer(f"{path}:")


def test_the_documented_example_is_the_file_the_tests_run():
    doc = (REPO / "docs" / "plugins.md").read_text()
    assert f"```python\n{EXAMPLE.read_text()}```" in doc


def test_pods_get_the_exact_source_through_the_configmap_and_a_large_one_is_refused(tmp_path):
    """What the kubelet makes of the run's ConfigMap and the pod's items is a run folder from
    which the worker loads the plug-in (no cluster here: the projection is done as it does it)."""
    from mlbench.launch.plan import LauncherAbilities, RunRequest, create_run
    from mlbench.results.store import RunStore

    path = write(tmp_path, "halve.py", GOOD)
    plugin = resolve_optimizer(f"{path}:Halve")
    assert plugin is not None
    record = plugin.record({"factor": 0.5})
    files = {record["file"]: plugin.source}
    mounted = tmp_path / "pod-run"
    mount_plugin_configmap(record, files, mounted)
    assert json.loads((mounted / "run.json").read_text())["config"]["optimizer_plugin"] == record
    assert load_recorded(mounted, record).info.name == "halve"

    request = RunRequest(task="task2a", workers=2, data="synthetic", optimizer=f"{path}:Halve")
    with pytest.raises(UsageError, match=f"its source is {len(plugin.source):,} bytes; a kubernetes run ships"):
        create_run(RunStore(), request, "kubernetes", nodes=2, on_this_machine=False, plugin_limit=100,
                   abilities=LauncherAbilities(), label="cluster")
    assert run_ids() == []


def test_listing_the_optimizers_and_tasks_runs_no_installed_plugins_code(tmp_path):
    """`mlbench optimizers` and `mlbench tasks` find every installed plug-in's source and its hash
    without executing it or its package (each leaves a file when imported): a plug-in runs only
    when a run, or `mlbench optimizers NAME`, asks for it. A fresh `python -m mlbench`, as users
    run it, with the packages on its PYTHONPATH."""
    marks = tmp_path / "marks"
    marks.mkdir()
    leave_mark = f"import pathlib\npathlib.Path({str(marks)!r}, __name__).write_text('imported')\n"
    install_plugin_package(tmp_path, "markedopts.halving", leave_mark + GOOD, "markedopts-1.0",
                           "mlbench.optimizers", "marked-sgd = markedopts.halving:Halve")
    (tmp_path / "markedopts" / "__init__.py").write_text(leave_mark)
    install_plugin_package(tmp_path, "markedmodels.net", leave_mark + "def build(shape, n):\n    return None\n",
                           "markedmodels-1.0", "mlbench.models", "marked-net = markedmodels.net:build")
    (tmp_path / "markedmodels" / "__init__.py").write_text(leave_mark)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    sha = bundle_sha256({f"markedopts/{name}": hashlib.sha256((tmp_path / "markedopts" / name).read_bytes()).hexdigest()
                         for name in ("halving.py", "__init__.py")})   # the module and its package's __init__

    listed = subprocess.run([sys.executable, "-m", "mlbench", "optimizers"], env=env, capture_output=True, text=True,
                            timeout=120)
    tasks = subprocess.run([sys.executable, "-m", "mlbench", "tasks", "-o", "json"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert sorted(p.name for p in marks.iterdir()) == []
    assert listed.returncode == 0, listed.stderr
    assert f"marked-sgd (plug-in, open division; from entry point marked-sgd = markedopts.halving:Halve of " \
           f"markedopts 1.0, sha256 {sha[:12]})" in listed.stdout
    assert tasks.returncode == 0, tasks.stderr
    assert [m["name"] for m in json.loads(tasks.stdout)["model_plugins"]] == ["marked-net"]

    one = subprocess.run([sys.executable, "-m", "mlbench", "optimizers", "marked-sgd"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert one.returncode == 0, one.stderr
    assert "--opt factor=" in one.stdout
    assert sorted(p.name for p in marks.iterdir()) == ["markedopts", "markedopts.halving"]
