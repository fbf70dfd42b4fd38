"""The network dimension: every run at a chosen bandwidth, latency, jitter and loss.

:mod:`~mlbench.network.settings` says what a network is and parses the options;
:mod:`~mlbench.network.tc` is the shaping of one link (tc qdiscs), used both by local runs
(:mod:`~mlbench.network.netns`, :mod:`~mlbench.network.emulation`: network namespaces joined by a
bridge) and by pods on Kubernetes (:mod:`~mlbench.network.shape` in an init container,
:mod:`~mlbench.network.kube`). Tasks, optimizers and workers never see any of it: they only find
their links slower. Which of them a run uses is its launcher's choice
(:meth:`mlbench.launch.base.Launcher.network_record`).
"""
