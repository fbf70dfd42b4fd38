"""What a cluster run cannot do is refused in one line before anything is deployed.

On a cluster of several nodes (the harness's two) the checkpoints, which its pods keep on the
results service's volume (ReadWriteOnce), could be written by the pods of one node only; a
stall cannot be given to a pod. Both are refused (the launcher's abilities,
mlbench.launch.plan.LauncherAbilities, and its placement) before the results service or the
data claim exist: the namespace stays empty.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.kube.conftest import mlbench_cli

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


@pytest.mark.parametrize("options, message", [
    (("--checkpoint-every", "20steps"),
     "Error: --checkpoint-every on a cluster of 2 nodes: the checkpoints are kept on the results service's volume, "
     "which only pods on its node can mount; run on a one-node cluster, on this machine or under Slurm"),
    (("--on-failure", "restart"),   # which checkpoints (every 2 minutes when not told)
     "Error: --checkpoint-every on a cluster of 2 nodes: the checkpoints are kept on the results service's volume, "
     "which only pods on its node can mount; run on a one-node cluster, on this machine or under Slurm"),
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
