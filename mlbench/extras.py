"""Optional dependencies, installed as extras: ``pip install 'mlbench-suite[aws]'``.

The core install (click, torch, torchvision, numpy, pyyaml, tabulate) runs benchmarks on this
machine; clouds, Kubernetes, charts, the dashboard and MLPerf's checker each need packages that
a laptop run or a worker image does not (docs/getting-started.md, "Install"). Every import of
such a package goes through :func:`needs`, so that a command whose extra is missing stops with
one line that says what to install (:class:`MissingExtra`, exit code 1), instead of a traceback:

    with needs("aws"):
        import boto3
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from mlbench.errors import MlbenchError

#: Each extra of pyproject.toml: what it is for, and the top-level modules it provides.
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "charts": ("matplotlib", ("matplotlib",)),
    "aws": ("the AWS SDK (boto3)", ("boto3", "botocore")),
    "gcp": ("the Google Cloud client (google-api-python-client, google-auth)",
            ("googleapiclient", "google", "google_auth_httplib2", "httplib2")),
    "kubernetes": ("the Kubernetes client", ("kubernetes", "urllib3")),
    "kind": ("the Docker SDK", ("docker", "requests")),
    "dashboard": ("starlette and uvicorn", ("starlette", "uvicorn")),
    # exporters (mlbench.results.exporters): each tool's own library writes its own files
    "tensorboard": ("TensorBoard", ("tensorboard",)),
    "mlflow": ("MLflow", ("mlflow",)),
    "wandb": ("Weights & Biases (wandb)", ("wandb",)),
    "jax": ("JAX and Optax (the JAX port, --framework jax)", ("jax", "jaxlib", "optax")),
    "tensorflow": ("TensorFlow 2 (the TensorFlow port, --framework tensorflow)", ("tensorflow",)),
    "gpt": ("tiktoken (GPT-2's tokenizer, for your own text as task 5a's shards)", ("tiktoken",)),
    "nlp": ("sacreBLEU and SentencePiece (task 4b's BLEU and BPE vocabulary)", ("sacrebleu", "sentencepiece")),
    "mlperf": ("MLPerf's compliance checker (mlperf-logging)", ("mlperf_logging",)),
}


class MissingExtra(MlbenchError):
    """An optional dependency is not installed: one line naming its extra, exit code 1 in every
    command (docs/running.md, "Exit codes")."""


#: The distribution's name on the package index (the command and the import are `mlbench`; that
#: name on the index is an unrelated package).
DISTRIBUTION = "mlbench-suite"


def install_hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


@contextlib.contextmanager
def needs(extra: str) -> Iterator[None]:
    """Imports in this block come from ``extra``; if one of its modules is missing, raise
    :class:`MissingExtra` with the install command. A missing module of another package is a
    real bug and propagates unchanged."""
    what, modules = EXTRAS[extra]
    try:
        yield
    except ImportError as err:
        missing = (err.name or "").split(".")[0]
        if missing not in modules:
            raise
        raise MissingExtra(f"this needs {what}, which is not installed: {install_hint(extra)}") from None
