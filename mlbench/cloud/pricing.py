"""Approximate hourly prices, so that a user sees what a cluster costs before creating it.

The clouds' price APIs need credentials and network access that `mlbench create-cluster` should
not depend on for a printed estimate, so this uses the package's table of on-demand list prices
in USD (``mlbench/results/prices.csv``: GCP us-central1 and AWS us-east-1, checked November 2025;
its GPU instances (p5, p4de, g6, a3, a2-ultragpu) as of June 2025, each row with its date)
plus the fixed cluster, disk and address fees below. Other regions differ by up to ~30%;
spot/preemptible capacity is typically 60-90% cheaper than shown. Unknown types return None and
the CLI says so instead of guessing.
"""

from __future__ import annotations

from mlbench.results.cost import PRICES_FILE, read_price_file

PRICES_CHECKED = "November 2025"


def _shipped(provider: str, kind: str) -> dict[str, float]:
    """Machine, GPU and instance prices from the one table the package ships (also what
    `mlbench compare` prices runs with), so the cost shown before creating a cluster and the
    cost of the runs on it never disagree."""
    return {p.name: p.usd_per_hour for p in read_price_file(PRICES_FILE).values()
            if p.provider == provider and p.kind == kind and ":" not in p.name}


GCE_MACHINE_HOURLY = _shipped("gcp", "machine")
GCE_GPU_HOURLY = _shipped("gcp", "gpu")
GCE_PD_STANDARD_GB_MONTH = 0.04
GKE_CLUSTER_HOURLY = 0.10  # zonal clusters: one per billing account is covered by a free credit

# EKS: EC2 instance types (per node-hour, from the shipped table), control plane, gp3 volumes,
# and the NAT gateway of the private nodes with its public IPv4 address (data through it is
# $0.045/GB more).
EC2_INSTANCE_HOURLY = _shipped("aws", "machine")
EKS_CLUSTER_HOURLY = 0.10
EBS_GP3_GB_MONTH = 0.08
PUBLIC_IPV4_HOURLY = 0.005
NAT_GATEWAY_HOURLY = 0.045

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
    """Nodes (instance + gp3 root volume) plus the EKS control plane and the NAT gateway (with
    its address) through which the private nodes reach the internet."""
    instance = EC2_INSTANCE_HOURLY.get(instance_type)
    if instance is None:
        return None
    disk = disk_gb * EBS_GP3_GB_MONTH / HOURS_PER_MONTH
    return round(nodes * (instance + disk) + EKS_CLUSTER_HOURLY + NAT_GATEWAY_HOURLY + PUBLIC_IPV4_HOURLY, 4)
