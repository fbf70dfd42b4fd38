"""`mlbench serve`: the results service (run in a pod on each cluster; see mlbench.server)."""

from __future__ import annotations

import click

from mlbench.cli import cli


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (in a pod: the pod's IP).")
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--home", type=click.Path(file_okay=False),
              help="The run store (default: $MLBENCH_HOME); on a cluster, a persistent volume.")
@click.option("--namespace", help="Supervise the pods of runs in this Kubernetes namespace.")
def serve(host: str, port: int, home: str | None, namespace: str | None) -> None:
    """Serve the run store over HTTP to workers and the CLI (needs $MLBENCH_WORKER_TOKEN and
    $MLBENCH_ADMIN_TOKEN). `mlbench run` deploys it on a cluster by itself."""
    from mlbench.server.service import serve as run_service

    run_service(home, host, port, namespace)
