"""kube-local.sh's control plane for the tests: started, checked, stopped -- one place for the
three packages that run it (tests/cloud and tests/kube_nodeless without a node, tests/kube with one).

kube-local.sh picks every port by binding port 0 and letting it go, and starts the component
later (the controller manager only once the API server is ready, seconds on a loaded box). In
that window any process of the test session may take the port for a connection of its own; the
component then cannot listen and exits (a controller manager says ``bind: address already in
use``), and what it does never happens -- without the controller manager no namespace gets its
``default`` service account, and every pod is refused. :func:`start_control_plane` therefore
watches the parts until the admin may create pods, and says which part exited and why
(:class:`ControlPlaneDown`), so that the fixture can start again in a fresh folder with new ports.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from mlbench.launch.processes import process_state

REPO = Path(__file__).resolve().parents[1]
KUBE_LOCAL = Path(os.environ.get("KUBE_LOCAL_SH", REPO.parent / "shared" / "k8s" / "kube-local.sh"))

#: the processes of kube-local.sh's control plane, as its pid files name them
CONTROL_PLANE_PARTS = ("etcd", "apiserver", "controller-manager")


class ControlPlaneDown(RuntimeError):
    """A part of kube-local.sh's control plane exited, or it never let the admin create pods."""


def start_control_plane(state: Path, timeout: float = 180) -> Path:
    """``kube-local.sh start STATE``, then :func:`wait_until_pods_allowed`; its admin kubeconfig.

    Raises :class:`ControlPlaneDown` (the parts it started are left for :func:`stop`)."""
    started = subprocess.run(["bash", str(KUBE_LOCAL), "start", str(state)], capture_output=True,
                             text=True, timeout=240)
    if started.returncode != 0:
        raise ControlPlaneDown(f"kube-local.sh start failed: {started.stderr.strip()[-2000:] or 'no output'}")
    wait_until_pods_allowed(state, timeout)
    return state / "kubeconfig"


def stop(state: Path) -> None:
    """``kube-local.sh stop STATE``: the node's containers and processes (if any), the control plane."""
    subprocess.run(["bash", str(KUBE_LOCAL), "stop", str(state)], capture_output=True, timeout=300)


def dead_part(state: Path, parts: tuple[str, ...] = CONTROL_PLANE_PARTS) -> str | None:
    """The first of ``parts`` in STATE that no longer runs, with the last line of its log; None
    while all run (a zombie counts as gone; a part without a pid file was never started)."""
    for part in parts:
        pid_file = state / f"{part}.pid"
        if not pid_file.exists():
            continue
        if process_state(int(pid_file.read_text())) in (None, "Z"):
            log = state / f"{part}.log"
            lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            return f"kube-local's {part} exited ({lines[-1][-300:] if lines else 'no log'})"
    return None


def wait_until_pods_allowed(state: Path, timeout: float = 180) -> None:
    """Until the admin can create pods in ``default``: kube-local.sh returns once the server
    answers, and on a loaded box the rest comes later -- the RBAC authorizer's bootstrap policy,
    and the namespace's ``default`` service account, which the controller manager creates and
    the ServiceAccount admission plugin requires of every pod (both were seen as mlbench's own
    permission check saying 403 Forbidden to the admin). A part that exits ends the wait at once."""
    from kubernetes import client
    from kubernetes import config as kube_config

    api = kube_config.new_client_from_config(str(state / "kubeconfig"))
    review = {"spec": {"resourceAttributes": {"namespace": "default", "verb": "create", "resource": "pods"}}}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                if client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed:
                    client.CoreV1Api(api).read_namespaced_service_account("default", "default")
                    return
            except Exception:
                pass
            dead = dead_part(state)
            if dead:
                raise ControlPlaneDown(dead)
            time.sleep(0.5)
        raise ControlPlaneDown(f"the local API server did not let its admin create pods within {timeout:.0f}s "
                               "(RBAC's bootstrap policy or the default service account missing)")
    finally:
        api.close()
