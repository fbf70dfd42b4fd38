"""Cluster commands: create-cluster gcloud|aws|kind, add-cluster, list-clusters, set-cluster,
delete-cluster, and `image build` for the worker image. The work happens in mlbench.cloud."""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

import click

from mlbench.cli import cli
from mlbench.cli.completion import complete_clusters
from mlbench.cli.output import emit, output_option, tabulate
from mlbench.cloud import address, manager
from mlbench.cloud.providers import ADOPTED, PROVIDER_MODULES
from mlbench.cloud.provisioner import ClusterSpec
from mlbench.frameworks import PORTS
from mlbench.progress import StatusLines

F = Callable[..., Any]


def _options(*decorators: F) -> Callable[[F], F]:
    """Apply several click options at once (declared once, reused by each provider)."""
    def apply(func: F) -> F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func
    return apply


_SHARED_STORAGE = click.option(
    "--shared-storage-class", metavar="CLASS",
    help="A ReadWriteMany storage class (GKE: standard-rwx, Filestore; EKS: an EFS class; NFS) for the "
         "results service's volume, so that runs on several nodes can checkpoint, restart and resume. "
         "Without one, only one-node clusters can.")

_COMMON = _options(
    click.argument("num_nodes", type=click.IntRange(1, 1000)),
    click.argument("name"),
    click.option("--disk-size", type=click.IntRange(10, 65536), default=50, show_default=True,
                 help="Boot disk per node, GB."),
    click.option("--kubernetes-version", help="Kubernetes version (default: the provider's)."),
    click.option("--image", help="Worker image the cluster runs (default: mlbench's)."),
    click.option("--allow-api-from", "api_cidrs", multiple=True, metavar="CIDR",
                 help="Only these IPv4 CIDRs may reach the Kubernetes API (repeatable). Default: "
                      "only this machine's public address, asked of "
                      f"{address.PUBLIC_ADDRESS_URL} (${address.URL_ENV} names another); when it "
                      "cannot be found, nothing is created. 0.0.0.0/0: any address, authenticated "
                      "(the clouds' own default)."),
    _SHARED_STORAGE,
)


def _create(provisioner: Any, spec: ClusterSpec) -> None:
    progress = StatusLines()
    try:
        record = manager.create_cluster(provisioner, spec, progress)
    finally:
        progress.done()
    click.echo(f"Cluster {record.provider} {record.name} is ready with {record.nodes} nodes and "
               "is now the current cluster (runs go there; `mlbench set-cluster --local` to "
               "run here again).")
    click.echo(f"kubectl: KUBECONFIG={record.kubeconfig} kubectl --context {record.context} "
               "get nodes")
    click.echo(f"Delete it when done: mlbench delete-cluster {record.provider} {record.name}")


@cli.group("create-cluster")
def create_cluster() -> None:
    """Create a Kubernetes cluster for benchmarks (GKE, EKS or KIND) and make it current.

    Rerunning a create that failed or was interrupted finishes it.
    """


@create_cluster.command("gcloud")
@_COMMON
@click.option("--project", help="Google Cloud project (default: from the credentials).")
@click.option("--zone", default="us-central1-a", show_default=True)
@click.option("--machine-type", default="n1-standard-4", show_default=True)
@click.option("--gpu-type", help="e.g. nvidia-tesla-t4 (the default when --num-gpus > 0).")
@click.option("--num-gpus", type=click.IntRange(0, 16), default=0, show_default=True,
              help="GPUs per node.")
@click.option("--preemptible", is_flag=True, help="Preemptible VMs (max 24 h, cheaper).")
@click.option("--spot", is_flag=True, help="Spot VMs (can be reclaimed, cheaper).")
def create_gcloud(num_nodes: int, name: str, project: str | None, zone: str, machine_type: str,
                  gpu_type: str | None, num_gpus: int, preemptible: bool, spot: bool,
                  **common: Any) -> None:
    """Create a GKE cluster of NUM_NODES nodes called NAME."""
    from mlbench.cloud.gcloud import GkeProvisioner

    if spot and preemptible:
        raise click.UsageError("Choose --spot or --preemptible, not both.")
    if gpu_type and not num_gpus:
        num_gpus = 1
    spec = ClusterSpec(name=name, nodes=num_nodes, machine_type=machine_type, gpu_type=gpu_type,
                       gpus_per_node=num_gpus, spot=spot, preemptible=preemptible,
                       disk_gb=common["disk_size"], kubernetes_version=common[
                           "kubernetes_version"], image=common["image"],
                       api_cidrs=tuple(common["api_cidrs"]), shared_storage_class=common["shared_storage_class"])
    _create(GkeProvisioner(project=project, zone=zone), spec)


@create_cluster.command("aws")
@_COMMON
@click.option("--region", help="AWS region (default: the profile's, else us-east-1).")
@click.option("--profile", help="AWS profile (default: boto3's credential chain).")
@click.option("--instance-type", default="m5.xlarge", show_default=True,
              help="EC2 type; GPU types (g4dn, g5, p3...) get the NVIDIA AMI and device plugin.")
@click.option("--spot", is_flag=True, help="Spot capacity (can be reclaimed, cheaper).")
def create_aws(num_nodes: int, name: str, region: str | None, profile: str | None,
               instance_type: str, spot: bool, **common: Any) -> None:
    """Create an EKS cluster of NUM_NODES nodes called NAME."""
    from mlbench.cloud.aws import EksProvisioner

    spec = ClusterSpec(name=name, nodes=num_nodes, machine_type=instance_type, spot=spot,
                       disk_gb=common["disk_size"], kubernetes_version=common[
                           "kubernetes_version"], image=common["image"],
                       api_cidrs=tuple(common["api_cidrs"]), shared_storage_class=common["shared_storage_class"])
    _create(EksProvisioner(region=region, profile=profile), spec)


@create_cluster.command("kind")
@click.argument("num_nodes", type=click.IntRange(1, 100))
@click.argument("name")
@click.option("--image", help="Local image to load into the nodes (default: "
                              "mlbench/worker:<version>, see `mlbench image build`).")
@click.option("--no-image", is_flag=True, help="Load no image (pull from a registry instead).")
@click.option("--framework", "frameworks", multiple=True, type=click.Choice(list(PORTS)),
              help="Load the image's variant with this port too (repeatable; IMAGE-jax, IMAGE-tensorflow: "
                   "`mlbench image build --framework`).")
@click.option("--kubernetes-version", help="Node image version, e.g. 1.31.0.")
def create_kind(num_nodes: int, name: str, image: str | None, no_image: bool, frameworks: tuple[str, ...],
                kubernetes_version: str | None) -> None:
    """Create a KIND cluster on this machine: 1 control plane and NUM_NODES-1 workers."""
    from mlbench.cloud.image import worker_image_tag
    from mlbench.cloud.kind import KindProvisioner
    from mlbench.errors import UsageError

    if no_image and frameworks:
        raise UsageError("--framework loads variants of the image; leave out --no-image")
    spec = ClusterSpec(name=name, nodes=num_nodes, kubernetes_version=kubernetes_version,
                       image=None if no_image else image or worker_image_tag(), frameworks=frameworks)
    _create(KindProvisioner(), spec)


@cli.command("add-cluster")
@click.argument("name")
@click.option("--context", required=True, help="Kube context that reaches the cluster.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False),
              help="Kubeconfig holding the context (default: $KUBECONFIG or ~/.kube/config).")
@click.option("--namespace", help="Namespace for runs (default: the context's, else default).")
@click.option("--image", help="Worker image the cluster can pull.")
@_SHARED_STORAGE
def add_cluster(name: str, context: str, kubeconfig: str | None, namespace: str | None,
                image: str | None, shared_storage_class: str | None) -> None:
    """Adopt an existing cluster as NAME (mlbench never deletes it)."""
    record = manager.add_cluster(name, context, kubeconfig, namespace, image, shared_storage_class)
    click.echo(f"Added cluster {name} ({record.nodes} nodes, namespace "
               f"{record.extra['namespace']}); make it current with "
               f"`mlbench set-cluster existing {name}`.")


@cli.command("list-clusters")
@click.option("--no-refresh", is_flag=True, help="Do not ask the providers for the state.")
@output_option
def list_clusters(no_refresh: bool, output: str) -> None:
    """Clusters mlbench knows, with their true state; * marks the current one."""
    rows = manager.list_clusters(refresh=not no_refresh)
    if output != "table":
        emit({"clusters": [r.to_dict() for r in rows]}, output)
        return
    if not rows:
        click.echo("No clusters; create one with `mlbench create-cluster kind|gcloud|aws`.")
    else:
        table = [["*" if r.current else "", r.record.provider, r.record.name,
                  r.status.nodes if r.status.nodes is not None else r.record.nodes,
                  r.status.state, r.where, r.status.detail] for r in rows]
        click.echo(tabulate(table, headers=["", "PROVIDER", "NAME", "NODES", "STATE", "WHERE",
                                            "DETAIL"], tablefmt="plain"))
    if not any(r.current for r in rows):
        click.echo("* local: runs go to this machine.")


@cli.command("set-cluster")
@click.argument("args", nargs=-1, metavar="[PROVIDER] NAME", shell_complete=complete_clusters)
@click.option("--local", is_flag=True, help="Run on this machine again.")
def set_cluster(args: tuple[str, ...], local: bool) -> None:
    """Make a known cluster the one runs go to (or --local for this machine)."""
    if local == bool(args) or len(args) > 2:
        raise click.UsageError("Give [PROVIDER] NAME, or --local (not both).")
    record = manager.set_cluster(args[-1] if args else None, args[0] if len(args) == 2 else None)
    click.echo(f"Runs now go to {record.provider} cluster {record.name}." if record
               else "Runs now go to this machine.")


@cli.command("delete-cluster")
@click.argument("provider", type=click.Choice([*PROVIDER_MODULES, ADOPTED]))
@click.argument("name", shell_complete=complete_clusters)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--project", help="GKE: project, when mlbench has no record of the cluster.")
@click.option("--zone", help="GKE: zone, when mlbench has no record of the cluster.")
@click.option("--region", help="EKS: region, when mlbench has no record of the cluster.")
@click.option("--profile", help="EKS: AWS profile to use.")
def delete_cluster(provider: str, name: str, yes: bool, **locator: Any) -> None:
    """Delete a cluster mlbench created and everything it made; forget an added one."""
    if provider in manager.CREATED and not yes:
        click.confirm(f"Delete the {provider} cluster {name} and all its workloads?",
                      abort=True, err=True)
    progress = StatusLines()
    try:
        message = manager.delete_cluster(provider, name, progress, **locator)
    finally:
        progress.done()
    click.echo(message)


@cli.group("image")
def image() -> None:
    """The mlbench worker image."""


@image.command("build")
@click.option("--cuda", is_flag=True, help="Build the CUDA variant (tag suffix -cuda).")
@click.option("--framework", "frameworks", multiple=True, type=click.Choice(list(PORTS)),
              help="Add a port's framework (repeatable; tag suffix -jax, -tensorflow): the image that "
                   "`mlbench run --framework` uses on a cluster.")
@click.option("--tag", help="Image tag (default: mlbench/worker:<version>[-cuda][-FRAMEWORK...]).")
@click.option("--source", type=click.Path(file_okay=False, exists=True),
              help="mlbench source checkout to build from (default: this installation's).")
def image_build(cuda: bool, frameworks: tuple[str, ...], tag: str | None, source: str | None) -> None:
    """Build the worker image with the local Docker engine."""
    from pathlib import Path

    from mlbench.cloud.image import build_image

    built = build_image(cuda=cuda, tag=tag, root=Path(source) if source else None, frameworks=frameworks)
    click.echo(f"Built {built}.")
