"""`mlbench run | status | download | delete` on a cluster: a real kube-apiserver, pods run by the
harness kubelet, events through the results service (tests/kube/conftest.py)."""

from __future__ import annotations

import json
import re
import zipfile

import pytest
from kubernetes import client

from mlbench.launch import kubernetes
from mlbench.launch.k8s_objects import pod_name, run_name
from mlbench.launch.plan import RunRequest
from mlbench.results.events import read_run_events
from tests.kube.conftest import mlbench_cli, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.timeout(600),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


def started_run_id(output: str) -> str:
    return re.search(r"Started run ([0-9a-f]+)", output).group(1)


def explain(cluster, result=None) -> str:
    """What a failing assertion needs: the CLI's output, the harness's errors, the pods' logs."""
    logs = {p.name: p.log.read_text()[-1500:] for p in cluster.harness.pods.values() if p.log.exists()}
    return f"{result.output if result else ''}\nharness: {cluster.harness.errors}\nlogs: {json.dumps(logs, indent=1)}"


def test_a_two_worker_run_trains_in_pods_and_its_results_outlive_them(cluster, tmp_path):
    result = mlbench_cli("run", "task2a", "2", "--data", "synthetic", "--max-steps", "60", "--log-every", "10")
    assert result.exit_code == 0, explain(cluster, result)
    assert f"Starting the results service in namespace {cluster.namespace}" in result.output
    assert "2 worker(s) x 1 thread(s), cpu/gloo" in result.output
    assert re.search(r"step\s+60\s+loss", result.output), result.output   # live progress lines
    assert "Finished (max-steps): 60 steps" in result.output

    store = kubernetes.open_store(cluster.record)
    run = store.list()[-1]
    assert run.state == "finished" and run.launcher == "kubernetes" and run.result["steps"] == 60

    # what the launcher created, as the API server stored it
    seen = cluster.harness.seen
    configmap, service = seen[f"ConfigMap/{run_name(run.id)}"], seen[f"Service/{run_name(run.id)}"]
    run_json = json.loads(configmap["data"]["run.json"])
    assert run_json["id"] == run.id and run_json["config"]["workers"] == 2
    assert run_json["placement"] == {
        "launcher": "kubernetes", "namespace": cluster.namespace, "image": "mlbench/worker:test", "nodes": 2,
        "cpu_millis": 1500, "memory_mib": 3276, "gpus": 0, "schedule_timeout_s": 600.0}
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert service["spec"]["selector"] == {"mlbench/run": run.id}
    for rank in (0, 1):
        pod = seen[f"Pod/{pod_name(run.id, rank)}"]
        spec, container = pod["spec"], pod["spec"]["containers"][0]
        assert container["command"] == ["python", "-m", "mlbench.worker", "/etc/mlbench/run", "--rank", str(rank)]
        assert container["image"] == "mlbench/worker:test"
        assert container["resources"]["requests"] == container["resources"]["limits"] == \
            {"cpu": "1500m", "memory": "3276Mi"}
        env = {e["name"]: e.get("value") or e["valueFrom"] for e in container["env"]}
        assert env["MLBENCH_RESULTS_URL"] == f"http://mlbench-results.{cluster.namespace}.svc:8080"
        assert env["MLBENCH_RESULTS_TOKEN"] == {"secretKeyRef": {"name": run_name(run.id), "key": "token"}}
        assert env["MLBENCH_MASTER_ADDR"] == f"{pod_name(run.id, 0)}.{run_name(run.id)}"
        assert env["MLBENCH_BIND_ADDR"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
        assert env["OMP_NUM_THREADS"] == "1"
        anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert anti == [{"labelSelector": {"matchLabels": {"mlbench/run": run.id}},
                         "topologyKey": "kubernetes.io/hostname"}]
        assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert (spec["hostname"], spec["subdomain"]) == (pod_name(run.id, rank), run_name(run.id))
        assert pod["metadata"]["ownerReferences"][0]["uid"] == configmap["metadata"]["uid"]

    # the run ended: everything it created is gone, the service stays
    wait_for(lambda: not cluster.run_objects(run.id), 15, "the run objects to be deleted: " + explain(cluster))
    assert cluster.core.read_namespaced_service("mlbench-results", cluster.namespace)

    # events came through the results service, onto its volume, exactly once
    stored = read_run_events(cluster.service_folder() / "runs" / run.id)
    for rank in (0, 1):
        seqs = [e["seq"] for e in stored if e["rank"] == rank]
        assert seqs == sorted(set(seqs)) and len(seqs) > 5
    assert {e["name"] for e in stored} >= {"result", "environment", "train/loss", "time/communication"}
    assert read_run_events(run.run_dir) == stored        # the local mirror has the same

    table = mlbench_cli("status")
    assert re.search(rf"{run.id}\s+task2a-2w-\w+\s+task2a\s+2\s+finished", table.output), table.output
    details = mlbench_cli("status", run.id[:5])
    assert details.exit_code == 0 and "communication/compute" in details.output
    archive = tmp_path / "run.zip"
    assert mlbench_cli("download", run.id, "-o", str(archive)).exit_code == 0
    with zipfile.ZipFile(archive) as zf:
        assert {"run.json", "metrics.csv", "events/rank-0.jsonl", "events/rank-1.jsonl"} <= set(zf.namelist())
        doc = json.loads(zf.read("run.json"))
        assert doc["state"] == "finished" and doc["result"]["steps"] == 60
        assert doc["placement"]["launcher"] == "kubernetes"

    assert mlbench_cli("delete", run.id, "--yes").exit_code == 0
    assert not (cluster.service_folder() / "runs" / run.id).exists() and not run.run_dir.exists()
    assert mlbench_cli("status", run.id).exit_code == 2


def follow_to_end(cluster, run_id: str, timeout: float = 60):
    store = kubernetes.open_store(cluster.record)
    return wait_for(lambda: (lambda r: r if not r.active else None)(store.sync_run(run_id)), timeout,
                    f"run {run_id} to end: {explain(cluster)}")


def start_long_run(cluster) -> str:
    """A detached task1a run (164 epochs: it trains until the test ends it), once both pods run."""
    result = mlbench_cli("run", "task1a", "2", "--data", "synthetic", "--detach")
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


def test_deleting_a_running_run_removes_every_object_it_created(cluster):
    run_id = start_long_run(cluster)
    assert sorted(cluster.run_objects(run_id)) == [f"ConfigMap/{run_name(run_id)}", f"Pod/{pod_name(run_id, 0)}",
                                                   f"Pod/{pod_name(run_id, 1)}", f"Secret/{run_name(run_id)}",
                                                   f"Service/{run_name(run_id)}"]
    result = mlbench_cli("delete", run_id, "--yes")
    assert result.exit_code == 0 and f"Deleted run {run_id}" in result.output
    # deleted at once: pods, Service, ConfigMap; the run's Secret goes with its owner, the ConfigMap
    assert cluster.run_objects(run_id) in ([], [f"Secret/{run_name(run_id)}"])
    wait_for(lambda: cluster.run_objects(run_id) == [], 30, "the garbage collector to delete the run's Secret")
    wait_for(lambda: all(p.proc.poll() is not None for p in cluster.harness.pods.values()
                         if p.name.startswith(run_name(run_id))), 15, "the workers to be stopped")
    assert not (cluster.service_folder() / "runs" / run_id).exists()
    assert mlbench_cli("status", run_id).exit_code == 2
    assert "mlbench-results" in [d.metadata.name for d in
                                 client.AppsV1Api(cluster.api).list_namespaced_deployment(cluster.namespace).items]


def test_a_run_that_never_schedules_fails_after_its_timeout_with_the_reason(cluster):
    cluster.harness.hold("app.kubernetes.io/name", "mlbench-worker")
    store = kubernetes.open_store(cluster.record)
    run = kubernetes.create_run(store, cluster.record, RunRequest(task="task2a", workers=2, data="synthetic"),
                                schedule_timeout_s=3)
    kubernetes.start_detached(store, run)
    final = follow_to_end(cluster, run.id, timeout=30)
    assert final.state == "failed"
    assert final.reason == (f"worker 0 (pod {pod_name(run.id, 0)}) did not start within 3s: Unschedulable: "
                            "0/2 nodes are available: 2 Insufficient cpu.")
    wait_for(lambda: not cluster.run_objects(run.id), 15, "the run's objects to be deleted")
