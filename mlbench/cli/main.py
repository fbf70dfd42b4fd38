"""The `mlbench` console script: the command group with every command module's commands.

Apart from :mod:`mlbench.cli` itself (the group, which every command module imports to register
on), so that the group never imports the modules that import it.
"""

from __future__ import annotations

import sys

from mlbench.cli import cli


def main() -> None:
    """Console-script entry point."""
    if sys.argv[1:2] == ["token"]:  # the kubeconfig's exec plugin: at once, without the commands
        from mlbench.cloud.token import main as token

        sys.exit(token(sys.argv[2:]))
    from mlbench.cli import commands  # noqa: F401  (registers the commands)

    cli(prog_name="mlbench")


if __name__ == "__main__":  # pragma: no cover
    main()
    sys.exit(0)
