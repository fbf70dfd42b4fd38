"""Shell completion of run ids and names, task names and cluster names (click's
``shell_complete`` callbacks; docs/scripting.md, "Shell completion").

The shell runs `mlbench` once per Tab, so these read local files only: the run catalog (this
machine's, or the last copy of the current cluster's, without contacting the cluster), the task
table and clusters.yaml. Nothing here imports torch or a cloud SDK, and a store that cannot be
read completes nothing rather than printing an error into the command line.
"""

from __future__ import annotations

from typing import Any

import click
from click.shell_completion import CompletionItem

from mlbench.tasks.registry import TASKS


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Run ids and names starting with ``incomplete``, newest first."""
    from mlbench.launch.session import cached_store

    try:
        records = cached_store().list()
    except Exception:
        return []
    items = []
    for record in reversed(records):
        about = f"{record.task}, {record.workers} worker(s), {record.state}"
        items += [CompletionItem(value, help=about) for value in (record.id, record.name)
                  if value.startswith(incomplete)]
    return items


def complete_groups(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Group ids (`mlbench run ... --repeat`, several worker counts) starting with ``incomplete``."""
    from mlbench.launch.session import cached_store

    try:
        records = cached_store().list()
    except Exception:
        return []
    groups: dict[str, Any] = {}
    for record in reversed(records):
        if record.group_id and record.group_id.startswith(incomplete):
            groups.setdefault(record.group_id, record.task)
    return [CompletionItem(group, help=f"runs of {task}") for group, task in groups.items()]


def complete_tasks(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    return [CompletionItem(name, help=spec.title) for name, spec in TASKS.items()
            if name.startswith(incomplete)]


def complete_clusters(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Names of the clusters mlbench knows (of ``provider`` when that was given before)."""
    from mlbench.cloud.config import load_clusters

    provider = ctx.params.get("provider")
    try:
        records = load_clusters()
    except Exception:
        return []
    return [CompletionItem(r.name, help=f"{r.provider} cluster") for r in records
            if r.name.startswith(incomplete) and provider in (None, r.provider)]
