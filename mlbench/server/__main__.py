"""``python -m mlbench.server``: the results service's own entry point (the pod's command).

It loads neither the CLI nor PyTorch, so the service's pod starts, and restarts, in a fraction of
a second. ``mlbench serve`` takes the same options on a workstation.
"""

from __future__ import annotations

import argparse
import sys

from mlbench.errors import MlbenchError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mlbench.server",
                                     description="Serve the run store over HTTP to workers and the CLI "
                                                 "(needs $MLBENCH_WORKER_TOKEN and $MLBENCH_ADMIN_TOKEN).")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (in a pod: its IP)")
    parser.add_argument("--port", default=8080, type=int)
    parser.add_argument("--home", help="the run store (default: $MLBENCH_HOME); on a cluster, a volume")
    parser.add_argument("--namespace", help="supervise the pods of runs in this Kubernetes namespace")
    args = parser.parse_args(argv)
    from mlbench.server.httpd import serve

    try:
        serve(args.home, args.host, args.port, args.namespace)
    except MlbenchError as err:
        print(f"Error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
