"""EKS clusters through boto3: IAM roles, a VPC, the cluster and one managed node group.

Create runs these steps in order and delete runs them in reverse; every step first asks AWS what
exists (by name or by the ``mlbench-cluster`` tag), so rerunning a create or delete that failed
half way finishes the job. Credentials come from boto3's usual chain (environment, profile,
SSO, instance role) and ``AWS_ENDPOINT_URL`` is honoured by boto3 itself. Kubernetes access uses
a token mlbench signs with boto3 (:mod:`mlbench.cloud.token`), and EKS access entries
(``bootstrapClusterCreatorAdminPermissions``) make the creating identity an administrator, so
neither the `aws` CLI nor the ``aws-auth`` ConfigMap is involved. Nodes have no SSH key and no
public address (private subnets behind a NAT gateway, see :mod:`mlbench.cloud.aws_resources`),
and the API endpoint admits only ``--allow-api-from`` or this machine's public address
(:mod:`mlbench.cloud.address`). GPU instance types get the NVIDIA AMI (drivers included) and the
NVIDIA device plugin DaemonSet.
"""

from __future__ import annotations

import time
from typing import Any

from mlbench.cloud import address, gpu, pricing
from mlbench.cloud import aws_resources as res
from mlbench.cloud.config import kube_api_client
from mlbench.cloud.providers import register
from mlbench.cloud.provisioner import (
    ClusterSpec,
    ClusterStatus,
    KubeAccess,
    Progress,
    Provisioner,
)
from mlbench.cloud.token import exec_user
from mlbench.errors import ClusterError, UsageError
from mlbench.extras import needs

DEFAULT_REGION = "us-east-1"
DEFAULT_INSTANCE_TYPE = "m5.xlarge"
NODEGROUP = "workers"
AMI_STANDARD = "AL2023_x86_64_STANDARD"
AMI_NVIDIA = "AL2023_x86_64_NVIDIA"
_CLUSTER_STATES = {"CREATING": "creating", "PENDING": "creating", "UPDATING": "ready",
                   "DELETING": "deleting", "FAILED": "error"}
_NODEGROUP_STATES = {"CREATING": "creating", "ACTIVE": "ready", "UPDATING": "ready",
                     "DELETING": "deleting", "CREATE_FAILED": "error", "DELETE_FAILED": "error",
                     "DEGRADED": "error"}


@register
class EksProvisioner(Provisioner):
    """EKS in one region, with credentials from boto3 (``session`` may be given, e.g. tests)."""

    provider = "aws"

    def __init__(self, region: str | None = None, profile: str | None = None,
                 session: Any = None) -> None:
        self.profile = profile
        self._session = session
        self._region = region
        self._partition = "aws"
        self._clients: dict[str, Any] = {}
        self._gpu_types: dict[str, bool] = {}

    @property
    def session(self) -> Any:
        if self._session is None:
            with needs("aws"):
                import boto3
                from botocore.exceptions import ProfileNotFound

            try:
                self._session = boto3.Session(profile_name=self.profile)
            except ProfileNotFound:
                raise UsageError(f"The AWS profile {self.profile!r} does not exist; check "
                                 "~/.aws/config or pass another --profile.") from None
        return self._session

    @property
    def region(self) -> str:
        return self._region or self.session.region_name or DEFAULT_REGION

    def _client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self.session.client(service, region_name=self.region)
        return self._clients[service]

    @classmethod
    def from_locator(cls, locator: dict[str, Any]) -> EksProvisioner:
        return cls(region=locator.get("region"), profile=locator.get("profile"))

    def locator(self) -> dict[str, Any]:
        return {"region": self.region, "profile": self.profile}

    def check_credentials(self) -> None:
        """Ask STS who we are: proves the credentials work and gives the ARN partition."""
        with needs("aws"):
            from botocore.exceptions import NoCredentialsError

        if self.session.get_credentials() is None:
            raise res.aws_error(NoCredentialsError(), "find credentials")
        with res.calling("check the AWS credentials"):
            arn = self._client("sts").get_caller_identity()["Arn"]
        self._partition = arn.split(":")[1]

    # -- EKS reads -----------------------------------------------------------------------------
    def _cluster(self, name: str) -> dict[str, Any] | None:
        eks = self._client("eks")
        with res.calling(f"read EKS cluster {name}"):
            try:
                return eks.describe_cluster(name=name)["cluster"]
            except eks.exceptions.ResourceNotFoundException:
                return None

    def _nodegroup(self, name: str) -> dict[str, Any] | None:
        eks = self._client("eks")
        with res.calling(f"read the node group of {name}"):
            try:
                return eks.describe_nodegroup(clusterName=name,
                                              nodegroupName=NODEGROUP)["nodegroup"]
            except eks.exceptions.ResourceNotFoundException:
                return None

    def _check_ours(self, cluster: dict[str, Any]) -> None:
        if cluster.get("tags", {}).get(res.TAG) != cluster["name"]:
            raise ClusterError(
                f"An EKS cluster named {cluster['name']} already exists in {self.region} and was "
                "not created by mlbench; choose another name, or adopt it with "
                "`mlbench add-cluster NAME --context CTX`.")

    def _gpu_instance(self, instance_type: str) -> bool:
        """Whether ``instance_type`` has GPUs (and exists in this region)."""
        if instance_type in self._gpu_types:
            return self._gpu_types[instance_type]
        ec2 = self._client("ec2")
        with res.calling(f"look up instance type {instance_type}"):
            try:
                info = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
            except Exception as err:
                if res.error_code(err) == "InvalidInstanceType":
                    raise UsageError(f"The instance type {instance_type!r} does not exist in "
                                     f"{self.region}; pick one from the EC2 console, e.g. "
                                     f"{DEFAULT_INSTANCE_TYPE} or g4dn.xlarge.") from None
                raise
        self._gpu_types[instance_type] = bool(info and info[0].get("GpuInfo", {}).get("Gpus"))
        return self._gpu_types[instance_type]

    def preflight(self, spec: ClusterSpec) -> None:
        self._gpu_instance(spec.machine_type or DEFAULT_INSTANCE_TYPE)
        spec.api_cidrs, spec.options["api_cidrs_found_here"] = address.api_cidrs(spec.api_cidrs)

    # -- create ----------------------------------------------------------------------------------
    def create(self, spec: ClusterSpec, progress: Progress) -> None:
        instance_type = spec.machine_type or DEFAULT_INSTANCE_TYPE
        has_gpu = self._gpu_instance(instance_type)
        cluster = self._cluster(spec.name)
        if cluster is not None:
            self._check_ours(cluster)
            if cluster["status"] == "DELETING":
                raise ClusterError(f"The EKS cluster {spec.name} is being deleted; wait for "
                                   "`mlbench delete-cluster` to finish, then create it again.")
            progress(f"EKS cluster {spec.name} exists ({cluster['status']}); resuming.")
        iam = self._client("iam")
        progress(f"Ensuring IAM roles {res.role_name('cluster', spec.name)} and "
                 f"{res.role_name('node', spec.name)}.")
        cluster_role = res.ensure_role(iam, "cluster", spec.name, self._partition)
        node_role = res.ensure_role(iam, "node", spec.name, self._partition)
        subnets, nat = res.ensure_network(self._client("ec2"), spec.name, progress)
        if cluster is None:
            self._create_cluster(spec, cluster_role, subnets, progress)
        self._wait_cluster_active(spec.name, progress)
        self._wait_nat_gateway(nat, spec.name, progress)  # private nodes need it to join
        if self._nodegroup(spec.name) is None:
            progress(f"Creating node group {NODEGROUP}: {spec.nodes} x {instance_type}"
                     f"{' (spot)' if spec.spot else ''}.")
            with res.calling(f"create the node group of {spec.name}"):
                self._client("eks").create_nodegroup(
                    clusterName=spec.name, nodegroupName=NODEGROUP,
                    scalingConfig={"minSize": spec.nodes, "maxSize": spec.nodes,
                                   "desiredSize": spec.nodes},
                    diskSize=spec.disk_gb, subnets=subnets, instanceTypes=[instance_type],
                    amiType=AMI_NVIDIA if has_gpu else AMI_STANDARD, nodeRole=node_role,
                    capacityType="SPOT" if spec.spot or spec.preemptible else "ON_DEMAND",
                    labels={res.TAG: spec.name, **({gpu.GPU_NODE_LABEL: "true"}
                                                   if has_gpu else {})},
                    tags=res.tags(spec.name))

    def _create_cluster(self, spec: ClusterSpec, role: str, subnets: list[str],
                        progress: Progress) -> None:
        if not spec.api_cidrs:  # create() without preflight (library use): the same default
            spec.api_cidrs, spec.options["api_cidrs_found_here"] = address.api_cidrs(())
        vpc_config: dict[str, Any] = {"subnetIds": subnets, "endpointPublicAccess": True,
                                      "endpointPrivateAccess": True,
                                      "publicAccessCidrs": list(spec.api_cidrs)}
        request: dict[str, Any] = {
            "name": spec.name, "roleArn": role, "resourcesVpcConfig": vpc_config,
            "tags": res.tags(spec.name),
            "accessConfig": {"authenticationMode": "API_AND_CONFIG_MAP",
                             "bootstrapClusterCreatorAdminPermissions": True},
        }
        if spec.kubernetes_version:
            request["version"] = spec.kubernetes_version
        progress(f"Creating EKS cluster {spec.name} in {self.region}.")
        progress(address.describe(spec.api_cidrs, bool(spec.options.get("api_cidrs_found_here"))))
        eks = self._client("eks")
        for attempt in range(6):  # a new IAM role takes a few seconds to become assumable
            try:
                eks.create_cluster(**request)
                return
            except eks.exceptions.InvalidParameterException as err:
                if "assume" not in str(err).lower() or attempt == 5:
                    raise res.aws_error(err, f"create EKS cluster {spec.name}") from None
                time.sleep(self.poll_interval)
            except Exception as err:
                if res.error_code(err) == "ResourceInUseException":  # created meanwhile
                    return
                raise res.aws_error(err, f"create EKS cluster {spec.name}") from None

    def _wait_cluster_active(self, name: str, progress: Progress) -> None:
        def check() -> tuple[bool, str]:
            cluster = self._cluster(name)
            status = cluster["status"] if cluster else "MISSING"
            if status in ("FAILED", "MISSING"):
                raise ClusterError(f"The EKS cluster {name} is {status.lower()}; delete it with "
                                   f"`mlbench delete-cluster aws {name}` and create it again.")
            return status == "ACTIVE", status

        self.poll(check, f"EKS control plane {name}", progress)

    def _wait_nat_gateway(self, nat: str, name: str, progress: Progress) -> None:
        def check() -> tuple[bool, str]:
            state = res.nat_gateway_state(self._client("ec2"), nat)
            if state in ("failed", "deleted", "missing"):
                raise ClusterError(f"The NAT gateway of {name} is {state}; delete the cluster with "
                                   f"`mlbench delete-cluster aws {name}` and create it again.")
            return state == "available", state

        self.poll(check, f"NAT gateway of {name}", progress)

    def wait(self, spec: ClusterSpec, progress: Progress) -> None:
        def check() -> tuple[bool, str]:
            group = self._nodegroup(spec.name)
            if group is None:
                raise ClusterError(f"The node group of {spec.name} is missing; rerun "
                                   f"`mlbench create-cluster aws` to create it.")
            status = group["status"]
            if status in ("CREATE_FAILED", "DEGRADED", "DELETING", "DELETE_FAILED"):
                issues = "; ".join(i.get("message", "") for i in
                                   group.get("health", {}).get("issues", [])) or status
                raise ClusterError(f"The node group of {spec.name} is {status} ({issues}); "
                                   f"delete the cluster with `mlbench delete-cluster aws "
                                   f"{spec.name}` and create it again.")
            return status == "ACTIVE", status

        self.poll(check, f"EKS node group of {spec.name}", progress)

    def kube_access(self, name: str) -> KubeAccess:
        cluster = self._cluster(name)
        if cluster is None or not cluster.get("endpoint"):
            raise ClusterError(f"The EKS cluster {name} has no endpoint yet; rerun the command.")
        entry: dict[str, Any] = {"server": cluster["endpoint"].rstrip("/")}
        ca = cluster.get("certificateAuthority", {}).get("data")
        if ca:
            entry["certificate-authority-data"] = ca
        args = ["--cluster", name, "--region", self.region]
        if self.profile:
            args += ["--profile", self.profile]
        return KubeAccess(cluster=entry, user=exec_user("aws", args))

    def finish(self, spec: ClusterSpec, record: Any, progress: Progress) -> None:
        """GPU node groups need NVIDIA's device plugin before pods can request GPUs."""
        group = self._nodegroup(spec.name)
        if group and group.get("amiType") == AMI_NVIDIA:
            progress("Installing the NVIDIA device plugin DaemonSet.")
            gpu.ensure_nvidia_device_plugin(kube_api_client(record), record.context)

    # -- query and delete -------------------------------------------------------------------------
    def query(self, name: str) -> ClusterStatus:
        cluster = self._cluster(name)
        if cluster is None:
            leftovers = res.leftovers(self._client("ec2"), self._client("iam"), name)
            if leftovers:
                return ClusterStatus("incomplete", f"{' and '.join(leftovers)} exist but no EKS "
                                     "cluster; rerun create-cluster or delete-cluster")
            return ClusterStatus("not found", f"no EKS cluster {name} in {self.region}")
        if cluster["status"] != "ACTIVE":
            state = _CLUSTER_STATES.get(cluster["status"], "unknown")
            return ClusterStatus(state, f"control plane {cluster['status'].lower()}")
        group = self._nodegroup(name)
        if group is None:
            return ClusterStatus("incomplete", "no node group; rerun create-cluster or "
                                 "delete-cluster")
        return ClusterStatus(_NODEGROUP_STATES.get(group["status"], "unknown"),
                             f"node group {group['status'].lower()}",
                             group.get("scalingConfig", {}).get("desiredSize"))

    def delete(self, name: str, progress: Progress) -> None:
        eks = self._client("eks")
        cluster = self._cluster(name)
        if cluster is not None:
            self._check_ours(cluster)
            group = self._nodegroup(name)
            if group is not None:
                if group["status"] != "DELETING":
                    progress(f"Deleting node group {NODEGROUP} of {name}.")
                    with res.calling(f"delete the node group of {name}"):
                        eks.delete_nodegroup(clusterName=name, nodegroupName=NODEGROUP)
                self.poll(lambda: _gone(self._nodegroup(name), f"the node group of {name}"),
                          f"deleting node group of {name}", progress)
            if cluster["status"] != "DELETING":
                progress(f"Deleting EKS cluster {name}.")
                with res.calling(f"delete EKS cluster {name}"):
                    try:
                        eks.delete_cluster(name=name)
                    except eks.exceptions.ResourceNotFoundException:
                        pass
            self.poll(lambda: _gone(self._cluster(name), f"EKS cluster {name}"),
                      f"deleting EKS cluster {name}", progress)

        def network_gone() -> tuple[bool, str]:
            try:
                res.remove_network(self._client("ec2"), name)
                return True, "deleted"
            except res.StillInUse:
                return False, "waiting for AWS to release the cluster's network interfaces"

        progress(f"Deleting the network of {name}.")
        self.poll(network_gone, f"deleting the VPC of {name}", progress)
        for kind in ("node", "cluster"):
            if res.remove_role(self._client("iam"), kind, name):
                progress(f"Deleted IAM role {res.role_name(kind, name)}.")

    def hourly_cost(self, spec: ClusterSpec) -> float | None:
        return pricing.eks_hourly(spec.machine_type or DEFAULT_INSTANCE_TYPE, spec.nodes,
                                  spec.disk_gb)


def _gone(resource: dict[str, Any] | None, what: str) -> tuple[bool, str]:
    """Poll check: done once ``resource`` no longer exists."""
    if resource is None:
        return True, "deleted"
    if resource["status"] == "DELETE_FAILED":
        raise ClusterError(f"AWS failed to delete {what}; see the EKS console for the reason, "
                           "then rerun `mlbench delete-cluster aws`.")
    return False, resource["status"]

