"""What a cluster run cannot do is refused in one line before anything is deployed.

A checkpoint written into a pod's run folder (its read-only ConfigMap) would fail the run at its
first write, after the service was deployed and the data downloaded; a stall cannot be given to
a pod. Both are refused by the launcher's abilities (mlbench.launch.plan.LauncherAbilities)
before the results service or the data claim exist: the namespace stays empty.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.kube.conftest import mlbench_cli

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


@pytest.mark.parametrize("options, message", [
    (("--checkpoint-every", "20steps"),
     "Error: --checkpoint-every 20steps: cluster runs cannot keep checkpoints yet (a pod's run folder is read-only "
     "and no volume holds them); run on this machine or under Slurm"),
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
