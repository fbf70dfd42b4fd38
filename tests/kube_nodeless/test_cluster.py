"""Cluster runs on the control plane without a node, its pods run by the stand-in kubelet
(tests/kube_nodeless/kubelet.py): what a real node cannot be made to do on demand, or what needs two
nodes. One module, so that this control plane runs for these tests alone
(tests/kube_nodeless/conftest.py ``kube_local``); everything else about runs on a cluster is
tested on the real node (tests/kube/test_node_runs.py).

**Refusals.** What a cluster run cannot do is refused in one line before anything is deployed.

On a cluster of several nodes (the harness's two) the checkpoints, which its pods keep on the
results service's volume (ReadWriteOnce), could be written by the pods of one node only; a
stall cannot be given to a pod. Both are refused (the launcher's abilities,
mlbench.launch.plan.LauncherAbilities, and its placement) before the results service or the
data claim exist: the namespace stays empty.

**Eviction.** A pod the node evicts, with the kubelet's message, ends its run as failed with
that message.

**The network dimension.** What the real API server stores for a shaped run's pods.

The harness kubelet runs only a pod's worker container (it has no network of its own to shape),
so these tests check the contract with Kubernetes: the init container that shapes each worker
pod (or the CNI bandwidth annotations), the worker container's unchanged securityContext, and
the network recorded in run.json and shown by `mlbench status`.
"""

from __future__ import annotations

import json
import re

import pytest
from kubernetes import client

from mlbench.launch import kubernetes
from mlbench.launch.k8s_objects import pod_name, run_name
from tests.kube.conftest import ENDLESS, mlbench_cli, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.timeout(600),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


# -- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    (("--checkpoint-every", "20steps"),
     "Error: --checkpoint-every on a cluster of 2 nodes: the checkpoints are kept on the results service's volume, "
     "which only pods on its node can mount; run on a one-node cluster, on this machine or under Slurm"),
    (("--on-failure", "restart"),   # which checkpoints (every 2 minutes when not told)
     "Error: --checkpoint-every on a cluster of 2 nodes: the checkpoints are kept on the results service's volume, "
     "which only pods on its node can mount; run on a one-node cluster, on this machine or under Slurm"),
    (("--inject", "stall:rank=1,at=5s"),
     "Error: --inject stall:rank=1,at=5s: cluster runs cannot inject a stall (they apply kill, slow); run on this "
     "machine"),
])
def test_what_a_cluster_run_cannot_do_is_refused_before_anything_is_deployed(cluster, options, message):
    refused = mlbench_cli("run", "task2a", "2", "--data", "synthetic", *options)
    assert refused.exit_code == 2, refused.output
    assert refused.output.strip() == message
    assert client.AppsV1Api(cluster.api).list_namespaced_deployment(cluster.namespace).items == []
    assert client.CoreV1Api(cluster.api).list_namespaced_persistent_volume_claim(cluster.namespace).items == []


# -- eviction ----------------------------------------------------------------------------------

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


# -- the network dimension ---------------------------------------------------------------------

QUICK = ("run", "task0a", "2", "--max-size", "10")


def _run_and_pods(cluster, *options: str):
    result = mlbench_cli(*QUICK, *options)
    assert result.exit_code == 0, result.output
    run = kubernetes.open_store(cluster.record).list()[-1]
    seen = cluster.harness.seen
    run_json = json.loads(seen[f"ConfigMap/{run_name(run.id)}"]["data"]["run.json"])
    return run, run_json, [seen[f"Pod/{pod_name(run.id, rank)}"] for rank in (0, 1)], result.output


def test_each_worker_pod_is_shaped_by_an_init_container_with_net_admin_only(cluster):
    run, run_json, pods, output = _run_and_pods(cluster, "--bandwidth", "100mbit", "--latency", "1ms")
    assert "network 100 Mbit/s, 1 ms (emulated)" in output
    assert run_json["network"]["mechanism"] == "init-container+tc"
    assert (run_json["network"]["bandwidth_bps"], run_json["network"]["latency_s"]) == (1e8, 1e-3)
    for pod in pods:
        (init,) = pod["spec"]["initContainers"]
        assert init["image"] == "mlbench/worker:test"
        assert init["command"] == ["python", "-m", "mlbench.network.shape", "--device", "eth0",
                                   "--bandwidth", "100000000bit", "--latency", "1000us"]
        assert init["securityContext"] == {
            "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}
        worker = pod["spec"]["containers"][0]
        assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert not {k for k in pod["metadata"].get("annotations") or {} if "bandwidth" in k}
    status = mlbench_cli("status", run.id).output
    assert "100 Mbit/s, 1 ms, emulated (init-container+tc: an init container with NET_ADMIN" in status


def test_cni_shaping_puts_the_rate_in_the_bandwidth_plugins_annotations(cluster):
    _, run_json, pods, _ = _run_and_pods(cluster, "--bandwidth", "1gbit", "--shaping", "cni")
    assert run_json["network"]["mechanism"] == "cni-bandwidth"
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        assert annotations["kubernetes.io/ingress-bandwidth"] == annotations["kubernetes.io/egress-bandwidth"] == "1G"
        assert "initContainers" not in pod["spec"]
    refused = mlbench_cli(*QUICK, "--bandwidth", "1gbit", "--latency", "1ms", "--shaping", "cni")
    assert refused.exit_code == 2 and "rate only" in refused.output
