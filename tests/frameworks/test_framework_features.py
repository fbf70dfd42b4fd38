"""A framework's record says what its worker supports (``Framework.supports``, of
``mlbench.frameworks.FEATURES``); the planner refuses a run from it, one line naming the option,
and docs/frameworks.md shows the same records. In-process: no run is started."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from mlbench.errors import UsageError
from mlbench.frameworks import FEATURES, FRAMEWORKS, JAX, PYTORCH, TENSORFLOW
from mlbench.launch.faults import parse_inject
from mlbench.launch.plan import RunRequest, WorkerResources, _check_port_options, _features_used, build_config
from mlbench.network.settings import NetworkSettings
from mlbench.tasks.registry import TASKS

DOC = Path(__file__).resolve().parents[2] / "docs" / "frameworks.md"
PLUGIN = "from torch import nn\n\ndef build(input_shape, num_outputs):\n    return nn.Linear(3, num_outputs)\n"

#: each run feature as a run asks for it, and every feature that request uses with the option
#: its refusal names
ASKED = [
    ({"optimizer": "powersgd"}, {"optimizers": "--optimizer/--opt"}),
    ({"model": "PLUGIN"}, {"model-plugins": "--model"}),
    ({"device": "cuda", "backend": "gloo"}, {"cuda": "--device cuda"}),
    ({"time_budget_s": 60.0}, {"time-budget": "--time-budget"}),
    ({"precision": "bf16"}, {"bf16": "--precision"}),
    ({"save_model": True}, {"save-model": "--save-model"}),
    ({"channels_last": True}, {"channels-last": "--channels-last"}),
    ({"device": "cuda", "backend": "nccl"}, {"cuda": "--device cuda", "backends": "--backend nccl"}),
    ({"network": NetworkSettings(bandwidth_bps=1e9)}, {"network": "an emulated network"}),
    ({"faults": [parse_inject("kill:rank=1,at=30s")]}, {"faults": "--inject"}),
    ({"on_failure": "restart", "max_restarts": 1},
     {"recovery": "--on-failure restart", "checkpoints": "--checkpoint-every"}),
    ({"checkpoint_every_steps": 20}, {"checkpoints": "--checkpoint-every"}),
]

#: what the JAX port says to each, word for word (the refusals the CLI prints after "Error: ")
JAX_REFUSALS = {
    "optimizers": "--framework jax trains with the task's reference optimizer only; drop --optimizer/--opt",
    "model-plugins": "--framework jax trains the task's own model; drop the model plug-in",
    "cuda": "--framework jax: --device cuda is not in this port yet (it runs on CPUs, over gloo)",
    "time-budget": "--framework jax: --time-budget is not in this port yet (it runs on CPUs, over gloo)",
    "bf16": "--framework jax: --precision is not in this port yet (it runs on CPUs, over gloo)",
    "channels-last": "--framework jax: --channels-last is not in this port yet (it runs on CPUs, over gloo)",
    "network": "--framework jax: an emulated network is not in this port yet (it runs on CPUs, over gloo)",
    "faults": "--framework jax: --inject is not in this port yet (it runs on CPUs, over gloo)",
    "recovery": "--framework jax: --on-failure restart is not in this port yet (it runs on CPUs, over gloo)",
    "checkpoints": "--framework jax: --checkpoint-every is not in this port yet (it runs on CPUs, over gloo)",
}


def planned(tmp_path: Path, asked: dict) -> tuple:
    """The PyTorch run ``asked`` describes (PyTorch supports every feature) and its request."""
    if asked.get("model") == "PLUGIN":
        (tmp_path / "plugin.py").write_text(PLUGIN)
        asked = {**asked, "model": f"{tmp_path / 'plugin.py'}:build"}
    request = RunRequest(task="task1a", workers=2, data="synthetic", **asked)
    # planned as for a cluster's pods (a GPU each where asked): no framework need be installed here
    config, _ = build_config(request, WorkerResources(threads=1, gpus=int(asked.get("device") == "cuda")))
    return config, request


def refusal(config, request, framework) -> str | None:
    try:
        _check_port_options(config, request, framework)
    except UsageError as err:
        assert err.exit_code == 2 and err.option == "framework"
        return str(err)
    return None


def test_every_feature_is_one_of_pytorchs_and_the_ports_save_their_models_only():
    assert PYTORCH.supports == frozenset(FEATURES)
    assert JAX.supports == TENSORFLOW.supports == frozenset({"save-model"})
    with pytest.raises(ValueError, match="unknown features: gpus"):
        dataclasses.replace(JAX, supports=frozenset({"gpus"}))


@pytest.mark.parametrize("asked, used", ASKED, ids=[next(iter(u)) if len(u) == 1 else "+".join(u) for _, u in ASKED])
def test_a_run_is_refused_the_first_feature_its_frameworks_record_lacks(tmp_path, asked, used):
    config, request = planned(tmp_path, asked)
    assert _features_used(config, request) == used
    for framework in FRAMEWORKS.values():
        lacking = [f for f in used if f not in framework.supports]
        expected = framework.refusal(lacking[0], used[lacking[0]]) if lacking else None
        assert refusal(config, request, framework) == expected, framework.name
    first = next(iter(used))
    if first in JAX.supports:
        assert refusal(config, request, JAX) is None and refusal(config, request, TENSORFLOW) is None
        return
    assert refusal(config, request, JAX) == JAX_REFUSALS[first]
    assert refusal(config, request, TENSORFLOW) == JAX_REFUSALS[first].replace("--framework jax",
                                                                               "--framework tensorflow")


def test_the_refusals_follow_the_record_not_the_framework(tmp_path):
    """A port whose record gained a feature runs with it, and is refused the next one."""
    config, request = planned(tmp_path, {"on_failure": "restart", "max_restarts": 1})
    assert refusal(config, request, JAX) == JAX_REFUSALS["recovery"]
    recovers = dataclasses.replace(JAX, supports=frozenset({"recovery"}))
    assert refusal(config, request, recovers) == JAX_REFUSALS["checkpoints"]
    assert refusal(config, request, dataclasses.replace(JAX, supports=frozenset({"recovery", "checkpoints"}))) is None
    config, request = planned(tmp_path, {"device": "cuda", "backend": "nccl"})
    assert refusal(config, request, dataclasses.replace(JAX, supports=frozenset({"cuda"}))) == \
        "--framework jax: --backend nccl is not in this port yet (it runs on CPUs, over gloo)"


def test_every_feature_is_asked_for_above():
    assert {f for _, used in ASKED for f in used} == set(FEATURES)


def table(heading: str) -> list[list[str]]:
    """The rows of the first table under ``## heading`` of docs/frameworks.md, cells stripped."""
    text = DOC.read_text(encoding="utf-8").split(f"## {heading}\n", 1)[1]
    lines = [line for line in text.split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    return [[cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            for line in lines if not set(line) <= set("|- ")]


def test_docs_frameworks_shows_each_records_tasks_and_features():
    assert table("Tasks") == [["framework", "pip extra", "tasks"]] + [
        [f"`{f.name}`", f"`mlbench-suite[{f.extra}]`" if f.extra else "(core)",
         ", ".join(f.tasks) if f.tasks else "all"] for f in FRAMEWORKS.values()]
    assert table("Run features") == [["feature", "option", "what", *FRAMEWORKS]] + [
        [f"`{feature.name}`", f"`{feature.option}`", feature.what,
         *("yes" if feature.name in f.supports else "no" for f in FRAMEWORKS.values())]
        for feature in FEATURES.values()]


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_plans_with_pytorch_whose_record_supports_everything(task):
    """The feature check reads the run's reference optimizer only where the task has one: task
    0a (a sweep, no optimizer) is planned like every training task."""
    config, _ = build_config(RunRequest(task=task, workers=2, data="synthetic"), WorkerResources(threads=1, gpus=0))
    assert config.framework == "pytorch"


def test_each_port_sits_in_its_tasks_package_beside_the_pytorch_model():
    """A port framework's model of each task it declares is ``mlbench/tasks/TASK/MODULE.py``
    with a ``make_port``, beside the task's PyTorch ``model.py``; no task package holds a port
    its framework does not declare, and no framework's model is left in ``mlbench/worker``."""
    import ast
    from pathlib import Path

    from mlbench.frameworks import PORTS

    tasks = Path(__file__).resolve().parents[2] / "mlbench" / "tasks"
    for framework in PORTS.values():
        assert framework.model_module and framework.tasks
        for task in framework.tasks:
            module = tasks / task / f"{framework.model_module}.py"
            assert module.is_file(), f"{framework.name}'s port of {task} is not at {module}"
            functions = {n.name for n in ast.parse(module.read_text()).body if isinstance(n, ast.FunctionDef)}
            assert "make_port" in functions, module
            assert (tasks / task / "model.py").is_file()
        stray = {p.parent.name for p in tasks.glob(f"*/{framework.model_module}.py")} - set(framework.tasks)
        assert not stray, f"{framework.name} ports in {stray} that its record does not declare"
    worker = tasks.parent / "worker"
    assert not [p.name for p in worker.glob("*.py") if p.stem.endswith(("_resnet", "_logreg", "_model"))]
