"""add-cluster against a real kube-apiserver (../shared/k8s/kube-local.sh): adopt, list, set,
forget; permission and reachability errors; the GPU device plugin DaemonSet."""

from __future__ import annotations

import base64
import socket
import stat
import time

import pytest
import yaml
from click.testing import CliRunner
from kubernetes import client
from kubernetes import config as kube_config

from mlbench.cli import cli
from mlbench.cli import clusters as _cluster_commands  # noqa: F401  (registers the commands)
from mlbench.cloud import config, existing, gpu
from mlbench.errors import UsageError

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")

# Tests marked kube get a long timeout: the first use may build the apiserver (kube-local.sh).


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def admin(kubeconfig) -> client.ApiClient:
    return kube_config.new_client_from_config(config_file=str(kubeconfig), context="kube-local")


def token_kubeconfig(tmp_path, kube_local, token: str, name: str = "reader"):
    server = yaml.safe_load(kube_local.read_text())["clusters"][0]["cluster"]
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": server}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}))
    return path


@pytest.mark.kube
@pytest.mark.timeout(1800)
def test_adopt_list_set_and_forget_a_cluster(kube_local):
    before = kube_local.read_bytes()
    added = run("add-cluster", "lab", "--context", "kube-local", "--kubeconfig", str(kube_local))
    assert added.exit_code == 0, added.output
    assert "Added cluster lab (0 nodes, namespace default)" in added.output

    record = config.find_cluster("existing", "lab")
    assert not record.created_by_mlbench
    assert stat.S_IMODE(record.kubeconfig.stat().st_mode) == 0o600
    namespaces = client.CoreV1Api(config.kube_api_client(record)).list_namespace()
    assert "kube-system" in [n.metadata.name for n in namespaces.items]

    listed = run("list-clusters")
    line = next(ln for ln in listed.output.splitlines() if "lab" in ln)
    assert line.split()[:6] == ["existing", "lab", "0", "ready", "kube-local", "0/0"]
    assert run("set-cluster", "existing", "lab").exit_code == 0
    assert config.current_cluster().key == ("existing", "lab")
    assert run("list-clusters").output.splitlines()[1].startswith("*")

    forgot = run("delete-cluster", "existing", "lab")
    assert forgot.exit_code == 0
    assert "the cluster itself was not touched" in forgot.output
    assert config.load_clusters() == [] and config.current_cluster() is None
    assert "mlbench-existing-lab" not in record.kubeconfig.read_text()
    assert kube_local.read_bytes() == before  # the user's kubeconfig is never written
    assert client.CoreV1Api(admin(kube_local)).list_namespace().items  # still there


@pytest.mark.kube
@pytest.mark.timeout(1800)
def test_the_context_is_found_through_kubeconfig_like_kubectl(kube_local, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{kube_local}")
    assert run("add-cluster", "viaenv", "--context", "kube-local").exit_code == 0
    again = run("add-cluster", "viaenv", "--context", "kube-local")
    assert again.exit_code == 2 and "already added" in again.output


@pytest.mark.kube
@pytest.mark.timeout(1800)
def test_a_context_that_may_not_create_pods_is_refused(kube_local, tmp_path):
    api = admin(kube_local)
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account("default", {"metadata": {"name": "reader"}})
    rbac.create_cluster_role({"metadata": {"name": "mlbench-test-reader"}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "get"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": "mlbench-test-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "mlbench-test-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]})
    token = None
    for _ in range(600):  # the token controller fills the service account's secret (loaded box: minutes)
        secrets = core.read_namespaced_service_account("reader", "default").secrets or []
        if secrets:
            data = core.read_namespaced_secret(secrets[0].name, "default").data or {}
            if "token" in data:
                token = base64.b64decode(data["token"]).decode()
                break
        time.sleep(0.2)
    assert token, "the service-account token controller gave no token"

    result = run("add-cluster", "limited", "--context", "reader", "--kubeconfig",
                 str(token_kubeconfig(tmp_path, kube_local, token)))
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: Context 'reader' may not create pods in namespace default (403 Forbidden); ask "
        "the cluster admin for that permission or use another context.")
    assert config.load_clusters() == []
    assert "mlbench-existing-limited" not in config.kubeconfig_path().read_text()

    rejected = run("add-cluster", "wrong", "--context", "reader", "--kubeconfig",
                   str(token_kubeconfig(tmp_path, kube_local, "not-a-token")))
    assert rejected.exit_code == 1 and "rejected its credentials (401)" in rejected.output


@pytest.mark.kube
@pytest.mark.timeout(1800)
def test_a_namespace_without_its_service_account_yet_says_so_and_a_retry_works(kube_local):
    """A namespace just made has no ``default`` service account until the controller manager
    creates it, and the ServiceAccount admission plugin refuses pods with 403 until then: the
    error says so (not "ask the cluster admin for that permission"), and a retry succeeds. The
    control plane's controller manager is held (SIGSTOP) to keep the moment open."""
    import os
    import signal

    manager = int((kube_local.parent / "controller-manager.pid").read_text())
    core = client.CoreV1Api(admin(kube_local))
    os.kill(manager, signal.SIGSTOP)
    try:
        core.create_namespace({"metadata": {"name": "fresh"}})
        refused = run("add-cluster", "fresh", "--context", "kube-local", "--kubeconfig", str(kube_local),
                      "--namespace", "fresh")
    finally:
        os.kill(manager, signal.SIGCONT)
    assert refused.exit_code == 1
    assert refused.output.strip() == (
        "Error: The cluster of context 'kube-local' refused to create pods in namespace fresh: pods "
        '"mlbench-access-check" is forbidden: error looking up service account fresh/default: serviceaccount '
        '"default" not found. A new namespace gets its default service account from the controller manager '
        "within seconds; retry (if it persists, the controller manager is not running)."), refused.output
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        added = run("add-cluster", "fresh", "--context", "kube-local", "--kubeconfig", str(kube_local),
                    "--namespace", "fresh")
        if added.exit_code == 0:
            break
        time.sleep(1)
    assert "Added cluster fresh (0 nodes, namespace fresh)" in added.output, added.output
    assert run("delete-cluster", "existing", "fresh").exit_code == 0
    core.delete_namespace("fresh")


@pytest.mark.kube
@pytest.mark.timeout(1800)
def test_the_nvidia_device_plugin_is_installed_once(kube_local):
    api = admin(kube_local)
    assert gpu.ensure_nvidia_device_plugin(api, "kube-local") is True
    assert gpu.ensure_nvidia_device_plugin(api, "kube-local") is False
    daemonset = client.AppsV1Api(api).read_namespaced_daemon_set(gpu.DEVICE_PLUGIN_NAME,
                                                                 "kube-system")
    pod = daemonset.spec.template.spec
    assert pod.containers[0].image == gpu.DEVICE_PLUGIN_IMAGE
    assert pod.node_selector == {gpu.GPU_NODE_LABEL: "true"}
    assert pod.containers[0].security_context.allow_privilege_escalation is False
    assert [t.key for t in pod.tolerations] == ["nvidia.com/gpu"]


def test_an_unreachable_cluster_is_one_line(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "gone.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "gone", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                  "insecure-skip-tls-verify": True}}],
        "users": [{"name": "gone", "user": {"token": "t"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "gone"}}]}))
    result = run("add-cluster", "gone", "--context", "gone", "--kubeconfig", str(path))
    assert result.exit_code == 1
    assert result.output.startswith("Error: Cannot reach the Kubernetes API of context 'gone' "
                                    "to list nodes (")
    assert len(result.output.strip().splitlines()) == 1


def test_an_unknown_context_is_a_usage_error_listing_the_known_ones(tmp_path):
    path = tmp_path / "k"
    path.write_text(yaml.safe_dump({"contexts": [{"name": "minikube", "context": {}}]}))
    result = CliRunner().invoke(cli, ["add-cluster", "x", "--context", "nope", "--kubeconfig",
                                      str(path)])
    assert result.exit_code == 2
    assert "No kube context named 'nope' (have: minikube)" in result.output


def test_relative_credential_paths_are_made_absolute(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "config"
    path.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1",
                                               "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": {"client-certificate": "certs/me.crt",
                                         "client-key": "/abs/me.key"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u",
                                                 "namespace": "bench"}}]}))
    access, namespace = existing.read_context("ctx", str(path))
    assert access.cluster["certificate-authority"] == str(tmp_path / "sub" / "ca.crt")
    assert access.user["client-certificate"] == str(tmp_path / "sub" / "certs" / "me.crt")
    assert access.user["client-key"] == "/abs/me.key"
    assert namespace == "bench"
    with pytest.raises(UsageError, match="does not exist"):
        existing.read_context("ctx", str(tmp_path / "missing"))
