"""The costs docs/kubernetes.md's Clusters section states are the ones mlbench computes."""

from __future__ import annotations

from pathlib import Path

from mlbench.cloud import pricing

PAGE = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"


def clusters_section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text[text.index("<!-- section: clusters -->"):text.index("<!-- /section: clusters -->")]


def test_the_readme_states_the_computed_default_costs():
    section = clusters_section()
    per_gke_node = pricing.gke_hourly("n1-standard-4", 1, 50, None, 0) - pricing.GKE_CLUSTER_HOURLY
    per_eks_node = (pricing.eks_hourly("m5.xlarge", 1, 50) - pricing.EKS_CLUSTER_HOURLY
                    - pricing.NAT_GATEWAY_HOURLY - pricing.PUBLIC_IPV4_HOURLY)
    for figure in (per_gke_node, pricing.gke_hourly("n1-standard-4", 4, 50, None, 0),
                   pricing.gke_hourly("n1-standard-4", 4, 50, "nvidia-tesla-t4", 1),
                   per_eks_node, pricing.eks_hourly("m5.xlarge", 4, 50),
                   pricing.eks_hourly("g4dn.xlarge", 4, 50)):
        assert f"${figure:.2f}" in section, figure
    assert pricing.PRICES_CHECKED in section


def test_unknown_types_have_no_price_rather_than_a_guess():
    assert pricing.gke_hourly("n9-imaginary", 4, 50, None, 0) is None
    assert pricing.gke_hourly("n1-standard-4", 4, 50, "nvidia-imaginary", 1) is None
    assert pricing.eks_hourly("x9.imaginary", 4, 50) is None


def test_an_eks_cluster_of_gpu_instances_is_priced_from_the_shipped_table():
    disk = 50 * pricing.EBS_GP3_GB_MONTH / pricing.HOURS_PER_MONTH
    fees = pricing.EKS_CLUSTER_HOURLY + pricing.NAT_GATEWAY_HOURLY + pricing.PUBLIC_IPV4_HOURLY
    assert pricing.eks_hourly("p5.48xlarge", 2, 50) == round(2 * (55.04 + disk) + fees, 4)
    assert pricing.eks_hourly("g6.xlarge", 1, 50) == round(0.8048 + disk + fees, 4)
    assert pricing.gke_hourly("a3-highgpu-8g", 1, 50, None, 0) == round(
        88.2494 + 50 * pricing.GCE_PD_STANDARD_GB_MONTH / pricing.HOURS_PER_MONTH + pricing.GKE_CLUSTER_HOURLY, 4)
