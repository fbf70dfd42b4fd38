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
import subprocess
import sys

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
     "which only pods on its node can mount; give the cluster a ReadWriteMany storage class (add-cluster or "
     "create-cluster --shared-storage-class), or run on a one-node cluster, on this machine or under Slurm"),
    (("--on-failure", "restart"),   # which checkpoints (every 2 minutes when not told)
     "Error: --checkpoint-every on a cluster of 2 nodes: the checkpoints are kept on the results service's volume, "
     "which only pods on its node can mount; give the cluster a ReadWriteMany storage class (add-cluster or "
     "create-cluster --shared-storage-class), or run on a one-node cluster, on this machine or under Slurm"),
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


# -- checkpoints on several nodes ---------------------------------------------------------------

SHARED_CLASS = "harness-rwx"
CHECKPOINTED = ("run", "task2a", "2", "--data", "synthetic", "--max-steps", "60", "--checkpoint-every", "20steps",
                "--log-every", "20")


def test_a_cluster_with_a_shared_storage_class_lets_runs_on_several_nodes_checkpoint(cluster, kube_local):
    """With a ReadWriteMany class for the results service's volume (``add-cluster
    --shared-storage-class``), the pods of a run on several nodes can all mount its checkpoints: a
    run that checkpoints on the harness's two nodes is accepted, the service's claim is of that
    class, and each pod mounts the run's folder of it. A
    class the cluster lacks is refused when the cluster is added; a service whose volume an earlier
    run made ReadWriteOnce is named, with how to replace it (a claim cannot change its mode). The
    data set's claim too: without a ReadWriteMany class, a run of real data whose pods spread over
    several nodes is refused before anything is made (its pods on the other nodes would wait for the
    volume until the run's scheduling timeout), as is a ReadWriteOnce --data-pvc, or claim made before
    the class."""
    core = cluster.core
    epsilon = ("run", "task2a", "2", "--max-steps", "10")   # the real epsilon, downloaded onto a claim
    refused = mlbench_cli(*epsilon)
    assert refused.exit_code == 2 and refused.output.strip() == (
        "Error: epsilon for 2 workers on a cluster of 2 nodes: the data set's volume is ReadWriteOnce, which only "
        "pods on one node can mount; give the cluster a ReadWriteMany storage class (add-cluster or create-cluster "
        "--shared-storage-class), pass --data-pvc with a claim several nodes can mount, or run on a one-node "
        "cluster"), refused.output
    try:
        client.StorageV1Api(cluster.api).create_storage_class(
            {"metadata": {"name": SHARED_CLASS}, "provisioner": "example.com/harness-nfs"})
    except client.ApiException as err:
        if err.status != 409:
            raise
    try:
        core.create_namespace({"metadata": {"name": cluster.namespace}})
    except client.ApiException as err:
        if err.status != 409:
            raise
    adopt = ("add-cluster", "shared", "--context", "kube-local", "--kubeconfig", str(kube_local),
             "--namespace", cluster.namespace, "--image", "mlbench/worker:test")
    missing = mlbench_cli(*adopt, "--shared-storage-class", "no-such-class")
    assert missing.exit_code == 2 and missing.output.strip() == (
        "Error: The cluster of context 'kube-local' has no storage class 'no-such-class' (`kubectl get "
        "storageclass` lists those it has); give a ReadWriteMany class, e.g. GKE's standard-rwx (Filestore) "
        "or an EFS or NFS class."), missing.output
    assert mlbench_cli(*adopt, "--shared-storage-class", SHARED_CLASS).exit_code == 0
    assert mlbench_cli("set-cluster", "existing", "shared").exit_code == 0

    # claims made ReadWriteOnce, before the class: the data set's (mlbench's, and one passed with --data-pvc)
    core.create_namespaced_persistent_volume_claim(cluster.namespace, {
        "metadata": {"name": "mlbench-data-epsilon"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    before = mlbench_cli(*epsilon)
    assert before.exit_code == 1 and before.output.strip() == (
        f"Error: epsilon for 2 workers on a cluster of 2 nodes: its claim mlbench-data-epsilon in namespace "
        f"{cluster.namespace} was made ReadWriteOnce before the cluster had --shared-storage-class {SHARED_CLASS}; "
        f"delete it (`kubectl -n {cluster.namespace} delete pvc mlbench-data-epsilon`: the next run downloads "
        "epsilon again, onto a ReadWriteMany claim)"), before.output
    mine = mlbench_cli(*epsilon, "--data-pvc", "mlbench-data-epsilon")
    assert mine.exit_code == 2 and mine.output.strip() == (
        "Error: --data-pvc mlbench-data-epsilon is ReadWriteOnce, which only pods on one node can mount, for 2 "
        "workers on a cluster of 2 nodes; give a ReadOnlyMany or ReadWriteMany claim (NFS, Filestore, EFS)"
    ), mine.output
    assert [d.metadata.name for d in client.AppsV1Api(cluster.api).list_namespaced_deployment(cluster.namespace).items
            ] == []   # refused before anything was made

    # the service's volume as a run before the class made it: ReadWriteOnce
    core.create_namespaced_persistent_volume_claim(cluster.namespace, {
        "metadata": {"name": "mlbench-results"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}}})
    old = mlbench_cli(*CHECKPOINTED)
    assert old.exit_code == 1 and old.output.strip().splitlines()[-1] == (
        f"Error: --checkpoint-every on a cluster of 2 nodes: the results service's volume in namespace "
        f"{cluster.namespace} was made ReadWriteOnce before the cluster had --shared-storage-class {SHARED_CLASS}, "
        "and a claim cannot change its mode; download the runs you keep, delete the service (`kubectl -n "
        f"{cluster.namespace} delete deployment,pvc mlbench-results`) and run again"), old.output
    assert client.AppsV1Api(cluster.api).list_namespaced_deployment(cluster.namespace).items == []  # said first
    core.delete_namespaced_persistent_volume_claim("mlbench-results", cluster.namespace)
    # its pvc-protection finalizer goes once no pod uses it (none did): that controller does not
    # run on this control plane, so the test removes it, as the controller would
    core.patch_namespaced_persistent_volume_claim("mlbench-results", cluster.namespace,
                                                  {"metadata": {"finalizers": None}})
    wait_for(lambda: not [c for c in core.list_namespaced_persistent_volume_claim(cluster.namespace).items
                          if c.metadata.name == "mlbench-results"], 60, "the old claim to go")

    # the stand-in kubelet maps a volume's mount path to a folder, but not the checkpoint folder
    # that run.json names inside the pod: the workers would write their checkpoints to this
    # machine's /var/lib/mlbench. Their pods are held (unschedulable) instead, and checked as the
    # API server stores them; writing and reading the checkpoints, restarts and resumes are the
    # one-node cluster's code, run on the real node (tests/kube/test_node_runs.py)
    cluster.harness.hold("app.kubernetes.io/name", "mlbench-worker")
    started = mlbench_cli(*CHECKPOINTED, "--detach")
    assert started.exit_code == 0, explain(cluster, started)
    claim = core.read_namespaced_persistent_volume_claim("mlbench-results", cluster.namespace)
    assert (claim.spec.access_modes, claim.spec.storage_class_name) == (["ReadWriteMany"], SHARED_CLASS)
    run_id = started_run_id(started.output)
    wait_for(lambda: len(core.list_namespaced_pod(cluster.namespace, label_selector=f"mlbench/run={run_id}").items)
             == 2, 60, "the run's pods")
    for rank in (0, 1):
        spec = cluster.api.sanitize_for_serialization(
            core.read_namespaced_pod(pod_name(run_id, rank), cluster.namespace))["spec"]
        assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "mlbench-results"}} in spec["volumes"]
        mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "checkpoints")
        assert mount == {"name": "checkpoints", "mountPath": f"/var/lib/mlbench/checkpoints/{run_id}",
                         "subPath": f"checkpoints/{run_id}"}
        assert spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]  # 2 nodes
    assert mlbench_cli("cancel", run_id).exit_code == 0
    final = follow_to_end(cluster, run_id)
    assert final.state == "cancelled", final.reason
    wait_for(lambda: not cluster.run_objects(run_id), 30, "the run's objects to be deleted")


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


def status_in_a_fresh_interpreter(run_id: str) -> str:
    """`mlbench status RUN` as a user's shell runs it, asserting what it imported: the service's
    Secret is read without the client's typed API classes and models (kubernetes.client.CoreV1Api
    imports some 250 models, about a CPU-second, which every command on a cluster used to pay for
    that one read)."""
    shown = subprocess.run([sys.executable, "-X", "importtime", "-m", "mlbench", "status", run_id],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in shown.stderr.splitlines()
                if line.startswith("import time:")}
    models = sorted(name for name in imported if name.startswith("kubernetes.client.models."))
    assert "kubernetes.config.kube_config" in imported and not models, models[:5]
    return shown.stdout


def test_an_evicted_pod_ends_the_run_as_failed_with_the_pods_reason(cluster):
    run_id = start_long_run(cluster)
    assert re.search(r"state\s+running", status_in_a_fresh_interpreter(run_id))   # live, from the service
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
