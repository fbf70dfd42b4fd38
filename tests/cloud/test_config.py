"""The cluster config: where it lives, file modes, contexts kept apart, current cluster."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from mlbench.cloud import config
from mlbench.errors import ClusterError, UsageError


def record(provider: str, name: str, nodes: int = 2) -> config.ClusterRecord:
    return config.ClusterRecord(provider=provider, name=name,
                                context=config.context_name(provider, name),
                                kubeconfig=config.kubeconfig_path(), nodes=nodes,
                                extra={"region": "us-east-1"})


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_config_dir_prefers_explicit_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("MLBENCH_CONFIG_DIR", str(tmp_path / "explicit"))
    assert config.config_dir() == tmp_path / "explicit"
    monkeypatch.delenv("MLBENCH_CONFIG_DIR")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config.config_dir() == tmp_path / "xdg" / "mlbench"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config.config_dir() == tmp_path / "home" / ".config" / "mlbench"


def test_records_round_trip_and_files_are_private():
    config.save_cluster(record("aws", "exp"))
    config.save_cluster(record("kind", "dev", 3))
    assert [(r.provider, r.name, r.nodes) for r in config.load_clusters()] == [
        ("aws", "exp", 2), ("kind", "dev", 3)]
    assert config.find_cluster("aws", "exp").extra == {"region": "us-east-1"}
    assert mode(config.config_dir() / config.CLUSTERS_FILE) == 0o600
    assert mode(config.config_dir()) == 0o700


def test_saving_a_record_again_replaces_it():
    config.save_cluster(record("aws", "exp", 2))
    config.save_cluster(record("aws", "exp", 5))
    assert [r.nodes for r in config.load_clusters()] == [5]


def test_kube_contexts_are_added_and_removed_without_touching_others():
    config.write_kube_context("mlbench-aws-a", {"server": "https://a"}, {"token": "ta"}, "default")
    config.write_kube_context("mlbench-kind-b", {"server": "https://b"}, {"token": "tb"})
    path = config.kubeconfig_path()
    assert mode(path) == 0o600
    config.remove_kube_context("mlbench-aws-a")
    kube = yaml.safe_load(path.read_text())
    assert [c["name"] for c in kube["contexts"]] == ["mlbench-kind-b"]
    assert kube["clusters"] == [{"name": "mlbench-kind-b", "cluster": {"server": "https://b"}}]
    assert kube["users"] == [{"name": "mlbench-kind-b", "user": {"token": "tb"}}]
    assert mode(path) == 0o600


def test_the_users_own_kubeconfig_is_never_written(tmp_path, monkeypatch):
    users = tmp_path / "user-kubeconfig"
    users.write_text("apiVersion: v1\nkind: Config\ncontexts: []\n")
    monkeypatch.setenv("KUBECONFIG", str(users))
    before = users.read_bytes()
    config.write_kube_context("mlbench-kind-x", {"server": "https://x"}, {"token": "t"})
    config.set_current(None)
    assert users.read_bytes() == before
    assert config.kubeconfig_path().parent == config.config_dir()


def test_current_cluster_follows_set_and_removal():
    exp = record("aws", "exp")
    config.save_cluster(exp)
    config.write_kube_context(exp.context, {"server": "https://x"}, {"token": "t"})
    assert config.current_cluster() is None
    config.set_current(exp)
    assert config.current_cluster().key == ("aws", "exp")
    assert yaml.safe_load(config.kubeconfig_path().read_text())["current-context"] == exp.context
    config.remove_cluster("aws", "exp")
    assert config.current_cluster() is None
    assert config.load_clusters() == []
    assert not config.has_kube_context(exp)


def test_resolve_cluster_needs_the_provider_only_when_names_clash():
    config.save_cluster(record("aws", "exp"))
    assert config.resolve_cluster("exp").provider == "aws"
    config.save_cluster(record("kind", "exp"))
    with pytest.raises(UsageError, match="Several clusters"):
        config.resolve_cluster("exp")
    assert config.resolve_cluster("exp", "kind").provider == "kind"
    with pytest.raises(UsageError, match="No cluster named 'nope'"):
        config.resolve_cluster("nope")


def test_kube_api_client_refuses_a_cluster_without_context():
    with pytest.raises(ClusterError, match="not ready yet"):
        config.kube_api_client(record("aws", "half"))


def test_corrupt_config_is_one_readable_error():
    config.config_dir().mkdir(parents=True)
    (config.config_dir() / config.CLUSTERS_FILE).write_text("clusters: [unclosed\n")
    with pytest.raises(ClusterError, match="not valid YAML"):
        config.load_clusters()
