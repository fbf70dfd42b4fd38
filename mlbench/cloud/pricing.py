"""Approximate hourly prices, so that a user sees what a cluster costs before creating it.

The clouds' price APIs need credentials and network access that `mlbench create-cluster` should
not depend on for a printed estimate, so this is a small table of on-demand list prices in USD
(GCP us-central1 and AWS us-east-1, checked November 2025). Other regions differ by up to ~30%;
spot/preemptible capacity is typically 60-90% cheaper than shown. Unknown types return None and
the CLI says so instead of guessing.
"""

from __future__ import annotations

PRICES_CHECKED = "November 2025"

# GKE: Compute Engine machine types (per node-hour), GPUs (per GPU-hour), cluster fee.
GCE_MACHINE_HOURLY = {
    "e2-standard-2": 0.067, "e2-standard-4": 0.134, "e2-standard-8": 0.268,
    "n1-standard-1": 0.0475, "n1-standard-2": 0.095, "n1-standard-4": 0.19,
    "n1-standard-8": 0.38, "n1-standard-16": 0.76, "n1-highmem-4": 0.237,
    "n1-highmem-8": 0.473, "n2-standard-4": 0.194, "n2-standard-8": 0.388,
    "c2-standard-8": 0.418,
}
GCE_GPU_HOURLY = {
    "nvidia-tesla-t4": 0.35, "nvidia-tesla-p4": 0.60, "nvidia-tesla-p100": 1.46,
    "nvidia-tesla-v100": 2.48,
}
GCE_PD_STANDARD_GB_MONTH = 0.04
GKE_CLUSTER_HOURLY = 0.10  # zonal clusters: one per billing account is covered by a free credit

# EKS: EC2 instance types (per node-hour), control plane, gp3 volumes, public IPv4 addresses.
EC2_INSTANCE_HOURLY = {
    "t3.medium": 0.0416, "t3.large": 0.0832, "m5.large": 0.096, "m5.xlarge": 0.192,
    "m5.2xlarge": 0.384, "m5.4xlarge": 0.768, "m6i.xlarge": 0.192, "c5.xlarge": 0.17,
    "c5.2xlarge": 0.34, "c5.4xlarge": 0.68, "r5.xlarge": 0.252, "g4dn.xlarge": 0.526,
    "g4dn.2xlarge": 0.752, "g4dn.12xlarge": 3.912, "g5.xlarge": 1.006, "g5.2xlarge": 1.212,
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24,
}
EKS_CLUSTER_HOURLY = 0.10
EBS_GP3_GB_MONTH = 0.08
PUBLIC_IPV4_HOURLY = 0.005

HOURS_PER_MONTH = 730.0


def gke_hourly(machine_type: str, nodes: int, disk_gb: int, gpu_type: str | None,
               gpus_per_node: int) -> float | None:
    """Nodes (machine + GPUs + boot disk) plus the cluster management fee."""
    machine = GCE_MACHINE_HOURLY.get(machine_type)
    gpu = GCE_GPU_HOURLY.get(gpu_type, None) if gpu_type and gpus_per_node else 0.0
    if machine is None or gpu is None:
        return None
    disk = disk_gb * GCE_PD_STANDARD_GB_MONTH / HOURS_PER_MONTH
    return round(nodes * (machine + gpus_per_node * gpu + disk) + GKE_CLUSTER_HOURLY, 4)


def eks_hourly(instance_type: str, nodes: int, disk_gb: int) -> float | None:
    """Nodes (instance + gp3 root volume + public IPv4) plus the EKS control plane."""
    instance = EC2_INSTANCE_HOURLY.get(instance_type)
    if instance is None:
        return None
    disk = disk_gb * EBS_GP3_GB_MONTH / HOURS_PER_MONTH
    return round(nodes * (instance + disk + PUBLIC_IPV4_HOURLY) + EKS_CLUSTER_HOURLY, 4)
