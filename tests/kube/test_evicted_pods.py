"""A pod the node evicts, with the kubelet's message, ends its run as failed with that message.

A real node cannot be made to evict a pod on demand, so this runs on the control plane without a
node, with the stand-in kubelet (tests/kube/kubelet.py) reporting the eviction through the real
API server; everything else about runs on a cluster is tested on the real node (test_node_runs.py).
"""

from __future__ import annotations

import json
import re

import pytest

from mlbench.launch import kubernetes
from mlbench.launch.k8s_objects import pod_name, run_name
from tests.kube.conftest import ENDLESS, mlbench_cli, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.timeout(600),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


def started_run_id(output: str) -> str:
    return re.search(r"Started run ([0-9a-f]+)", output).group(1)


def explain(cluster, result=None) -> str:
    """What a failing assertion needs: the CLI's output, the harness's errors, the pods' logs."""
    logs = {p.name: p.log.read_text()[-1500:] for p in cluster.harness.pods.values() if p.log.exists()}
    return f"{result.output if result else ''}\nharness: {cluster.harness.errors}\nlogs: {json.dumps(logs, indent=1)}"


def follow_to_end(cluster, run_id: str, timeout: float = 60):
    store = kubernetes.open_store(cluster.record)
    return wait_for(lambda: (lambda r: r if not r.active else None)(store.sync_run(run_id)), timeout,
                    f"run {run_id} to end: {explain(cluster)}")


def start_long_run(cluster) -> str:
    """A detached run that trains until the test ends it (the cheapest task's, since its pods run
    on this machine), once both pods run."""
    result = mlbench_cli("run", *ENDLESS, "--detach")
    assert result.exit_code == 0, explain(cluster, result)
    run_id = started_run_id(result.output)
    store = kubernetes.open_store(cluster.record)
    wait_for(lambda: store.sync_run(run_id).state == "running", 60, f"run {run_id} to run: {explain(cluster)}")
    return run_id


def test_an_evicted_pod_ends_the_run_as_failed_with_the_pods_reason(cluster):
    run_id = start_long_run(cluster)
    assert re.search(r"state\s+running", mlbench_cli("status", run_id).output)   # live, from the service
    cluster.harness.fail(pod_name(run_id, 1), reason="Error", exit_code=137,
                         evicted_message="The node was low on resource: memory.")
    final = follow_to_end(cluster, run_id)
    assert final.state == "failed"
    assert final.reason == (f"worker 1 (pod {pod_name(run_id, 1)}) failed: Evicted: The node was low on "
                            "resource: memory.; exit code 137 (Error)")
    wait_for(lambda: not cluster.run_objects(run_id), 15, "the run's objects to be deleted")
    wait_for(lambda: all(p.proc.poll() is not None for p in cluster.harness.pods.values()
                         if p.name.startswith(run_name(run_id))), 15, "rank 0 to be stopped")
    details = mlbench_cli("status", run_id).output
    assert "failed (worker 1" in details and "Evicted" in details
