"""A plug-in is all of its code: the modules it imports and the files it opens from its own folder
(a file plug-in's folder, a module's package) are copied with the run and hashed as one; the
workers run the copy, with ``__file__`` inside it (issue 55, part 3).

In-process checks of what the loader collects and refuses; the projection of a bundle through a
pod's ConfigMap; two real 2-worker runs whose only difference is an edit to a helper module.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import pytest
import torch

from mlbench import plugins as plugin_loading
from mlbench.errors import UsageError
from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.optim.plugins import PluginError, load_recorded, resolve_optimizer
from mlbench.plugins import bundle_sha256
from mlbench.tasks.registry import get_task
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper
from tests.helpers import install_plugin_package, last_run, mlbench, mount_plugin_configmap, run_json

#: A plug-in of several files: a helper module beside it, a subpackage, a module found through a
#: folder its ``__file__`` names, and a data file it reads. Its constructor refuses to start when
#: the helper did not come from the folder of the plug-in's own file (in a worker: the run's copy).
ENTRY = '''
import json
import os
import sys
from pathlib import Path

import helper
from sub import scale

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))
import found_by_file

TABLE = json.loads((Path(__file__).parent / "table.json").read_text())

from mlbench.optim.base import DistributedOptimizer
from mlbench.optim.descriptors import OptimizerInfo


class Bundled(DistributedOptimizer):
    info = OptimizerInfo(name="bundled", reference="a test", summary="p -= lr * factor * grad")

    def __init__(self, ctx):
        super().__init__(ctx)
        here = Path(__file__).resolve().parent
        for module in (helper, scale, found_by_file):
            if here not in Path(module.__file__).resolve().parents:
                raise RuntimeError(f"{module.__name__} came from {module.__file__}, not from beside {__file__}")

    def step(self, lr):
        factor = helper.FACTOR * scale.ONE * found_by_file.ONE * TABLE["k"]
        for p in self.params:
            p.data.add_(p.grad, alpha=-lr * factor)
'''


def write_bundle(folder: Path, factor: str = "0.5") -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "lib").mkdir()
    (folder / "entry.py").write_text(textwrap.dedent(ENTRY))
    (folder / "helper.py").write_text(f"FACTOR = {factor}\n")
    (folder / "sub" / "__init__.py").write_text("")
    (folder / "sub" / "scale.py").write_text("ONE = 1.0\n")
    (folder / "lib" / "found_by_file.py").write_text("ONE = 1.0\n")
    (folder / "table.json").write_text('{"k": 1.0}\n')
    (folder / "notes.txt").write_text("not read by the plug-in\n")
    return folder / "entry.py"


def context() -> OptimizerContext:
    model = torch.nn.Linear(2, 1, bias=False)
    model.weight.data.fill_(1.0)
    model.weight.grad = torch.ones_like(model.weight)
    return OptimizerContext(model=model, hyper=task_hyper(get_task("task2a"), 1), world_size=1, rank=0,
                            timer=PhaseTimer(torch.device("cpu"), enabled=False), options={})


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_bundle_is_what_the_plugin_imports_and_opens_from_its_folder_hashed_as_one(tmp_path):
    entry = write_bundle(tmp_path / "mine")
    plugin = resolve_optimizer(f"{entry}:Bundled")
    assert plugin is not None
    hashes = {relative: sha(tmp_path / "mine" / relative)
              for relative in ("entry.py", "helper.py", "sub/__init__.py", "sub/scale.py", "lib/found_by_file.py",
                               "table.json")}
    record = plugin.record({})
    assert record["files"] == hashes            # notes.txt, never opened, is not the plug-in's
    assert record["sha256"] == plugin.sha256 == bundle_sha256(hashes)
    expected = hashlib.sha256("".join(f"{p}\0{h}\n" for p, h in sorted(hashes.items())).encode()).hexdigest()
    assert plugin.sha256 == expected            # the documented formula
    assert record["folder"] == "plugin/entry" and record["file"] == "plugin/entry/entry.py"
    assert sorted(record["modules"]) == ["found_by_file", "helper", "sub", "sub.scale"]
    assert plugin.label == f"bundled@{expected[:12]}"

    # loaded again in this process: the same bundle (the helpers are executed, and seen, again)
    again = resolve_optimizer(f"{entry}:Bundled")
    assert again is not None and again.sha256 == plugin.sha256
    # an edit to a helper, or to the data it reads, is another plug-in; one to a file it never
    # reads is not
    (tmp_path / "mine" / "notes.txt").write_text("edited\n")
    assert resolve_optimizer(f"{entry}:Bundled").sha256 == plugin.sha256
    (tmp_path / "mine" / "helper.py").write_text("FACTOR = 0.25\n")
    edited = resolve_optimizer(f"{entry}:Bundled")
    assert edited.sha256 != plugin.sha256 and edited.record({})["files"]["helper.py"] != hashes["helper.py"]
    (tmp_path / "mine" / "helper.py").write_text("FACTOR = 0.5\n")
    (tmp_path / "mine" / "table.json").write_text('{"k": 2.0}\n')
    assert resolve_optimizer(f"{entry}:Bundled").sha256 not in (plugin.sha256, edited.sha256)


def test_a_worker_runs_the_copy_of_every_file_and_refuses_a_changed_one(tmp_path):
    entry = write_bundle(tmp_path / "mine")
    plugin = resolve_optimizer(f"{entry}:Bundled")
    assert plugin is not None
    run_dir = tmp_path / "run"
    for relative, data in plugin.loaded.copies().items():
        (run_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / relative).write_bytes(data)
    record = plugin.record({})
    # the user's folder, broken after the run was made, is never read: the copy's helpers are
    for name in ("helper.py", "sub/scale.py", "lib/found_by_file.py", "table.json"):
        (tmp_path / "mine" / name).write_text("raise SystemExit('the user edited it')\n")
    ctx = context()
    optimizer = build_optimizer(plugin.label, ctx, record, run_dir)   # its constructor checks __file__
    optimizer.step(2.0)
    assert ctx.model.weight.data.tolist() == [[0.0, 0.0]]   # 1 - 2 x 0.5 x 1, exactly
    assert not list(run_dir.rglob("__pycache__"))           # the copy stays what was hashed

    (run_dir / "plugin" / "entry" / "sub" / "scale.py").write_text("ONE = 2.0\n")
    with pytest.raises(PluginError, match=r"the run's copy .*sub/scale.py has changed since the run was created"):
        load_recorded(run_dir, record)
    (run_dir / "plugin" / "entry" / "sub" / "scale.py").unlink()
    with pytest.raises(PluginError, match=r"the run's copy .*sub/scale.py cannot be read"):
        load_recorded(run_dir, record)


def test_a_module_plugin_keeps_its_package_files_and_records_its_distribution(tmp_path, monkeypatch):
    source = textwrap.dedent(ENTRY).replace("import helper\n", "from . import helper\n") \
        .replace("from sub import scale\n", "from .sub import scale\n") \
        .replace('sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))\nimport found_by_file\n',
                 "found_by_file = scale\n")
    install_plugin_package(tmp_path, "bundledopts.entry", source, "bundledopts-2.0", "mlbench.optimizers",
                           "bundled-sgd = bundledopts.entry:Bundled")
    package = tmp_path / "bundledopts"
    (package / "helper.py").write_text("FACTOR = 0.5\n")
    (package / "sub").mkdir()
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "scale.py").write_text("ONE = 1.0\n")
    (package / "table.json").write_text('{"k": 1.0}\n')
    (tmp_path / "bundledopts-2.0.dist-info" / "top_level.txt").write_text("bundledopts\n")
    (tmp_path / "unrelated.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    by_entry = resolve_optimizer("bundled-sgd")
    by_module = resolve_optimizer("bundledopts.entry:Bundled")
    assert by_entry is not None and by_module is not None
    files = sorted(by_module.record({})["files"])
    assert files == ["bundledopts/__init__.py", "bundledopts/entry.py", "bundledopts/helper.py",
                     "bundledopts/sub/__init__.py", "bundledopts/sub/scale.py", "bundledopts/table.json"]
    assert by_entry.sha256 == by_module.sha256
    assert by_entry.distribution == by_module.distribution == "bundledopts 2.0"
    assert by_module.copy_path == "plugin/bundledopts.entry/bundledopts/entry.py"


def test_a_bundle_too_large_to_keep_with_every_run_is_refused_in_one_line(tmp_path, monkeypatch):
    entry = write_bundle(tmp_path / "mine")
    (tmp_path / "mine" / "table.json").write_text(json.dumps({"k": 1.0, "pad": "x" * 5000}))
    monkeypatch.setattr(plugin_loading, "BUNDLE_LIMIT", 4096)
    with pytest.raises(UsageError, match=r"it imports or opens 6 files of [\d,]+ bytes from .*mine, more than a run "
                                         r"keeps .*largest: table.json"):
        resolve_optimizer(f"{entry}:Bundled")


def test_pods_get_every_file_of_the_bundle_through_the_configmap(tmp_path):
    """The kubelet's projection of the run's ConfigMap, done as it does it: a run folder from
    which the worker loads the plug-in and its helpers."""
    entry = write_bundle(tmp_path / "mine")
    plugin = resolve_optimizer(f"{entry}:Bundled")
    assert plugin is not None
    record = plugin.record({})
    files = plugin.loaded.copies()
    mounted = tmp_path / "pod-run"
    configmap = mount_plugin_configmap(record, files, mounted)
    assert len(configmap["binaryData"]) == 6
    ctx = context()
    build_optimizer(plugin.label, ctx, record, mounted).step(1.0)
    assert ctx.model.weight.data.tolist() == [[0.5, 0.5]]


def test_an_edit_to_a_helper_makes_a_new_family_in_real_runs(tmp_path):
    """Two real 2-worker runs of one plug-in whose helper module was edited in between: two
    optimizers, two families; the workers ran the copies (the constructor checks it)."""
    entry = write_bundle(tmp_path / "mine")
    common = ("run", "task2a", "2", "--data", "synthetic", "--max-steps", "3", "--log-every", "1",
              "--optimizer", f"{entry}:Bundled")
    mlbench(*common, check=True)
    first = last_run()
    (tmp_path / "mine" / "helper.py").write_text("FACTOR = 0.25\n")
    mlbench(*common, check=True)
    second = last_run()
    assert first.state == second.state == "finished"
    assert first.optimizer != second.optimizer and {first.optimizer[:8], second.optimizer[:8]} == {"bundled@"}
    one, two = (run_json(run)["config"]["optimizer_plugin"]["files"] for run in (first, second))
    assert {k for k in one if one[k] != two[k]} == {"helper.py"}
    kept = Path(second.run_dir) / "plugin" / "entry" / "helper.py"
    assert kept.read_text() == "FACTOR = 0.25\n"
    shown = mlbench("compare", "--task", "task2a", "-o", "json", check=True).stdout
    families = json.loads(shown)["families"]
    assert sorted(f["optimizer"] for f in families) == sorted([first.optimizer, second.optimizer])
    status = mlbench("status", second.id, check=True).stdout
    assert f"({entry}:Bundled, kept in plugin/entry/ with 6 files)" in status
