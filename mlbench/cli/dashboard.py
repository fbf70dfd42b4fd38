"""`mlbench dashboard`: the web dashboard over the run store (mlbench.dashboard)."""

from __future__ import annotations

import click

from mlbench.cli import cli


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback is reachable from other machines.")
@click.option("--port", default=0, type=int, show_default=True, help="Port; 0: any free port.")
@click.option("--open", "open_browser", is_flag=True, help="Open the dashboard in the web browser.")
def dashboard(host, port, open_browser) -> None:
    """Watch, compare and start runs in the browser: serves the dashboard and prints its
    address with the access token.

    \b
    Examples:
      mlbench dashboard
      mlbench dashboard --open
    """
    from mlbench.dashboard.server import serve

    serve(host, port, open_browser, echo=lambda line: click.echo(line, err=line.startswith("Warning")))
