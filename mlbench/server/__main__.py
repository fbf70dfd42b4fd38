"""``python -m mlbench.server``: `mlbench serve` without loading the rest of the CLI (or PyTorch),
so that the service's pod starts, and restarts, in a fraction of a second."""

from __future__ import annotations

import sys

from mlbench.cli.serve import serve
from mlbench.errors import MlbenchError


def main() -> None:
    try:
        serve.main(prog_name="mlbench serve")
    except MlbenchError as err:
        print(f"Error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
