"""The network dimension: every run at a chosen bandwidth, latency, jitter and loss.

:mod:`~mlbench.network.settings` says what a network is and parses the options;
:mod:`~mlbench.network.tc` is the shaping of one link (tc qdiscs), used both by local runs
(:mod:`~mlbench.network.netns`, :mod:`~mlbench.network.emulation`: network namespaces joined by a
bridge) and by pods on Kubernetes (:mod:`~mlbench.network.shape` in an init container,
:mod:`~mlbench.network.kube`). Tasks, optimizers and workers never see any of it: they only find
their links slower.
"""

from __future__ import annotations

from typing import Any

from mlbench.errors import UsageError
from mlbench.network.settings import NetworkSettings


def network_record(settings: NetworkSettings, launcher: str) -> dict[str, Any]:
    """The ``network`` of run.json: the settings and how they are applied; UsageError when they
    cannot be applied by this launcher (checked before the run is recorded)."""
    if launcher == "local":
        from mlbench.network.emulation import check_local_shaping
        return check_local_shaping(settings)
    if launcher == "kubernetes":
        from mlbench.network.kube import cluster_record
        return cluster_record(settings)
    raise UsageError(f"network emulation is not available for {launcher} runs; leave out "
                     "--bandwidth, --latency, --jitter and --loss")
