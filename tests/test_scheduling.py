"""The suite's own schedule (tests/scheduling.py) names units that exist and hands them out in
its order: a renamed module left in LONG_MODULES would silently be handed out last."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.scheduling import FORKSERVER_MODULES, FORKSERVER_UNIT, LONG_MODULES, WHOLE_PACKAGES, order_items, unit_of

REPO = Path(__file__).resolve().parents[1]


def test_every_unit_the_schedule_names_exists():
    assert [p for p in WHOLE_PACKAGES if not (REPO / p).is_dir()] == []
    assert [m for m in LONG_MODULES if not (REPO / m).is_file()] == []
    assert len(set(LONG_MODULES)) == len(LONG_MODULES)


def test_packages_then_long_modules_longest_first_then_the_rest_in_their_order():
    ids = ["tests/test_spec.py::a", f"{LONG_MODULES[1]}::b", "tests/kube/test_node_runs.py::c",
           f"{LONG_MODULES[0]}::d", "tests/test_layers.py::e", "tests/slurm/test_slurm_runs.py::f",
           f"{LONG_MODULES[0]}::g"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    order_items(items)
    assert [i.nodeid[-1] for i in items] == ["c", "f", "d", "g", "b", "a", "e"]


def test_the_modules_that_use_the_forkserver_are_one_unit_and_no_other_is():
    """A module that calls run_on_ranks (itself or through an ``on_ranks`` fixture) left out of
    FORKSERVER_MODULES would start a forkserver of its own on whichever worker ran it."""
    users = sorted(str(path.relative_to(REPO)) for path in REPO.glob("tests/**/test_*.py")
                   if "on_ranks" in path.read_text() and path != Path(__file__).resolve())
    assert sorted(FORKSERVER_MODULES) == users
    assert {unit_of(f"{m}::t") for m in FORKSERVER_MODULES} == {FORKSERVER_UNIT}
    assert unit_of("tests/optim/test_cli.py::t") == "tests/optim/test_cli.py"
    assert unit_of("tests/kube/test_node_runs.py::t") == "tests/kube"
