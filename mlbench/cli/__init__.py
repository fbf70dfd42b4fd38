"""The `mlbench` command line: thin click commands over the library.

Every command module registers its commands on :data:`cli`; :mod:`mlbench.cli.main` imports them
all and is the console script. Errors the library raises on
purpose (:class:`mlbench.errors.MlbenchError`) become one line on stderr and an exit code
(2 for usage errors); nothing else the user did wrong may show a traceback.
"""

from __future__ import annotations

import os
import sys

import click

from mlbench.version import __version__
from mlbench.errors import MlbenchError


class _Group(click.Group):
    """A click group that turns library errors into one readable line."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except MlbenchError as err:
            click.echo(f"Error: {err}", err=True)
            ctx.exit(err.exit_code)
        except KeyboardInterrupt:
            click.echo("Aborted.", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            # the reader went away (`mlbench ... | head`): stop quietly, as other tools do
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(141)
        except OSError as err:
            if os.environ.get("MLBENCH_DEBUG"):
                raise
            click.echo(f"Error: {err.strerror or err} ({getattr(err, 'filename', '') or 'I/O'}); "
                       "check the path and free disk space, then try again.", err=True)
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mlbench")
def cli() -> None:
    """Benchmark distributed machine-learning training: run the reference tasks on 1..N workers
    on this machine or a Kubernetes cluster and compare time to accuracy, speedup and cost."""

