"""Runs on the current Kubernetes cluster: what `mlbench run | status | cancel | delete` do there.

The CLI, with the user's credentials: deploys the results service and the namespace's
NetworkPolicies once per cluster (see :mod:`mlbench.launch.k8s_objects`,
:mod:`mlbench.launch.k8s_policy`), fills the data set's volume once (:mod:`mlbench.launch.k8s_data`),
sizes the worker pods from the nodes' allocatable CPU, memory and GPUs, records the run with the
service, creates the run's ConfigMap, headless Service, NetworkPolicy and pods, and follows the
run through the service (progress lines as for a local run). The
service's supervisor (:mod:`mlbench.launch.k8s_supervisor`), inside the cluster, decides how the
run ended and deletes its objects, so a run ends properly even if this machine goes away
(``--detach`` relies on that). Runs are read through a local mirror of the service's store
(:class:`~mlbench.launch.k8s_mirror.ClusterStore`), so status and download are the local code.
"""

from __future__ import annotations

import base64
import math
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator

from mlbench.cloud.config import ClusterRecord, kube_api_client
from mlbench.cloud.existing import kube_error
from mlbench.errors import ClusterError, MlbenchError, UsageError
from mlbench.extras import needs
from mlbench.frameworks import FRAMEWORKS, PYTORCH
from mlbench.launch import k8s_objects as objects
from mlbench.launch import k8s_policy
from mlbench.launch.base import EventCallback, Launcher, LauncherOption, LaunchSettings, Progress
from mlbench.launch.faults import FAIL, RESTART, SHRINK
from mlbench.launch.follow import check_rank
from mlbench.launch.k8s_client import ResultsClient, read_object, transport_for
from mlbench.launch import k8s_data
from mlbench.launch.k8s_data import ensure_data
from mlbench.launch.k8s_mirror import ClusterStore
from mlbench.launch.k8s_supervisor import pod_state
from mlbench.launch.plan import LauncherAbilities, RunRequest, WorkerResources, build_config
from mlbench.network.settings import NetworkSettings
from mlbench.results.faults import KILL, SLOW
from mlbench.results.http_sink import run_token
from mlbench.results.store import RunRecord, RunStore
from mlbench.run_config import RunDocument
from mlbench.tasks.registry import get_task
from mlbench.tasks.spec import TaskSpec

if TYPE_CHECKING:
    from urllib3 import HTTPResponse

SERVICE_START_TIMEOUT = 300.0


def namespace_of(cluster: ClusterRecord) -> str:
    """Adopted clusters name their namespace; clusters mlbench created get ``mlbench``."""
    return str(cluster.extra.get("namespace") or objects.DEFAULT_NAMESPACE)


def _api_error(err: Exception, store: ClusterStore, doing: str) -> ClusterError:
    return kube_error(err, store.context, doing)


def _tokens(api: Any, namespace: str) -> dict[str, str] | None:
    """The service's tokens from its Secret, or None when it was never deployed."""
    secret = read_object(api, f"/api/v1/namespaces/{namespace}/secrets/{objects.SERVICE}")
    if secret is None:
        return None
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def mirror_home(cluster: ClusterRecord) -> Path:
    """Where this machine keeps its copy of the cluster's run store."""
    return RunStore().home / "clusters" / f"{cluster.provider}-{cluster.name}"


def open_store(cluster: ClusterRecord) -> ClusterStore:
    """The cluster's runs (catalog copied from its results service, when one is deployed)."""
    api = kube_api_client(cluster)
    namespace = namespace_of(cluster)
    where = f"cluster {cluster.name} (namespace {namespace})"
    store = ClusterStore(mirror_home(cluster), where, api=api, namespace=namespace,
                         context=cluster.context)
    try:
        tokens = _tokens(api, namespace)
    except Exception as err:
        raise _api_error(err, store, f"read the Secret {objects.SERVICE} in namespace {namespace}") from None
    if tokens:
        store.client = ResultsClient(transport_for(api, namespace), tokens[objects.ADMIN_TOKEN_KEY],
                                     where, namespace)
        store.sync_catalog()
    return store


def ensure_service(store: ClusterStore, image: str, progress: Progress,
                   shared_storage_class: str | None = None) -> None:
    """Deploy the results service unless it exists, and wait until it answers; its volume is
    ReadWriteMany of ``shared_storage_class`` when given (a claim made before keeps its mode)."""
    with needs("kubernetes"):
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

    core, ns = client.CoreV1Api(store.api), store.namespace
    rbac, apps = client.RbacAuthorizationV1Api(store.api), client.AppsV1Api(store.api)
    networking = client.NetworkingV1Api(store.api)
    try:
        try:
            core.read_namespace(ns)
        except ApiException as err:
            if err.status != 404:
                raise
            namespace = {"metadata": {"name": ns, "labels": objects.MANAGED}}
            # dict bodies: the client takes them, its annotations (kubernetes >= 37) name only its models
            core.create_namespace(namespace)  # type: ignore[arg-type, unused-ignore]
        tokens = _tokens(store.api, ns) or {objects.WORKER_TOKEN_KEY: secrets.token_urlsafe(32),
                                        objects.ADMIN_TOKEN_KEY: secrets.token_urlsafe(32)}
        create: dict[str, Callable[..., Any]] = {
            "ServiceAccount": core.create_namespaced_service_account,
            "Role": rbac.create_namespaced_role, "RoleBinding": rbac.create_namespaced_role_binding,
            "Secret": core.create_namespaced_secret,
            "PersistentVolumeClaim": core.create_namespaced_persistent_volume_claim,
            "Deployment": apps.create_namespaced_deployment, "Service": core.create_namespaced_service,
            "NetworkPolicy": networking.create_namespaced_network_policy}
        manifests = k8s_policy.namespace_policies(ns, k8s_policy.api_server_ips(core))
        manifests += objects.service_objects(ns, image, tokens[objects.WORKER_TOKEN_KEY],
                                             tokens[objects.ADMIN_TOKEN_KEY],
                                             shared_storage_class=shared_storage_class)
        for manifest in manifests:
            try:
                create[manifest["kind"]](ns, manifest)
                if manifest["kind"] == "Deployment":
                    progress(f"Starting the results service in namespace {ns} (once per cluster)...")
            except ApiException as err:
                if err.status != 409:  # exists already: deployed by an earlier run
                    raise
                if manifest["kind"] == "Role":   # an earlier version's gets this version's rules
                    _update_role(rbac, store, ns, manifest)
        _wait_available(apps, core, ns, image)
    except ApiException as err:
        raise _api_error(err, store, f"deploy the results service in namespace {ns}") from None
    store.client = ResultsClient(transport_for(store.api, ns), tokens[objects.ADMIN_TOKEN_KEY],
                                 store.where, ns)


def _update_role(rbac: Any, store: ClusterStore, ns: str, manifest: dict[str, Any]) -> None:
    """Give the service's Role the rules of this version (restarting a run's group needs more
    than an earlier version's Role allowed), when it has others."""
    current = rbac.read_namespaced_role(manifest["metadata"]["name"], ns)
    rules = [{key: value for key, value in rule.items() if value is not None}
             for rule in store.api.sanitize_for_serialization(current.rules or [])]
    if rules != manifest["rules"]:
        rbac.replace_namespaced_role(manifest["metadata"]["name"], ns, manifest)


def _wait_available(apps: Any, core: Any, ns: str, image: str) -> None:
    deadline = time.monotonic() + SERVICE_START_TIMEOUT
    while True:
        status = apps.read_namespaced_deployment_status(objects.SERVICE, ns).status
        if (status.available_replicas or 0) >= 1:
            return
        if time.monotonic() > deadline:
            pods = core.list_namespaced_pod(ns, label_selector=f"app.kubernetes.io/name={objects.SERVICE}")
            problems = [f"pod {p.metadata.name}: {pod_state(p).problem}" for p in pods.items
                        if pod_state(p).problem] or ["no pod became ready"]
            raise ClusterError(f"The results service did not start within {SERVICE_START_TIMEOUT / 60:.0f} "
                               f"minutes ({'; '.join(problems)}); check that the cluster can pull {image} "
                               "(`mlbench image build`, or --image) and rerun.")
        time.sleep(1.0)


def plan_resources(store: ClusterStore, cluster: ClusterRecord, request: RunRequest, image: str | None,
                   schedule_timeout_s: float) -> WorkerResources:
    """Pod sizes from the nodes: an equal share of the smallest node for each worker on it."""
    with needs("kubernetes"):
        from kubernetes import client
        from kubernetes.utils import parse_quantity

    try:
        nodes = [n for n in client.CoreV1Api(store.api).list_node().items
                 if not (n.spec and n.spec.unschedulable)]
    except Exception:
        nodes = []
    port = request.framework != PYTORCH.name   # the ports train on CPUs
    nodes, gpus = placement_nodes(nodes, wants_gpu=request.device != "cpu" and not port,
                                  gpus_per_node=int((cluster.extra.get("spec") or {}).get("gpus_per_node") or 0))
    if nodes:
        alloc = [(n.status and n.status.allocatable) or {} for n in nodes]
        cpu = int(min(parse_quantity(a.get("cpu", "1")) for a in alloc) * 1000)
        memory = int(min(parse_quantity(a.get("memory", "2Gi")) for a in alloc) / 2**20)
    else:
        cpu, memory = 1500, 2560
    count = len(nodes) or cluster.nodes or 1
    per_node = math.ceil(request.workers / count)
    cpu_millis = max(100, (cpu - min(500, cpu // 4)) // per_node // 100 * 100)
    placement = objects.Placement(
        namespace=store.namespace, nodes=count, cpu_millis=cpu_millis,
        memory_mib=max(512, int(memory * 0.8) // per_node), gpus=gpus,
        image=image or worker_image(cluster.image, gpus, request.framework), schedule_timeout_s=schedule_timeout_s)
    return WorkerResources(threads=max(1, cpu_millis // 1000), gpus=gpus, placement=placement.to_dict())


#: The taints worker pods with a GPU tolerate (k8s_objects.worker_pods).
GPU_TAINTS = ("nvidia.com/gpu",)


def placement_nodes(nodes: list[Any], wants_gpu: bool, gpus_per_node: int = 0) -> tuple[list[Any], int]:
    """The nodes (schedulable ``V1Node``s) a run's worker pods can go to, and the GPUs each pod
    gets (0 or 1): a pod gets a GPU when it wants one and a node it may go to has one (without
    nodes to ask, when the cluster was created with ``gpus_per_node``); it then goes to the nodes
    that have one. Nodes with a taint the pods do not tolerate are left out: a tainted control
    plane (KIND's when it has workers), a node not ready, and, for pods without a GPU, the GPU
    nodes (GKE and EKS taint them ``nvidia.com/gpu``)."""
    from kubernetes.utils import parse_quantity

    def gpus_of(node: Any) -> int:
        return int(parse_quantity(((node.status and node.status.allocatable) or {}).get("nvidia.com/gpu", "0")))

    gpu_capable = [n for n in nodes if not _repelling_taints(n, GPU_TAINTS)]
    most = max((gpus_of(n) for n in gpu_capable), default=0) if nodes else gpus_per_node
    if wants_gpu and most:
        return [n for n in gpu_capable if gpus_of(n)], 1
    return [n for n in nodes if not _repelling_taints(n, ())], 0


def _repelling_taints(node: Any, tolerated: tuple[str, ...]) -> list[str]:
    """The keys of ``node``'s taints that keep pods tolerating only ``tolerated`` off it."""
    return [t.key for t in (node.spec and node.spec.taints) or []
            if t.effect in ("NoSchedule", "NoExecute") and t.key not in tolerated]


def worker_image(cluster_image: str | None, gpus: int, framework: str) -> str:
    """The image of a run without ``--image``: the cluster's (``create-cluster --image``), else
    this version's (``mlbench image build``), as the variant with ``framework``'s port (its tag
    plus ``-jax``, ``-tensorflow``: ``mlbench image build --framework``)."""
    from mlbench.cloud.image import framework_image, worker_image_tag

    return framework_image(cluster_image or worker_image_tag(cuda=gpus > 0), framework)


def _claim_modes(store: ClusterStore, name: str) -> list[str] | None:
    """The access modes of the claim ``name`` in the run's namespace; None when there is none."""
    with needs("kubernetes"):
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

    try:
        claim = client.CoreV1Api(store.api).read_namespaced_persistent_volume_claim(name, store.namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise _api_error(err, store, f"read the claim {name} in namespace {store.namespace}") from None
    return list((claim.spec and claim.spec.access_modes) or [])


def _check_data_reachable(store: ClusterStore, request: RunRequest, nodes: int, shared: str | None) -> None:
    """Refuse, before anything is made or downloaded, a real data set on a claim that the run's
    pods, spread over several nodes, could not all mount: a ReadWriteOnce volume is attached to
    one node at a time (its pods elsewhere would wait for it until the run's scheduling timeout)."""
    task = get_task(request.task)
    if request.data != "real" or not isinstance(task, TaskSpec) or request.workers < 2 or nodes < 2:
        return
    dataset = task.settings.dataset
    name = request.data_pvc or k8s_data.claim_name(dataset)
    modes = _claim_modes(store, name)
    if modes is None and (request.data_pvc or shared):
        return   # --data-pvc: ensure_data names the missing claim; else mlbench makes it ReadWriteMany
    if modes is not None and any(mode in objects.READABLE_EVERYWHERE for mode in modes):
        return
    spread = f"{request.workers} workers on a cluster of {nodes} nodes"
    if request.data_pvc:
        raise UsageError(f"--data-pvc {name} is {', '.join(modes or [])}, which only pods on one node can mount, "
                         f"for {spread}; give a ReadOnlyMany or ReadWriteMany claim (NFS, Filestore, EFS)")
    if shared:
        raise ClusterError(f"{dataset} for {spread}: its claim {name} in namespace {store.namespace} was made "
                           f"ReadWriteOnce before the cluster had --shared-storage-class {shared}; delete it "
                           f"(`kubectl -n {store.namespace} delete pvc {name}`: the next run downloads {dataset} "
                           "again, onto a ReadWriteMany claim)")
    raise UsageError(f"{dataset} for {spread}: the data set's volume is ReadWriteOnce, which only pods on one "
                     "node can mount; give the cluster a ReadWriteMany storage class (add-cluster or "
                     "create-cluster --shared-storage-class), pass --data-pvc with a claim several nodes can "
                     "mount, or run on a one-node cluster")


def _data_claim(store: ClusterStore, request: RunRequest, image: str, progress: Progress,
                shared: str | None = None) -> str | None:
    """The claim holding the run's data set, filled first if needed (a claim mlbench makes is of the
    cluster's shared storage class when it has one); None for synthetic data."""
    task = get_task(request.task)
    if request.data != "real" or not isinstance(task, TaskSpec):
        if request.data_pvc:
            raise UsageError("--data-pvc names the volume of a real data set; leave it out with "
                             "--data synthetic and for task0a")
        return None
    try:
        return ensure_data(store.api, store.namespace, task.settings.dataset, image, request.data_pvc, progress,
                           shared)
    except MlbenchError:
        raise
    except Exception as err:
        raise _api_error(err, store, f"prepare the data set {task.settings.dataset} in namespace "
                                     f"{store.namespace}") from None


def launch(store: ClusterStore, run: RunRecord) -> None:
    """Create the run's ConfigMap, headless Service, NetworkPolicy and worker pods."""
    with needs("kubernetes"):
        from kubernetes import client

    document = RunDocument.load(run.run_dir)
    core, networking = client.CoreV1Api(store.api), client.NetworkingV1Api(store.api)
    # the client's create_* calls take plain dict bodies too: their annotations (kubernetes >= 37)
    # name only its models, hence the ignores below (unused where kubernetes is older, untyped)
    try:
        files = objects.plugin_files(document.config)
        configmap = objects.run_configmap(run.id, document.to_dict(), store.namespace,
                                          {path: (run.run_dir / path).read_bytes() for path in files})
        made = core.create_namespaced_config_map(store.namespace, configmap)  # type: ignore[arg-type, unused-ignore]
        owner = store.api.sanitize_for_serialization(made)
        tokens = _tokens(store.api, store.namespace)
        assert tokens is not None, "the service runs: its secret exists"
        secret = objects.run_secret(run.id, run_token(tokens[objects.WORKER_TOKEN_KEY], run.id), owner)
        core.create_namespaced_secret(store.namespace, secret)  # type: ignore[arg-type, unused-ignore]
        service = objects.run_service(run.id, owner)
        core.create_namespaced_service(store.namespace, service)  # type: ignore[arg-type, unused-ignore]
        policy = k8s_policy.run_policy(run.id, owner)
        networking.create_namespaced_network_policy(store.namespace, policy)  # type: ignore[arg-type, unused-ignore]
        for pod in objects.worker_pods(run.id, document, owner):
            core.create_namespaced_pod(store.namespace, pod)  # type: ignore[arg-type, unused-ignore]
    except Exception as err:
        error = _api_error(err, store, f"create the pods of run {run.id}")
        store.service().call("POST", f"/v1/runs/{run.id}/fail", {"reason": str(error)})
        raise error from None


#: how long `mlbench resume` of a cluster run waits for the objects of its last start to go
RESUME_WAIT_S = 120.0


def run_objects_left(store: ClusterStore, run_id: str) -> list[str]:
    """The objects of a run's last start still in its namespace ('Kind/name'): its pods, and
    the Service, ConfigMap, Secret and NetworkPolicy that a new start creates under the same names."""
    with needs("kubernetes"):
        from kubernetes import client

    def names(listed: Any) -> list[str]:
        return [o.metadata.name for o in listed.items if o.metadata is not None]

    core, networking = client.CoreV1Api(store.api), client.NetworkingV1Api(store.api)
    selector, ns = f"{objects.RUN_LABEL}={run_id}", store.namespace
    left: list[str] = []
    for kind, listing in (("Pod", core.list_namespaced_pod), ("Service", core.list_namespaced_service),
                          ("ConfigMap", core.list_namespaced_config_map), ("Secret", core.list_namespaced_secret)):
        left += [f"{kind}/{name}" for name in names(listing(ns, label_selector=selector))]
    policy = objects.run_name(run_id)   # labelled by nothing of the run's: found by its name
    left += [f"NetworkPolicy/{name}" for name in names(networking.list_namespaced_network_policy(ns))
             if name == policy]
    return left


def wait_objects_gone(store: ClusterStore, run_id: str, progress: Progress, timeout: float = RESUME_WAIT_S) -> None:
    """Wait (saying so) until the objects of the run's last start are gone: a resume right after
    a cancel finds them still being deleted, and the new start's would take their names."""
    deadline, said = time.monotonic() + timeout, False
    while True:
        try:
            left = run_objects_left(store, run_id)
        except Exception as err:
            raise _api_error(err, store, f"list the objects of run {run_id}") from None
        if not left:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"The objects of run {run_id}'s last start are still there after {timeout:.0f}s "
                               f"({', '.join(left)}); resume it once they are gone.")
        if not said:
            progress(f"Waiting for the objects of run {run_id}'s last start to go ({', '.join(left)})...")
            said = True
        time.sleep(2)


def pod_log(store: ClusterStore, run: RunRecord, rank: int, follow: bool) -> Iterator[str]:
    """A running worker's log, line by line, from its pod through the API server (the user's
    credentials need `get` on pods/log); with ``follow``, until the pod ends."""
    with needs("kubernetes"):
        from kubernetes import client

    name = objects.pod_name(run.id, rank)
    try:
        # without preloading, the client returns the urllib3 response (its annotation says str)
        core = client.CoreV1Api(store.api)
        response: HTTPResponse = core.read_namespaced_pod_log(  # type: ignore[assignment, unused-ignore]
            name, store.namespace, follow=follow, _preload_content=False)
    except Exception as err:
        raise _api_error(err, store, f"read the log of pod {name}") from None
    partial = b""
    try:
        for chunk in response.stream(1 << 14):
            *lines, partial = (partial + chunk).split(b"\n")
            yield from (line.decode(errors="replace") for line in lines)
        if partial:
            yield partial.decode(errors="replace")
    finally:
        response.release_conn()


class KubernetesLauncher(Launcher):
    """Runs on the current cluster: a pod per worker plus a headless Service, followed through
    the cluster's results service (whose supervisor sees every run to its end and deletes its
    pods, so a run ends properly even if this machine goes away)."""

    name = "kubernetes"
    label = "cluster"
    how_to_choose = "choose a cluster with `mlbench set-cluster` first"
    options = (LauncherOption("--image", "image", "Worker image on a cluster [the cluster's, else "
                                                  "mlbench/worker:VERSION; with --framework F, "
                                                  "that image's -F variant]."),)
    follow_seconds = 2.0
    # the cluster's supervisor deletes a killed rank's pod, records a straggler's windows and
    # restarts the group (or the survivors: a shrink) from the newest checkpoint, which the pods
    # keep on the service's volume (k8s_supervisor); a pod cannot be stopped from outside
    # every framework whose port the image has (its variant: `worker_image`); every worker pod
    # has an address of its own, which the headless Service names (TensorFlow's peers)
    abilities = LauncherAbilities(frameworks=tuple(FRAMEWORKS), peer_addresses=True,
                                  fault_kinds=(KILL, SLOW), policies=(FAIL, RESTART, SHRINK),
                                  checkpoint_dir=objects.CHECKPOINT_DIR)
    plugin_limit = objects.PLUGIN_LIMIT  # a plug-in's source travels in the run's ConfigMap
    resumable = True  # the service makes the run ready from the checkpoints on its volume
    unreachable_seconds = 120.0  # the API server or the service blipped; the run goes on in the cluster

    def __init__(self, store: RunStore, settings: LaunchSettings | None = None,
                 cluster: ClusterRecord | None = None):
        """``cluster``: the cluster whose mirror ``store`` is (None: the current one). Besides
        ``image``, ``settings.options`` may hold ``schedule_timeout_s``, how long a pod may wait
        for a node before the run fails."""
        super().__init__(store, settings)
        assert isinstance(store, ClusterStore), "a cluster's runs are kept in its mirror"
        self.cluster_store: ClusterStore = store
        self.cluster = cluster

    @classmethod
    def serves(cls, store: RunStore) -> bool:
        return isinstance(store, ClusterStore)

    @classmethod
    def chosen_by(cls) -> str:
        return "the current cluster (`mlbench set-cluster --local` chooses this machine)"

    @classmethod
    def chosen(cls, store: RunStore, values: dict[str, Any]) -> bool:
        """A current cluster chooses this launcher (its store is the cluster's)."""
        return cls.serves(store)

    def occupied_nodes(self, request: RunRequest, resources: WorkerResources | None) -> int:
        """A pod per worker, spread over at most the nodes the plan saw."""
        nodes = int(((resources.placement if resources else None) or {}).get("nodes") or request.workers)
        return max(1, min(request.workers, nodes))

    def network_record(self, settings: NetworkSettings) -> dict[str, Any]:
        from mlbench.network.kube import cluster_record

        return cluster_record(settings)

    def create(self, request: RunRequest) -> RunRecord:
        """Validate the request for the cluster, deploy the service and fill the data set's
        volume if needed, record a pending run."""
        from mlbench.cloud.config import current_cluster

        cluster = self.cluster or current_cluster()
        if cluster is None:
            raise UsageError("no cluster is current; choose one with `mlbench set-cluster NAME`")
        if request.data_dir is not None and request.data == "real":
            raise UsageError("--data-dir names a folder on this machine, which the cluster's pods cannot "
                             "see; leave it out (the data set is downloaded once onto a volume of the "
                             "cluster), use --data-pvc for a volume you filled, or run locally with "
                             "`mlbench set-cluster --local`")
        if request.save_model:
            raise UsageError("--save-model keeps parameters in a local run folder, which pods do not have; "
                             "run locally (`mlbench set-cluster --local`) to save models")
        store, progress = self.cluster_store, self.settings.progress
        options = self.settings.options
        resources = plan_resources(store, cluster, request, options.get("image"),
                                   float(options.get("schedule_timeout_s") or objects.SCHEDULE_TIMEOUT_S))
        config, _ = build_config(request, resources)  # usage errors before anything is deployed or downloaded
        self.abilities.check(config, self.label)
        nodes = int(resources.placement["nodes"])
        shared = cluster.shared_storage_class
        spread = bool(config.checkpoints) and nodes > 1   # pods on several nodes mount the checkpoints
        if spread and not shared:
            # the service's volume is ReadWriteOnce: pods on another node than the service's cannot mount it
            raise UsageError(f"--checkpoint-every on a cluster of {nodes} nodes: the checkpoints are kept on the "
                             "results service's volume, which only pods on its node can mount; give the "
                             "cluster a ReadWriteMany storage class (add-cluster or create-cluster "
                             "--shared-storage-class), or run on a one-node cluster, on this machine or under "
                             "Slurm")
        _check_data_reachable(store, request, nodes, shared)
        service_modes = _claim_modes(store, objects.SERVICE) if spread else None
        if service_modes is not None and objects.SHARED_ACCESS not in service_modes:
            raise ClusterError(f"--checkpoint-every on a cluster of {nodes} nodes: the results service's volume in "
                               f"namespace {store.namespace} was made ReadWriteOnce before the cluster had "
                               f"--shared-storage-class {shared}, and a claim cannot change its mode; download "
                               f"the runs you keep, delete the service (`kubectl -n {store.namespace} delete "
                               f"deployment,pvc {objects.SERVICE}`) and run again")
        ensure_service(store, resources.placement["image"], progress, shared)
        resources.placement["data_claim"] = _data_claim(store, request, resources.placement["image"], progress,
                                                        shared)
        return self.record(request, resources, check_data=False)

    def prepare_resume(self, record: RunRecord, max_steps: int | None = None) -> RunRecord:
        """A cluster run's folder and checkpoints are on its results service's volume: the service
        makes the run ready (:func:`~mlbench.launch.base.reopen_from_checkpoint`, its ``/resume``)
        once the objects of its last start are gone; :meth:`run_attached` or
        :meth:`start_detached` then creates its objects as for a new start, from the run.json that
        names the checkpoint, and its pods mount the run's checkpoint folder as before."""
        store = self.cluster_store
        if not record.active:
            wait_objects_gone(store, record.id, self.settings.progress)
        return store.resume(record.id, max_steps)

    def run_attached(self, record: RunRecord, on_event: EventCallback | None = None) -> RunRecord:
        """Start the run's pods and follow it to its end (Ctrl-C cancels it)."""
        try:
            launch(self.cluster_store, record)
            return self.follow(self.store.get(record.id), on_event)
        except KeyboardInterrupt:
            return self.cancel(record)

    def start_detached(self, record: RunRecord) -> None:
        """Start the run's pods and return; the service's supervisor sees the run to its end."""
        launch(self.cluster_store, record)

    def cancel(self, record: RunRecord) -> RunRecord:
        """End an active run as cancelled; the service deletes its pods."""
        self.cluster_store.service().call("POST", f"/v1/runs/{record.id}/cancel")
        return self.cluster_store.sync_run(record.id)

    def reconcile(self, record: RunRecord) -> RunRecord:
        """The run as the service knows it now (its folder copied here)."""
        return self.cluster_store.sync_run(record.id)

    def logs(self, record: RunRecord, rank: int, follow: bool = False) -> Iterator[str]:
        """A running worker's log from its pod; an ended one's from the run store, where the
        service's supervisor saved it. Followed while its pod cannot give a log yet (it waits
        for a node or an image), the log shows when the run ends."""
        check_rank(record, rank)
        if record.active:
            try:
                lines = pod_log(self.cluster_store, record, rank, follow)
                first = next(lines, None)
            except ClusterError:
                if not follow:
                    raise
            else:
                if first is not None:
                    yield first
                yield from lines
                return
        yield from super().logs(record, rank, follow)
