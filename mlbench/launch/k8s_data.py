"""Data sets on a cluster: one copy per cluster, not one per worker pod.

Each data set lives on its own PersistentVolumeClaim in the runs' namespace
(``mlbench-data-<dataset>``). Before the first run that needs it, the CLI creates the claim and a
Job that runs ``python -m mlbench.launch.k8s_data DATASET`` in the worker image: the product's
own loader downloads the data set into the volume (from its official site, or from the mirror in
``MLBENCH_DATA_MIRROR``) and converts it once (epsilon's binary cache), printing progress to its
log, which the CLI shows. When the Job succeeds, the claim is marked ready (an annotation) and
the Job is deleted; every later run mounts the claim read-only into all its worker pods, so the
second run starts no Job. ``--data-pvc NAME`` names a claim the user filled (the files in the
folder layout below): the same Job then only converts what is there, once.

Layout on a claim, as in ``$MLBENCH_DATA`` on a laptop: ``cifar10/cifar-10-batches-py/...``,
``epsilon/epsilon_normalized[.bz2]`` and ``epsilon_normalized.t[.bz2]``, ``libsvm-cache/``.

Claims are ReadWriteOnce, which every default storage class provides: pods on one node share it.
Worker pods spread over several nodes need a claim that several nodes can mount (ReadOnlyMany or
ReadWriteMany, e.g. NFS, Filestore, EFS): on a cluster with a ``--shared-storage-class`` the claims
mlbench makes are ReadWriteMany of that class; else fill one and pass it with ``--data-pvc``. A run
whose pods would spread over several nodes without either is refused before anything is made.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from mlbench.errors import ClusterError, UsageError
from mlbench.launch.k8s_objects import (DATA_DIR, MANAGED, SCHEDULE_TIMEOUT_S, claim_spec, container_security,
                                        pod_security, scratch_volume)
from mlbench.launch.k8s_supervisor import pod_state

READY = "mlbench/data-ready"         # the claim's annotation: the data sets it holds, complete
SIZES = {"epsilon": "40Gi", "cifar10": "2Gi"}  # epsilon: 12 GB of bz2, its text and the float32 cache
JOB_DEADLINE_S = 6 * 3600
POLL_S = 2.0
MIRROR_ENV = "MLBENCH_DATA_MIRROR"
LABELS = {"app.kubernetes.io/name": "mlbench-data", **MANAGED}
Progress = Callable[[str], None]


def claim_name(dataset: str) -> str:
    return f"mlbench-data-{dataset}"


def job_name(dataset: str) -> str:
    return f"mlbench-data-{dataset}"


def data_claim(namespace: str, dataset: str, shared_storage_class: str | None = None) -> dict[str, Any]:
    """The claim a data set is downloaded into: ReadWriteMany of the cluster's shared storage
    class when it has one (pods on every node read it), else ReadWriteOnce."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim_name(dataset), "namespace": namespace, "labels": LABELS},
            "spec": claim_spec(SIZES.get(dataset, "10Gi"), shared_storage_class)}


def data_job(namespace: str, dataset: str, image: str, claim: str, mirror: str | None = None) -> dict[str, Any]:
    """The Job that downloads and converts ``dataset`` into ``claim`` (runs as the workers do)."""
    env = [{"name": "MLBENCH_DATA", "value": DATA_DIR}, {"name": "HOME", "value": "/tmp"},
           {"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}]
    if mirror:
        env.append({"name": MIRROR_ENV, "value": mirror})
    container = {
        "name": "prepare", "image": image, "command": ["python", "-m", "mlbench.launch.k8s_data", dataset],
        "env": env, "securityContext": container_security(),
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"},
                      "limits": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "2Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
        "terminationMessagePolicy": "FallbackToLogsOnError"}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job_name(dataset), "namespace": namespace, "labels": LABELS},
            "spec": {"backoffLimit": 1, "activeDeadlineSeconds": JOB_DEADLINE_S, "template": {
                "metadata": {"labels": LABELS},
                "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                         "securityContext": pod_security(), "containers": [container],
                         "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}},
                                     scratch_volume("1Gi")]}}}}


def _ready(claim: Any) -> set[str]:
    return set(((claim.metadata.annotations or {}).get(READY) or "").split(",")) - {""}


def ensure_data(api: Any, namespace: str, dataset: str, image: str, claim: str | None = None,
                progress: Progress = lambda _: None, shared_storage_class: str | None = None) -> str:
    """The claim holding ``dataset``, filled by a Job first unless it is already (returns its name);
    a claim mlbench makes is of ``shared_storage_class`` when given (:func:`data_claim`)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    name = claim or claim_name(dataset)
    try:
        found = core.read_namespaced_persistent_volume_claim(name, namespace)
    except ApiException as err:
        if err.status != 404:
            raise
        if claim:
            raise UsageError(f"--data-pvc {claim}: there is no PersistentVolumeClaim {claim} in namespace "
                             f"{namespace}; create and fill it first (see `mlbench run --help`)") from None
        body = data_claim(namespace, dataset, shared_storage_class)
        # dict bodies: the client takes them, its annotations (kubernetes >= 37) name only its models
        found = core.create_namespaced_persistent_volume_claim(namespace, body)  # type: ignore[arg-type, unused-ignore]
    if dataset in _ready(found):
        return name
    try:
        job = data_job(namespace, dataset, image, name, os.environ.get(MIRROR_ENV))
        batch.create_namespaced_job(namespace, job)  # type: ignore[arg-type, unused-ignore]  # a dict body, as above
    except ApiException as err:
        if err.status != 409:  # another `mlbench run` started it: follow that one
            raise
    progress(f"Preparing {dataset} on the volume claim {name} in namespace {namespace} (once per cluster); "
             f"the Job's log:")
    try:
        _follow(core, batch, namespace, dataset, progress)
    except BaseException:
        _delete_job(batch, namespace, dataset)
        raise
    ready = sorted(_ready(core.read_namespaced_persistent_volume_claim(name, namespace)) | {dataset})
    core.patch_namespaced_persistent_volume_claim(name, namespace,
                                                  {"metadata": {"annotations": {READY: ",".join(ready)}}})
    _delete_job(batch, namespace, dataset)
    progress(f"{dataset} is ready on {name}; runs mount it read-only.")
    return name


def _follow(core: Any, batch: Any, namespace: str, dataset: str, progress: Progress) -> None:
    """Print the Job's new log lines until it succeeds; raise with the reason when it fails."""
    printed: dict[str, int] = {}
    while True:
        job = batch.read_namespaced_job_status(job_name(dataset), namespace)
        pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name(dataset)}").items
        for pod in pods:
            _print_new_lines(core, namespace, pod, printed, progress)
        if job.status.succeeded:
            return
        failed = [c for c in job.status.conditions or [] if c.type == "Failed" and c.status == "True"]
        waiting = [pod_state(p) for p in pods if (p.status.phase or "Pending") == "Pending"]
        stuck = [p for p in waiting if p.problem and time.time() - p.created > SCHEDULE_TIMEOUT_S]
        if failed or stuck:
            states = [pod_state(p) for p in pods]
            why = "; ".join(p.problem for p in states if p.problem) or (failed[0].message if failed else "")
            raise ClusterError(f"The Job {job_name(dataset)} that prepares {dataset} on the cluster failed "
                               f"({why or 'no reason given'}); see `kubectl -n {namespace} logs "
                               f"job/{job_name(dataset)}` while it exists, fix the cause and rerun.")
        time.sleep(POLL_S)


def _print_new_lines(core: Any, namespace: str, pod: Any, printed: dict[str, int], progress: Progress) -> None:
    if pod.status.phase in (None, "Pending"):
        return
    try:
        lines = core.read_namespaced_pod_log(pod.metadata.name, namespace).splitlines()
    except Exception:
        return
    seen = printed.get(pod.metadata.name, 0)
    for line in lines[seen:]:
        progress(f"  {line}")
    printed[pod.metadata.name] = max(seen, len(lines))


def _delete_job(batch: Any, namespace: str, dataset: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        batch.delete_namespaced_job(job_name(dataset), namespace, propagation_policy="Background",
                                    _preload_content=False)
    except ApiException as err:
        if err.status != 404:
            raise


# --- in the Job's pod ----------------------------------------------------------------------

def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _report(folder: Path, stop: threading.Event, every: float = 10.0) -> None:
    """A progress line every ``every`` seconds: bytes on the volume, and the rate."""
    last, start = _size(folder), time.monotonic()
    while not stop.wait(every):
        now = _size(folder)
        print(f"{time.monotonic() - start:6.0f}s  {now / 1e6:10.1f} MB on the volume "
              f"({(now - last) / 1e6 / every:.1f} MB/s)", flush=True)
        last = now


def main(argv: list[str] | None = None) -> int:
    """``python -m mlbench.launch.k8s_data DATASET``: download and convert into $MLBENCH_DATA."""
    from mlbench.errors import MlbenchError
    from mlbench.tasks.data.download import default_data_root
    from mlbench.tasks.datasets import get_dataset, load_splits

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mlbench.launch.k8s_data DATASET", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    root = default_data_root()
    source = os.environ.get(MIRROR_ENV) or "the official site"
    print(f"Preparing {args[0]} in {root} (source: {source})", flush=True)
    stop = threading.Event()
    threading.Thread(target=_report, args=(root, stop), daemon=True).start()
    started = time.monotonic()
    try:
        dataset = get_dataset(args[0])
        if dataset.load is None:  # a language data set: its own preparation (download, tokens, BPE cache)
            dataset.prepare(None)
            what = "prepared"
        else:
            train, test = load_splits(args[0], "real", None)
            what = f"{len(train.y)} training and {len(test.y)} test samples"
    except MlbenchError as err:
        print(f"Error: {err}", flush=True)
        return 1
    finally:
        stop.set()
    print(f"Done in {time.monotonic() - started:.0f}s: {what}, {_size(root) / 1e6:.1f} MB on the volume", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
