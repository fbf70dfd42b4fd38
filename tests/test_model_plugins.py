"""Model plug-ins (issue 22): ``--model FILE.py:build`` replaces task 1a's or 2a's model; the
source is loaded by the optimizer plug-ins' machinery (mlbench.plugins), kept with the run and
built by every worker from the run folder's copy.

In-process checks of the loader, the CLI's refusals and the worker's checks of what a plug-in
builds; one real 2-worker run of the documented example (examples/plugins/my_model.py, copied
outside the repository).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from mlbench.cli import (
    cli,
    commands,  # noqa: F401  (registers the commands)
)
from mlbench.dashboard.views import run_row, run_spec
from mlbench.errors import UsageError
from mlbench.plugins import PluginError, bundle_sha256
from mlbench.results.summary import summarize
from mlbench.tasks.models.plugins import build_plugin_model, load_recorded_model, resolve_model
from tests.helpers import install_plugin_package, last_run, mlbench, run_ids, run_json

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "plugins" / "my_model.py"

GOOD = """
from torch import nn

def build(input_shape, num_outputs):
    return nn.Sequential(nn.Linear(input_shape[0], num_outputs), nn.Flatten(0))
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def logistic_shape(n: int) -> tuple[int, ...]:
    return (n,)


def test_a_file_a_module_and_an_entry_point_resolve_to_the_builder_and_its_source(tmp_path, monkeypatch):
    path = write(tmp_path, "wide.py", GOOD)
    plugin = resolve_model(f"{path}:build")
    assert plugin is not None and plugin.name == "wide.build" and plugin.copy_path == "plugin/wide/wide.py"
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert plugin.sha256 == sha and plugin.label == f"wide.build@{sha[:12]}"
    assert plugin.record() == {"name": "wide.build", "spec": f"{path}:build", "kind": "file", "module": None,
                               "origin": str(path.resolve()), "distribution": None, "root": str(tmp_path.resolve()),
                               "folder": "plugin/wide", "file": "plugin/wide/wide.py", "files": {"wide.py": sha},
                               "modules": [], "sha256": sha, "callable": "build"}
    assert resolve_model("logreg") is None and resolve_model("resnet20") is None   # built-ins load nothing

    install_plugin_package(tmp_path, "mymodels.wide", GOOD, "mymodels-0.3", "mlbench.models",
                           "wide-net = mymodels.wide:build")
    monkeypatch.syspath_prepend(str(tmp_path))
    by_module, by_entry = resolve_model("mymodels.wide:build"), resolve_model("wide-net")
    assert by_module is not None and by_entry is not None
    assert by_module.name == "mymodels.wide.build" and by_entry.name == "wide-net"
    # a module's bundle: its file and its package's __init__.py, hashed as one
    package_sha = bundle_sha256({"mymodels/wide.py": sha, "mymodels/__init__.py": hashlib.sha256(b"").hexdigest()})
    assert by_entry.loaded.distribution == "mymodels 0.3" and by_entry.sha256 == by_module.sha256 == package_sha
    assert by_entry.copy_path == "plugin/mymodels.wide/mymodels/wide.py"

    # `mlbench tasks` lists what is installed, importing none of it: each plug-in with its
    # source's hash, one whose module cannot be found with why (a builder the module lacks shows
    # when --model names it, before a run exists)
    install_plugin_package(tmp_path, "othermodels.net", GOOD, "othermodels-1.0", "mlbench.models",
                           "broken-net = othermodels.net:missing")
    (tmp_path / "gone-1.0.dist-info").mkdir()
    (tmp_path / "gone-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: gone\nVersion: 1.0\n")
    (tmp_path / "gone-1.0.dist-info" / "entry_points.txt").write_text("[mlbench.models]\ngone-net = gone.net:build\n")
    listed = CliRunner().invoke(cli, ["tasks"])
    assert listed.exit_code == 0, listed.output
    assert "Installed model plug-ins (entry points of mlbench.models; --model NAME, open division):" in listed.output
    other_sha = bundle_sha256({"othermodels/net.py": sha, "othermodels/__init__.py": hashlib.sha256(b"").hexdigest()})
    assert f"  wide-net = mymodels.wide:build of mymodels 0.3, sha256 {package_sha[:12]}" in listed.output
    assert f"  broken-net = othermodels.net:missing of othermodels 1.0, sha256 {other_sha[:12]}" in listed.output
    assert "  gone-net = gone.net:build of gone 1.0, cannot be used: no module named gone" in listed.output
    as_json = json.loads(CliRunner().invoke(cli, ["tasks", "-o", "json"]).output)
    wide = next(m for m in as_json["model_plugins"] if m["name"] == "wide-net")
    assert wide["sha256"] == package_sha and wide["distribution"] == "mymodels 0.3" and "error" not in wide
    with pytest.raises(UsageError, match="defines no missing"):
        resolve_model("broken-net")


@pytest.mark.parametrize("args,message", [
    (("task2a", "--model", "{tmp}/missing.py:build"), "model plug-in {tmp}/missing.py:build: no such file"),
    (("task2a", "--model", "{tmp}/good.py:other"), "good.py defines no other"),
    (("task2a", "--model", "{tmp}/broken.py:build"), "importing it failed: ImportError: no such layer (line 2)"),
    (("task2a", "--model", "{tmp}/good.py:HIDDEN"), "HIDDEN is a int, not a callable build(input_shape, num_outputs)"),
    (("task2a", "--model", "no-such-model"), "unknown model 'no-such-model'; choose one of: resnet20-v1"),
    (("task2a", "--model", "no_such_module_xyz:build"), "no module named no_such_module_xyz"),
    (("task3a", "--model", "{tmp}/good.py:build"), "--model chooses or replaces the model of task1a and task2a"),
])
def test_a_bad_model_plugin_is_one_line_and_exit_2_before_any_run(tmp_path, args, message):
    write(tmp_path, "good.py", GOOD + "HIDDEN = 3\n")
    write(tmp_path, "broken.py", "import os\nraise ImportError('no such layer')\n")
    task, *rest = (a.format(tmp=tmp_path) for a in args)
    result = CliRunner().invoke(cli, ["run", task, "2", "--data", "synthetic", *rest])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message.format(tmp=tmp_path) in lines[0], lines
    assert "Traceback" not in result.output and run_ids() == []


def test_the_run_keeps_the_source_and_a_worker_builds_from_the_copy_only(tmp_path):
    path = write(tmp_path, "wide.py", GOOD)
    result = CliRunner().invoke(cli, ["run", "task2a", "2", "--data", "synthetic", "--record-only",
                                      "--model", f"{path}:build"])
    assert result.exit_code == 0, result.output
    run = last_run()
    document = run_json(run)
    record = document["config"]["model_plugin"]
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["sha256"] == sha and record["file"] == "plugin/wide/wide.py" and record["spec"] == f"{path}:build"
    assert (Path(run.run_dir) / "plugin" / "wide" / "wide.py").read_bytes() == path.read_bytes()
    assert document["config"]["task"]["settings"]["model"] == f"wide.build@{sha[:12]}"
    assert run.division == "open" and document["config"]["optimizer_plugin"] is None
    spec = run_spec(run, document, summarize([]))   # the dashboard's run page
    assert spec["model_plugin"] == f"wide.build, sha256 {sha[:12]} ({path}:build, kept as plugin/wide/wide.py)"
    assert spec["model_plugin_sha256"] == sha and spec["plugin"] is None

    path.write_text("raise SystemExit('edited after the run was created')\n")
    builder = load_recorded_model(Path(run.run_dir), record)
    model = build_plugin_model(builder, "wide", (3,), 1, logistic_shape)
    assert [tuple(p.shape) for p in model.parameters()] == [(1, 3), (1,)]

    copy = Path(run.run_dir) / "plugin" / "wide" / "wide.py"
    copy.write_text(copy.read_text() + "\n# changed\n")
    with pytest.raises(PluginError, match="has changed since the run was created"):
        load_recorded_model(Path(run.run_dir), record)


def test_what_a_plugin_builds_is_checked_in_the_worker_in_one_line():
    def raises(shape, outputs):
        raise ValueError("no such width")

    cases = [
        (lambda shape, outputs: 3, "model plug-in wide@abc returned int, not a torch.nn.Module"),
        (raises, "model plug-in wide@abc raised while building the model: ValueError: no such width"),
        (lambda shape, outputs: torch.nn.Linear(shape[0], outputs),
         "model plug-in wide@abc: its model gives [2, 1] for a batch of shape [2, 5]; the task's loss needs "
         "a tensor of shape [2]"),
        (lambda shape, outputs: torch.nn.Linear(7, outputs),
         "model plug-in wide@abc: its model raised on a batch of shape [2, 5]: RuntimeError: mat1 and mat2"),
    ]
    for builder, message in cases:
        with pytest.raises(PluginError) as err:
            build_plugin_model(builder, "wide@abc", (5,), 1, logistic_shape)
        assert str(err.value).startswith(message), str(err.value)
    bn = build_plugin_model(lambda shape, outputs: torch.nn.Sequential(torch.nn.BatchNorm1d(5), torch.nn.Flatten(0),
                                                                      torch.nn.LazyLinear(2)), "bn", (5,), 2,
                            lambda n: (2,))
    assert bn.training and bn[0].num_batches_tracked.item() == 0   # the check leaves no statistic behind


def test_the_documented_example_runs_on_two_workers_and_status_and_compare_name_its_source(tmp_path):
    """docs/plugins.md's example, copied outside the repository: a real 2-worker local run."""
    plugin = Path(shutil.copy(EXAMPLE, tmp_path / "my_model.py"))
    sha = hashlib.sha256(plugin.read_bytes()).hexdigest()
    label = f"my_model.build@{sha[:12]}"
    mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "3", "--log-every", "1",
            "--model", f"{plugin}:build", "--save-model", check=True)
    run = last_run()
    assert run.state == "finished" and run.division == "open"
    assert run_json(run)["config"]["model_plugin"]["sha256"] == sha
    ranks = [torch.load(Path(run.run_dir) / "checkpoints" / f"rank-{r}.pt") for r in (0, 1)]
    assert list(ranks[0]) == ["1.weight", "1.bias", "3.weight", "3.bias"]   # the plug-in's MLP was trained
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])    # the same model on both ranks
    details = mlbench("status", run.id, check=True).stdout
    assert f"my_model.build, sha256 {sha[:12]} ({plugin}:build, kept as plugin/my_model/my_model.py)" in details
    doc = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)
    assert doc["model_plugin"]["sha256"] == sha and doc["optimizer_plugin"] is None and doc["summary"]["steps"] == 3
    assert f"| model {label} |" in mlbench("compare", "--task", "task2a", check=True).stdout
    assert f"open: model={label} (+1 more)" in mlbench("status", check=True).stdout   # the list names it too
    listed = json.loads(mlbench("status", "-o", "json", check=True).stdout)["runs"]
    why = f"open: model={label}; data=synthetic"
    assert [(r["model"], r["division_text"]) for r in listed] == [(label, why)]
    row = run_row("local", run, None, run_json(run))        # the dashboard's runs table, the same cell
    assert row["division_text"] == why


def test_the_documented_example_is_the_file_the_tests_run():
    doc = (REPO / "docs" / "plugins.md").read_text()
    assert f"```python\n{EXAMPLE.read_text()}```" in doc


def test_a_fifo_given_as_a_plug_in_is_refused_at_once_instead_of_waiting_for_a_writer(tmp_path):
    import os
    import subprocess
    import sys

    fifo = tmp_path / "my_model.py"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "mlbench", "run", "task2a", "1", "--data", "synthetic",
                           "--model", f"{fifo}:build"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, MLBENCH_HOME=str(tmp_path / "home")))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"Error: model plug-in {fifo}:build: {fifo} is not a regular file "
                                                "(a FIFO, a device or a folder); give the plug-in's .py file"]
