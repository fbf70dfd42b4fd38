"""Each task's settings dataclass is the only home of its numbers and the source of its --set keys."""

import dataclasses
import subprocess
import sys

import pytest

from mlbench.errors import UsageError
from mlbench.tasks.overrides import parse_overrides, resolve, task_keys
from mlbench.tasks.registry import TASK_PACKAGES, TASKS, get_task
from mlbench.tasks.spec import TaskSpec
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.task3a import TASK3A
from mlbench.tasks.task4b import TASK4B


def test_the_registry_holds_one_task_per_package_in_order():
    assert list(TASKS) == ["task0a", "task1a", "task2a", "task3a", "task4b", "task5a"]
    assert len(TASK_PACKAGES) == len(TASKS)
    assert get_task("task3a") is TASK3A


def test_finding_the_tasks_imports_no_runtime():
    code = ("import sys; from mlbench.tasks.registry import TASKS; list(TASKS.values()); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.endswith('.runtime')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", ["task1a", "task2a", "task3a", "task4b"])
def test_every_number_and_flag_of_a_tasks_settings_is_a_set_key(name):
    spec = get_task(name)
    assert isinstance(spec, TaskSpec)
    keys = task_keys(spec)
    for f in dataclasses.fields(spec.settings):
        value = getattr(spec.settings, f.name)
        if isinstance(value, (bool, int, float)) and f.name not in spec.settings.NOT_SETTABLE:
            assert f.name in keys, f.name


def test_a_tasks_own_setting_has_one_home_and_two_spellings():
    by_name, changed = resolve(TASK3A, parse_overrides(["hidden=64"]))
    by_extra, changed_extra = resolve(TASK3A, parse_overrides(["extra.hidden=64"]))
    assert by_name == by_extra and by_name.settings.hidden == 64
    assert (changed, changed_extra) == (["hidden"], ["extra.hidden"])
    spec, changed = resolve(TASK4B, parse_overrides(["lr=0.001976", "warmup_steps=4000"]))
    assert changed == ["warmup_steps"] and spec.settings.warmup_steps == 4000


@pytest.mark.parametrize("task, pair, message", [
    (TASK3A, "l2=0.1", "task3a has no setting 'l2'"),
    (TASK4B, "lr.milestones=5", "task4b has no setting 'lr.milestones'"),
    (TASK1A, "lr.alpha=5", "--set lr.alpha applies to inverse-sqrt schedules, not to task1a"),
    (TASK3A, "bptt=0", "--set bptt=0: must be at least 1"),
    (TASK3A, "extra.dropout=1", "--set extra.dropout=1: a rate, at least 0 and below 1"),
    (TASK4B, "extra.adam_eps=-1", "--set extra.adam_eps=-1: must be at least 0"),
])
def test_a_value_a_task_cannot_take_is_one_sentence(task, pair, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(task, parse_overrides([pair]))


def test_the_spec_reads_the_tasks_settings_and_keeps_its_own_fields():
    assert TASK3A.bptt == TASK3A.settings.bptt == 70
    assert TASK4B.batch_per_worker == 2 ** 13 and TASK4B.optimizer == "centralized-adam"
    with pytest.raises(AttributeError, match="task3a has no setting 'momentun'"):
        _ = TASK3A.momentun
    assert TASK1A.with_settings(momentum=0.0).settings.momentum == 0.0 and TASK1A.momentum == 0.9
