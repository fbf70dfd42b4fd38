"""KIND through the docker SDK against a Docker engine the test starts, with the `kind` command
as a recorded stand-in (kind_standin.py); and the worker image build."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import docker
import pytest
import yaml
from click.testing import CliRunner

from mlbench import __version__
from mlbench.cli import cli
from mlbench.cli import clusters as _cluster_commands  # noqa: F401  (registers the commands)
from mlbench.cloud import config
from mlbench.cloud.image import build_context, build_image, worker_image_tag
from mlbench.cloud.kind import CLUSTER_LABEL, kind_config
from mlbench.cloud.provisioner import ClusterSpec

REPO = Path(__file__).resolve().parents[2]


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def engine(docker_engine, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", docker_engine)
    return docker.DockerClient(base_url=docker_engine)


@pytest.fixture
def tiny_source(tmp_path):
    """A source checkout whose Dockerfile needs no base image (the real one pulls python)."""
    root = tmp_path / "src"
    (root / "docker").mkdir(parents=True)
    (root / "mlbench").mkdir()
    (root / "mlbench" / "__init__.py").write_text("__version__ = 'test'\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'mlbench'\n")
    (root / "docker" / "Dockerfile").write_text(
        "FROM scratch\nARG TORCH_INDEX_URL\nARG MLBENCH_VERSION\nCOPY pyproject.toml /src/\n"
        "COPY mlbench /src/mlbench\nARG EXTRAS=\nLABEL torch-index=${TORCH_INDEX_URL} extras=\"${EXTRAS}\"\n")
    return root


def node_files(container) -> list[str]:
    stream, _ = container.get_archive("/kind/images")
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        return sorted(Path(m.name).name for m in tar.getmembers() if m.isfile())


def test_the_kind_config_has_one_control_plane_and_n_minus_1_workers():
    config_ = kind_config(ClusterSpec(name="dev", nodes=3, kubernetes_version="1.31.0"))
    assert [n["role"] for n in config_["nodes"]] == ["control-plane", "worker", "worker"]
    assert {n["image"] for n in config_["nodes"]} == {"kindest/node:v1.31.0"}
    assert config_["networking"] == {"apiServerAddress": "127.0.0.1"}


def test_without_docker_the_error_is_one_line():
    result = run("create-cluster", "kind", "3", "dev")
    assert result.exit_code == 1
    assert result.output.startswith("Error: Docker is not running or not reachable (")
    assert result.output.rstrip().endswith("start Docker (or set DOCKER_HOST) and rerun.")
    assert len(result.output.strip().splitlines()) == 1
    assert config.load_clusters() == []


def test_without_the_kind_command_the_error_says_how_to_install_it(engine, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run("create-cluster", "kind", "2", "dev", "--no-image")
    assert result.exit_code == 1 and "The `kind` command was not found; install it" in result.output


def test_create_list_resume_and_delete_a_kind_cluster(engine, kind_standin, tiny_source):
    image = build_image(tag="mlbench/worker:test", root=tiny_source, client=engine)
    # the JAX port's variant (`mlbench image build --framework jax` tags it IMAGE-jax): missing, it
    # stops the create before any node starts, naming the command that builds it
    missing = run("create-cluster", "kind", "3", "dev", "--image", image, "--framework", "jax")
    assert missing.exit_code == 1 and missing.output.strip().splitlines()[-1] == (
        "Error: The Docker image mlbench/worker:test-jax is not on this machine; build it with "
        "`mlbench image build --framework jax` (or pass --image), then rerun.")
    assert engine.containers.list(all=True, filters={"label": CLUSTER_LABEL}) == []
    engine.images.get(image).tag("mlbench/worker", "test-jax")
    created = run("create-cluster", "kind", "3", "dev", "--image", image, "--framework", "jax")
    assert created.exit_code == 0, created.output
    assert "Estimated cost: $0.00/hour" in created.output
    assert 'kind: Creating cluster "dev" ...' in created.output
    assert "not yet present on node \"dev-worker2\", loading..." in created.output
    assert "Loading mlbench/worker:test-jax into the nodes of dev." in created.output

    nodes = engine.containers.list(filters={"label": f"{CLUSTER_LABEL}=dev"})
    assert sorted(n.name for n in nodes) == ["dev-control-plane", "dev-worker", "dev-worker2"]
    for node in nodes:  # the images reached every node: no registry involved
        assert node_files(node) == ["mlbench_worker:test-jax.tar", "mlbench_worker:test.tar"]

    record = config.current_cluster()
    assert (record.key, record.nodes, record.image) == (("kind", "dev"), 3, image)
    kube = yaml.safe_load(record.kubeconfig.read_text())
    server = next(c["cluster"]["server"] for c in kube["clusters"] if c["name"] == record.context)
    assert server.startswith("https://127.0.0.1:")
    assert not (Path.home() / ".kube" / "config").exists() or "kind-dev" not in (
        Path.home() / ".kube" / "config").read_text()

    line = next(ln for ln in run("list-clusters").output.splitlines() if " dev " in ln)
    assert line.split()[:5] == ["*", "kind", "dev", "3", "ready"]

    again = run("create-cluster", "kind", "3", "dev", "--image", image)
    assert again.exit_code == 0 and "KIND cluster dev exists; resuming." in again.output
    assert len(engine.containers.list(filters={"label": f"{CLUSTER_LABEL}=dev"})) == 3

    nodes[0].stop(timeout=0)
    stopped = next(ln for ln in run("list-clusters").output.splitlines() if " dev " in ln)
    assert "stopped" in stopped

    deleted = run("delete-cluster", "kind", "dev", "--yes")
    assert deleted.exit_code == 0, deleted.output
    assert engine.containers.list(all=True, filters={"label": f"{CLUSTER_LABEL}=dev"}) == []
    assert config.load_clusters() == []


def test_a_ports_variant_without_the_image_it_varies_is_a_usage_error():
    result = run("create-cluster", "kind", "2", "dev", "--no-image", "--framework", "jax")
    assert (result.exit_code, result.output) == (
        2, "Error: --framework loads variants of the image; leave out --no-image\n")
    assert config.load_clusters() == []


def test_a_missing_image_stops_the_create_before_any_node_starts(engine, kind_standin):
    result = run("create-cluster", "kind", "2", "dev", "--image", "mlbench/worker:absent")
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        "Error: The Docker image mlbench/worker:absent is not on this machine; build it with "
        "`mlbench image build` (or pass --image), then rerun.")
    assert engine.containers.list(all=True, filters={"label": CLUSTER_LABEL}) == []
    assert config.load_clusters() == []


def test_image_build_tags_the_version_and_passes_docker_output_to_the_caller(engine, tiny_source):
    result = run("image", "build", "--source", str(tiny_source), "--cuda")
    assert result.exit_code == 0, result.output
    assert f"Built mlbench/worker:{__version__}-cuda." in result.output
    lines: list[str] = []
    build_image(tag="mlbench/worker:lines", root=tiny_source, client=engine, progress=lines.append)
    assert "Step 1/7 : FROM scratch" in lines
    labels = engine.images.get(f"mlbench/worker:{__version__}-cuda").labels
    assert labels["torch-index"] == "https://download.pytorch.org/whl/cu124" and labels["extras"] == ""

    # a port's variant: its pip extras as the EXTRAS argument, named in the tag in one order
    ports = run("image", "build", "--source", str(tiny_source), "--framework", "tensorflow", "--framework", "jax")
    assert ports.exit_code == 0, ports.output
    assert f"Built mlbench/worker:{__version__}-jax-tensorflow." in ports.output
    labels = engine.images.get(f"mlbench/worker:{__version__}-jax-tensorflow").labels
    assert labels["torch-index"] == "https://download.pytorch.org/whl/cpu" and labels["extras"] == "jax tensorflow"
    refused = run("image", "build", "--source", str(tiny_source), "--cuda", "--framework", "jax")
    assert refused.exit_code == 2 and refused.output == (
        "Error: --framework: the JAX and TensorFlow ports train on CPUs; build their image without --cuda\n")


def test_a_failing_build_is_one_line(engine, tiny_source):
    (tiny_source / "docker" / "Dockerfile").write_text("FROM scratch\nCOPY missing.txt /\n")
    result = run("image", "build", "--source", str(tiny_source), "--tag", "broken:1")
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1].startswith("Error: Building broken:1 failed (")


def test_the_build_context_holds_only_what_the_dockerfile_copies():
    with tarfile.open(fileobj=build_context(REPO)) as tar:
        names = tar.getnames()
    assert names[0] == "Dockerfile"
    assert {"pyproject.toml", "README.md", "LICENSE", "mlbench/__init__.py",
            "mlbench/cloud/image.py"} <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in names if n.startswith(("tests/", ".git", "docker/"))]
    assert worker_image_tag() == f"mlbench/worker:{__version__}"
    assert worker_image_tag(cuda=True) == f"mlbench/worker:{__version__}-cuda"
