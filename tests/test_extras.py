"""A command whose extra is not installed says, in one line, which extra to install.

Each case runs the real CLI in a subprocess in which the extra's modules cannot be imported
(``sys.modules[name] = None`` makes Python refuse the import, as for a module that is not
installed).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlbench.extras import needs

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
])
def test_a_missing_extra_is_one_line_naming_the_extra(modules, args, message):
    proc = run_without(modules, *args)
    assert (proc.returncode, proc.stderr, proc.stdout) == (1, f"Error: {message}\n", "")


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
