"""A command whose extra is not installed says, in one line, which extra to install.

Each case runs the real CLI in a subprocess in which the extra's modules cannot be imported
(``sys.modules[name] = None`` makes Python refuse the import, as for a module that is not
installed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlbench.extras import EXTRAS, needs

from tests.results.recorded import record_run

_RUN = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from mlbench.cli.main import main
sys.argv = ["mlbench", *sys.argv[2:]]
main()
"""


def run_without(modules: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _RUN, modules, *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, env=dict(os.environ))


@pytest.mark.parametrize("modules, args, message", [
    ("boto3,botocore", ["create-cluster", "aws", "2", "demo"],
     "this needs the AWS SDK (boto3), which is not installed: pip install 'mlbench-suite[aws]'"),
    ("googleapiclient,google", ["create-cluster", "gcloud", "2", "demo", "--project", "p"],
     "this needs the Google Cloud client (google-api-python-client, google-auth), which is not "
     "installed: pip install 'mlbench-suite[gcp]'"),
    ("docker", ["create-cluster", "kind", "1", "demo"],
     "this needs the Docker SDK, which is not installed: pip install 'mlbench-suite[kind]'"),
    ("docker", ["image", "build"],
     "this needs the Docker SDK, which is not installed: pip install 'mlbench-suite[kind]'"),
    ("wandb", ["export", "somerun", "--to", "wandb", "wb"],
     "--to wandb: this needs Weights & Biases (wandb), which is not installed: pip install 'mlbench-suite[wandb]'"),
    ("mlflow", ["run", "task1a", "1", "--data", "synthetic", "--log-to", "mlflow:ml"],
     "--log-to mlflow: this needs MLflow, which is not installed: pip install 'mlbench-suite[mlflow]'"),
    ("jax,jaxlib,optax", ["run", "task2a", "2", "--framework", "jax", "--data", "synthetic"],
     "--framework jax: JAX is not installed: pip install 'mlbench-suite[jax]'"),
])
def test_a_missing_extra_is_one_line_naming_the_extra(modules, args, message):
    proc = run_without(modules, *args)
    assert (proc.returncode, proc.stderr, proc.stdout) == (1, f"Error: {message}\n", "")


def test_check_without_mlperf_logging_names_the_extra_and_writes_nothing(tmp_path):
    from mlbench.results.store import RunStore

    run = record_run(RunStore(), workers=1, tta=9.0, wall=10.0)
    proc = run_without("mlperf_logging", "download", run.id, "--format", "mlperf", "--check",
                       "-o", str(tmp_path / "run.zip"))
    assert (proc.returncode, proc.stderr, proc.stdout) == (
        1, "Error: this needs MLPerf's compliance checker (mlperf-logging), which is not installed: "
           "pip install 'mlbench-suite[mlperf]'\n", "")
    assert not list(tmp_path.iterdir())


def test_every_extra_of_pyproject_is_registered_and_in_all():
    """Each extra a user can install is one :func:`needs` knows (and so names in its message),
    and `all` installs every one of them."""
    import tomllib

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    own = set(extras) - {"all", "test"}
    assert own == set(EXTRAS)
    (everything,) = extras["all"]
    assert set(re.fullmatch(r"mlbench-suite\[(.*)\]", everything).group(1).split(",")) == own


def test_runs_on_a_cluster_without_the_kubernetes_client_say_what_to_install():
    from mlbench.cloud import config

    record = config.ClusterRecord(provider="existing", name="lab", context="lab",
                                  kubeconfig=config.config_dir() / "kubeconfig", nodes=2)
    config.save_cluster(record)
    config.set_current(record)
    proc = run_without("kubernetes", "status")
    assert proc.returncode == 1
    assert proc.stderr == ("Error: this needs the Kubernetes client, which is not installed: "
                           "pip install 'mlbench-suite[kubernetes]'\n")


def test_a_missing_module_of_another_package_is_not_blamed_on_the_extra():
    with pytest.raises(ModuleNotFoundError, match="mlbench_no_such_module"), needs("aws"):
        import mlbench_no_such_module  # noqa: F401
