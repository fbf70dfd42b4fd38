"""Pod specs where no node of this machine can show them (GPU nodes), and the data Job's program
run here as its pod runs it."""

from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mlbench.launch import k8s_data, k8s_objects
from mlbench.launch.k8s_objects import Placement, worker_pod
from tests.kube.conftest import write_epsilon_like
from tests.kube.images import QuietHandler

REPO = Path(__file__).resolve().parents[2]
OWNER = {"metadata": {"name": "mlbench-run-abc", "uid": "u-1", "namespace": "ns"}}


def placement(**changes) -> Placement:
    values = {"namespace": "ns", "image": "mlbench/worker:0.1.0-cuda", "nodes": 2, "cpu_millis": 3500,
              "memory_mib": 12000, "gpus": 1, "data_claim": "mlbench-data-cifar10"}
    return Placement(**{**values, **changes})


def test_a_gpu_worker_asks_for_one_gpu_and_tolerates_the_gpu_taint():
    pod = worker_pod("abc", 0, 2, 3, placement(), OWNER)
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == container["resources"]["requests"] == {
        "cpu": "3500m", "memory": "12000Mi", "ephemeral-storage": "2Gi", "nvidia.com/gpu": "1"}
    # GKE and EKS taint GPU nodes nvidia.com/gpu=present:NoSchedule; the device plugin serves the limit
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OMP_NUM_THREADS"] == "3" and env["HOME"] == "/tmp"


def test_a_cpu_worker_has_no_gpu_and_no_toleration():
    pod = worker_pod("abc", 1, 2, 1, placement(gpus=0, image="mlbench/worker:0.1.0"), OWNER)
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["limits"]
    assert "tolerations" not in pod["spec"]


def test_every_container_is_read_only_with_bounded_scratch_space():
    worker = worker_pod("abc", 0, 2, 1, placement(), OWNER)
    service = next(o for o in k8s_objects.service_objects("ns", "img", "w", "a") if o["kind"] == "Deployment")
    job = k8s_data.data_job("ns", "cifar10", "img", "mlbench-data-cifar10")
    for spec in (worker["spec"], service["spec"]["template"]["spec"], job["spec"]["template"]["spec"]):
        container = spec["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] == 1000
        assert {"ephemeral-storage"} <= set(container["resources"]["requests"]) & set(container["resources"]["limits"])
        assert all(v["emptyDir"].get("sizeLimit") for v in spec["volumes"] if "emptyDir" in v)
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert service["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1"


def test_workers_mount_the_data_claim_read_only_and_the_job_writes_it():
    worker = worker_pod("abc", 0, 2, 1, placement(), OWNER)["spec"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "mlbench-data-cifar10", "readOnly": True}} \
        in worker["volumes"]
    mounts = worker["containers"][0]["volumeMounts"]
    assert {"name": "data", "mountPath": "/var/cache/mlbench", "readOnly": True} in mounts
    assert not [v for v in worker_pod("abc", 0, 2, 1, placement(data_claim=None), OWNER)["spec"]["volumes"]
                if v["name"] == "data"]      # synthetic data: no volume
    job = k8s_data.data_job("ns", "epsilon", "img", "mine", mirror="http://mirror.example/")["spec"]["template"]["spec"]
    container = job["containers"][0]
    assert container["command"] == ["python", "-m", "mlbench.launch.k8s_data", "epsilon"]
    assert {"name": "data", "mountPath": "/var/cache/mlbench"} in container["volumeMounts"]
    assert {"name": "MLBENCH_DATA_MIRROR", "value": "http://mirror.example/"} in container["env"]
    assert job["volumes"][0] == {"name": "data", "persistentVolumeClaim": {"claimName": "mine"}}


def test_the_pods_of_a_checkpointing_run_are_built_from_run_json_and_mount_its_checkpoint_folder():
    """What the CLI creates and the supervisor again at a restart (worker_pods, from run.json):
    one pod per rank; with checkpoints, the run's own folder of the service's volume where the
    service sees it, CHECKPOINT_DIR/RUN_ID, which is also where the worker looks
    (checkpoint_root of its run folder, whose name is the run's id)."""
    from mlbench.launch.plan import RunRequest, build_config
    from mlbench.results.checkpoints import checkpoint_root
    from mlbench.run_config import RunDocument

    config, _ = build_config(RunRequest(task="task2a", workers=2, data="synthetic", checkpoint_every_steps=20))
    config.checkpoint_dir = k8s_objects.CHECKPOINT_DIR
    document = RunDocument(task="task2a", config=config, placement=placement(gpus=0, data_claim=None).to_dict())
    pods = k8s_objects.worker_pods("abc", document, OWNER)
    assert [p["metadata"]["name"] for p in pods] == [k8s_objects.pod_name("abc", r) for r in (0, 1)]
    for rank, pod in enumerate(pods):
        container = pod["spec"]["containers"][0]
        run_dir = "/etc/mlbench/runs/abc"
        assert container["command"] == ["python", "-m", "mlbench.worker", run_dir, "--rank", str(rank)]
        where = str(checkpoint_root(Path(run_dir), config.checkpoint_dir))
        assert where == "/var/lib/mlbench/checkpoints/abc"
        assert {"name": "checkpoints", "mountPath": where, "subPath": "checkpoints/abc"} in container["volumeMounts"]
        assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": k8s_objects.SERVICE}} \
            in pod["spec"]["volumes"]
    config.checkpoint_every_steps = None
    plain = k8s_objects.worker_pods("abc", RunDocument(task="task2a", config=config, placement=document.placement),
                                    OWNER)
    assert not [v for v in plain[0]["spec"]["volumes"] if v["name"] == "checkpoints"]
    # the service may create those pods again and give the ConfigMap the checkpoint to go on from
    rules = {(rule["resources"][0], verb) for rule in k8s_objects.role_rules() for verb in rule["verbs"]}
    assert {("pods", "create"), ("configmaps", "get"), ("configmaps", "patch")} <= rules
    assert not {r for r in rules if r[0] in ("secrets", "roles") or r[1] in ("update", "escalate")}


@pytest.fixture
def mirror(tmp_path):
    """A tiny epsilon-shaped pair under epsilon's names, served over HTTP on 127.0.0.1."""
    source = tmp_path / "mirror"
    source.mkdir()
    write_epsilon_like(source, n_train=300, n_test=100, features=8)
    handler = functools.partial(QuietHandler, directory=str(source))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield source, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def prepare(tmp_path, mirror_url: str) -> subprocess.CompletedProcess:
    """The Job's program, as its pod runs it: `python -m mlbench.launch.k8s_data epsilon`."""
    return subprocess.run([sys.executable, "-m", "mlbench.launch.k8s_data", "epsilon"], capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                                       "HOME": str(tmp_path), "MLBENCH_DATA": str(tmp_path / "volume"),
                                                       "MLBENCH_DATA_MIRROR": mirror_url})


def test_the_data_job_downloads_from_the_mirror_and_converts_once_with_progress(tmp_path, mirror):
    source, url = mirror
    data = tmp_path / "volume"
    proc = prepare(tmp_path, url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Preparing epsilon in {data} (source: {url})" in proc.stdout
    assert "Done in" in proc.stdout and "300 training and 100 test samples" in proc.stdout
    name = "epsilon_normalized.bz2"
    assert (data / "epsilon" / name).read_bytes() == (source / name).read_bytes()
    assert len(list((data / "libsvm-cache").glob("epsilon_normalized*/x.npy"))) == 2   # train and test, converted


def test_a_job_that_cannot_download_says_why_in_one_line(tmp_path, mirror):
    proc = prepare(tmp_path, mirror[1] + "absent/")
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1].startswith("Error: could not download epsilon (")


def test_a_ports_workers_run_its_module_and_tensorflows_get_every_peers_address_under_the_service():
    from mlbench.frameworks import JAX, TENSORFLOW
    from mlbench.worker.tf_worker import cluster_config

    cpu = placement(gpus=0, image="mlbench/worker:0.1.0-jax-tensorflow", data_claim=None)
    for framework, listening in ((JAX, [True, False]), (TENSORFLOW, [True, True])):
        pods = [worker_pod("abc", rank, 2, 1, cpu, OWNER, framework=framework) for rank in (0, 1)]
        containers = [pod["spec"]["containers"][0] for pod in pods]
        assert [c["command"] for c in containers] == [
            ["python", "-m", framework.worker, "/etc/mlbench/runs/abc", "--rank", str(rank)] for rank in (0, 1)]
        assert [bool(c["ports"]) for c in containers] == listening
        envs = [{e["name"]: e.get("value") for e in c["env"]} for c in containers]
        assert {env["MLBENCH_MASTER_ADDR"] for env in envs} == {"mlbench-run-abc-0.mlbench-run-abc"}
        assert all(("MLBENCH_PEERS" in env) is framework.peers for env in envs)
    # each pod's hostname under the run's headless Service (subdomain) is its peers' name for it
    assert [(pod["spec"]["hostname"], pod["spec"]["subdomain"]) for pod in pods] == [
        ("mlbench-run-abc-0", "mlbench-run-abc"), ("mlbench-run-abc-1", "mlbench-run-abc")]
    peers = envs[1]["MLBENCH_PEERS"]
    assert peers == "mlbench-run-abc-0.mlbench-run-abc:29500,mlbench-run-abc-1.mlbench-run-abc:29500"
    assert cluster_config(1, 2, peers) == {"cluster": {"worker": peers.split(",")},
                                           "task": {"type": "worker", "index": 1}}


def test_a_ports_image_is_the_variant_of_the_clusters_image_or_of_this_versions():
    from mlbench.cloud.image import framework_image, worker_image_tag
    from mlbench.errors import UsageError
    from mlbench.launch.kubernetes import worker_image
    from mlbench.version import __version__

    assert worker_image(None, 0, "jax") == f"mlbench/worker:{__version__}-jax" == worker_image_tag(frameworks=("jax",))
    assert worker_image(None, 1, "pytorch") == f"mlbench/worker:{__version__}-cuda"
    assert worker_image("registry.example:5000/team/worker:7", 0, "tensorflow") == \
        "registry.example:5000/team/worker:7-tensorflow"
    assert worker_image("registry.example:5000/worker", 0, "jax") == "registry.example:5000/worker:latest-jax"
    assert worker_image("team/worker:7", 0, "pytorch") == "team/worker:7"
    with pytest.raises(UsageError, match="by its digest"):
        framework_image("team/worker@sha256:" + "0" * 64, "jax")


def node(name: str, *taints: str, gpus: int = 0, cpu: str = "4"):
    """A node as the API server lists it (the client's model), with NoSchedule taints by key."""
    from kubernetes import client

    allocatable = {"cpu": cpu, "memory": "16Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return client.V1Node(metadata=client.V1ObjectMeta(name=name),
                         spec=client.V1NodeSpec(taints=[client.V1Taint(key=key, effect="NoSchedule")
                                                        for key in taints] or None),
                         status=client.V1NodeStatus(allocatable=allocatable))


def test_a_run_is_planned_on_the_nodes_its_pods_can_go_to():
    """KIND's control plane, tainted when the cluster has workers, and a node not ready are not
    nodes of a run (counted, they made a two-worker run's pods require a node each of three, one
    of them the control plane, where the second pod could never go); GPU nodes, which GKE and EKS
    taint nvidia.com/gpu, are a GPU run's nodes and not a CPU run's."""
    from mlbench.launch.kubernetes import placement_nodes

    def names(found):
        return [n.metadata.name for n in found[0]], found[1]

    kind = [node("control-plane", "node-role.kubernetes.io/control-plane", cpu="2"), node("worker"),
            node("worker2"), node("starting", "node.kubernetes.io/not-ready")]
    assert names(placement_nodes(kind, wants_gpu=True)) == (["worker", "worker2"], 0)
    mixed = [node("cpu-1"), node("cpu-2"), node("gpu-1", "nvidia.com/gpu", gpus=1),
             node("gpu-2", "nvidia.com/gpu", gpus=2)]
    assert names(placement_nodes(mixed, wants_gpu=True)) == (["gpu-1", "gpu-2"], 1)
    assert names(placement_nodes(mixed, wants_gpu=False)) == (["cpu-1", "cpu-2"], 0)   # --device cpu, the ports
    # without nodes to list (no permission), the GPUs the cluster was created with
    assert placement_nodes([], wants_gpu=True, gpus_per_node=1) == ([], 1)
    assert placement_nodes([], wants_gpu=False, gpus_per_node=1) == ([], 0)
