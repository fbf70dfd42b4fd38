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
    from mlbench.server.httpd import serve as run_service

    run_service(home, host, port, namespace)


@cli.command("run-token")
@click.argument("run_ref", metavar="RUN")
def run_token_command(run_ref: str) -> None:
    """The token with which RUN's workers post their events to a results service (`mlbench
    serve`) started with $MLBENCH_WORKER_TOKEN: set it as MLBENCH_RESULTS_TOKEN on the worker
    machines. It lets them write to RUN only."""
    import os

    from mlbench.errors import UsageError
    from mlbench.launch.session import open_store
    from mlbench.results.http_sink import run_token

    secret = os.environ.get("MLBENCH_WORKER_TOKEN")
    if not secret:
        raise UsageError("set MLBENCH_WORKER_TOKEN to the worker secret the results service was started with")
    click.echo(run_token(secret, open_store(read_only=True).get(run_ref).id))
