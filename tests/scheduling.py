"""How the suite is shared between pytest-xdist's worker processes (issue 20, part 6).

Most of the suite's time is real runs, servers and waiting for them (a Kubernetes node's pods, a
Slurm job's hold, a browser), so two worker processes finish it in much less time than one, on
2 cores too. What must not be split:

* a **package whose tests share one server** started by a package- or session-scoped fixture
  (tests/kube: one real node; tests/slurm: one Slurm cluster; tests/cloud: one Docker engine and
  moto's server): split over two workers, each would start its own, and two nodes would contend
  for the node's folder and the host's iptables;
* a **module**, whose module-scoped fixtures (a group of real runs, the dashboard's lab) would
  otherwise be built once per worker.

A third kind of unit is :data:`FORKSERVER_MODULES`: the modules whose tests fork their gloo
ranks from tests/optim/support.py's forkserver, which each worker process that uses it starts
once (importing torch and torch._dynamo: about 4 CPU-seconds on the loaded box); as one unit,
one worker starts it instead of every worker.

So a unit of work is a whole package for those packages, the forkserver's modules together,
and a module for the rest (xdist's ``loadscope`` with wider scopes). The units are handed out
longest first (:func:`order_items`, as a longest-processing-time schedule): the packages, then
:data:`LONG_MODULES`, then the rest in collection order, so that the session ends on short
modules that fill the workers evenly rather than on a long one started last. Worker count:
``-n auto`` asks :func:`worker_count`.
"""

from __future__ import annotations

import os

from xdist.scheduler import LoadScopeScheduling

#: the packages run as one unit each, in this order, before every other test
WHOLE_PACKAGES = ("tests/kube", "tests/slurm", "tests/cloud")
#: the modules that use tests/optim/support.py's run_on_ranks (its forkserver), one unit named by
#: :data:`FORKSERVER_UNIT` (tests/test_scheduling.py checks that the list is whole)
FORKSERVER_MODULES = (
    "tests/optim/test_training.py", "tests/optim/test_centralized.py", "tests/optim/test_compressed.py",
    "tests/optim/test_ddp_resume.py", "tests/optim/test_decentralized.py", "tests/optim/test_powersgd.py",
    "tests/optim/test_diloco_family.py", "tests/language/test_exactness.py", "tests/gpt/test_exactness.py")
FORKSERVER_UNIT = "tests/optim/support.py"
#: the modules that take a worker a third of a minute or more on the loaded 2-core box, longest
#: first (``MLBENCH_TEST_CPU_PROFILE`` of a loaded run with four workers, 2026-11-27;
#: docs/testing.md); a module not listed is merely handed out later, among the short ones
LONG_MODULES = (
    "tests/test_launcher_matrix.py", "tests/test_faults.py", "tests/frameworks/test_tf_resnet.py",
    "tests/test_engine_e2e.py", "tests/frameworks/test_jax_resnet.py", "tests/test_watchdog.py",
    "tests/kube_nodeless/test_cluster.py",
    "tests/test_forked_workers.py", "tests/dashboard/test_surface_matrix.py", "tests/results/test_export.py",
    "tests/test_engine_faults.py", "tests/optim/test_check.py", "tests/results/test_live_export.py",
    "tests/kube_nodeless/test_pod_specs.py",
    "tests/dashboard/test_dashboard.py", "tests/network/test_local_network.py",
    "tests/server/test_many_connections.py", "tests/test_cli_output.py", "tests/optim/test_plugins.py",
    "tests/test_resume_exact.py", "tests/server/test_pod_watchdog.py", FORKSERVER_UNIT,
    "tests/test_resume.py", "tests/results/test_store.py", "tests/test_packaging.py",
    "tests/dashboard/test_memory.py", "tests/test_api.py")
#: at most this many workers with ``-n auto``: every worker may start real runs of 2-4 processes
#: and import torch, JAX and TensorFlow; more would trade memory for little time
MAX_WORKERS = 4


def package_of(nodeid: str) -> str | None:
    """The entry of :data:`WHOLE_PACKAGES` that holds the test ``nodeid``, if any."""
    path = nodeid.split("::", 1)[0]
    return next((p for p in WHOLE_PACKAGES if path.startswith(p + "/")), None)


def unit_of(nodeid: str) -> str:
    """The unit of work that holds the test ``nodeid``: its package of :data:`WHOLE_PACKAGES`,
    :data:`FORKSERVER_UNIT` for a module of :data:`FORKSERVER_MODULES`, else its module."""
    path = nodeid.split("::", 1)[0]
    return package_of(nodeid) or (FORKSERVER_UNIT if path in FORKSERVER_MODULES else path)


def order_items(items: list) -> None:
    """The tests of :data:`WHOLE_PACKAGES` first, in that order, then those of
    :data:`LONG_MODULES`, in that order; the rest keep their order (a stable sort, so each
    module's tests stay together for its module-scoped fixtures)."""
    rank = {unit: i for i, unit in enumerate((*WHOLE_PACKAGES, *LONG_MODULES))}
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(rank)))


def worker_count() -> int:
    """``-n auto``: two workers more than the usable cores (while one waits on a server, a Slurm
    job's hold or a browser, the others compute), at least 2, at most :data:`MAX_WORKERS`. On
    the loaded 2-core box (docs/testing.md) three workers took 18.9 minutes against 23.0 for two
    (2026-11-26); once the suite forked its runs, four took 16.1 minutes against 17.6 for three
    on the same commit and box (2026-11-27; before that, four had been hardly faster than two);
    five took 20.2 minutes against 18.5 for four (2026-11-28, the Xeon box of docs/testing.md):
    the real node's unit stretched to 15.5 minutes, and no worker ended sooner."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(2, min(cores + 2, MAX_WORKERS))


class WholePackageScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with a whole package as the scope of :data:`WHOLE_PACKAGES` and a
    module as the scope of every other test; units are handed out in collection order."""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        # xdist would sort the units by their number of tests; the order of the collection
        # (order_items) puts the longest first, which a count of tests does not know
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
