"""The launcher matrix's Kubernetes row (tests/launcher_matrix.py) on the real node: a cancel from
the CLI and from the dashboard both end the run through the results service, whose supervisor
deletes its pods; a run's end is seen alike by `status` and the dashboard."""

from __future__ import annotations

import pytest

from mlbench.launch import kubernetes
from tests.kube.conftest import ENDLESS, PACED
from tests.kube.test_node_runs import start_detached, wait_running
from tests.launcher_matrix import (
    LauncherCase,
    check_cancel_from_the_cli,
    check_cancel_from_the_dashboard,
    check_end_seen_by_status_and_the_dashboard,
)

SHORT = ("task2a", "2", "--data", "synthetic", "--max-steps", "4", "--log-every", "2")
ACTIONS = {"cancel-cli": check_cancel_from_the_cli, "cancel-dashboard": check_cancel_from_the_dashboard,
           "end": check_end_seen_by_status_and_the_dashboard}


@pytest.fixture
def on_node(node_namespace):
    """The node's namespace as mlbench's current cluster (as in test_node_runs.py)."""
    node_namespace.record = node_namespace.add_cluster()
    return node_namespace


@pytest.mark.parametrize("action", list(ACTIONS))
def test_cluster_runs_are_cancelled_with_their_pods_deleted_and_end_alike_in_the_cli_and_the_dashboard(
        on_node, action):
    pytest.importorskip("uvicorn", reason="the dashboard needs uvicorn (pip install 'mlbench-suite[dashboard]')")
    from mlbench.dashboard.sources import Sources
    from mlbench.results.store import RunStore

    ns = on_node

    def endless() -> str:
        run_id = start_detached(*ENDLESS, *PACED)
        wait_running(ns, run_id)
        return run_id

    def pods_gone(run_id: str) -> bool:
        return not [o for o in ns.run_objects(run_id) if o.startswith("Pod/")]

    case = LauncherCase("kubernetes", endless, lambda: start_detached(*SHORT), pods_gone)
    sources = Sources(RunStore(), ns.record, open_cluster=kubernetes.open_store, refresh_s=0.0)
    if action == "cancel-cli":
        check_cancel_from_the_cli(case)
    else:
        ACTIONS[action](case, sources)
