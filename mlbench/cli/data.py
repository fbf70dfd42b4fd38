"""`mlbench data`: the data sets on this machine: list them, download them, verify them, and
turn your own text into task 5a's shards."""

from __future__ import annotations

import pathlib

import click

from mlbench.cli import cli
from mlbench.cli.output import emit, output_option, tabulate
from mlbench.errors import DataError, UsageError

#: What `mlbench data download` knows how to fetch.
DOWNLOADABLE = ("cifar10", "epsilon", "wikitext2", "wmt17-en-de", "fineweb10B")


@cli.group()
def data() -> None:
    """The data sets: `list`, `download`, `verify`, and `tokenize` your own text for task 5a."""


def _fineweb_rows(folder: pathlib.Path) -> list[dict]:
    from mlbench.tasks.task5a import fineweb
    from mlbench.tasks.task5a.shards import TRAIN_PATTERN, VAL_PATTERN, find_shards, read_header

    shards = find_shards(folder, VAL_PATTERN) + find_shards(folder, TRAIN_PATTERN)
    try:
        listed = fineweb.manifest(folder, fetch_missing=False)
    except DataError:
        listed = {}
    return [{"name": p.name, "bytes": p.stat().st_size, "tokens": read_header(p),
             "listed": p.name in listed} for p in shards]


@data.command("list")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="The folder of task 5a's shards (default: the data root's fineweb10B).")
@output_option
def list_data(data_dir: str | None, output) -> None:
    """Where each data set lives, and the shards of FineWeb-10B found there."""
    from mlbench.tasks.data.paths import default_data_root
    from mlbench.tasks.task5a import fineweb

    folder = pathlib.Path(data_dir).expanduser() if data_dir else fineweb.default_root()
    shards = _fineweb_rows(folder) if folder.is_dir() else []
    document = {"data_root": str(default_data_root()), "fineweb10B": {"folder": str(folder), "shards": shards}}
    if output != "table":
        emit(document, output)
        return
    click.echo(f"Data root: {default_data_root()} ($MLBENCH_DATA)")
    train = [s for s in shards if s["name"].startswith("fineweb_train_")]
    val = [s for s in shards if s["name"].startswith("fineweb_val_")]
    click.echo(f"FineWeb-10B (task 5a) in {folder}: {len(val)} validation and {len(train)} of "
               f"{fineweb.TRAIN_SHARDS} train shards, {sum(s['tokens'] for s in shards):,} tokens")
    if shards:
        rows = [[s["name"], f"{s['tokens']:,}", f"{s['bytes']:,}", "yes" if s["listed"] else "no"] for s in shards]
        click.echo(tabulate(rows, headers=["shard", "tokens", "bytes", "in FineWeb's listing"]))


@data.command()
@click.argument("dataset", type=click.Choice(DOWNLOADABLE))
@click.option("--train-shards", type=int, default=None,
              help="fineweb10B: the first N of its 103 train shards (default: all; 10 hold about 1B tokens).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="fineweb10B: the folder to download into (default: the data root's fineweb10B).")
def download(dataset: str, train_shards: int | None, data_dir: str | None) -> None:
    """Download DATASET now (a run downloads what it lacks on first use), checking each file."""
    if dataset == "fineweb10B":
        from mlbench.tasks.task5a import fineweb

        folder = fineweb.download(pathlib.Path(data_dir).expanduser() if data_dir else None,
                                  fineweb.TRAIN_SHARDS if train_shards is None else train_shards)
        click.echo(f"FineWeb-10B is in {folder}")
        return
    if train_shards is not None or data_dir is not None:
        raise UsageError(f"--train-shards and --data-dir apply to fineweb10B, not to {dataset}")
    from mlbench.tasks.datasets import get_dataset

    get_dataset(dataset).prepare(None)
    click.echo(f"{dataset} is ready")


@data.command()
@click.argument("dataset", type=click.Choice(["fineweb10B"]))
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="The folder of the shards (default: the data root's fineweb10B).")
def verify(dataset: str, data_dir: str | None) -> None:
    """Check each shard's size and SHA-256 against FineWeb's listing (exit 1 when one differs)."""
    from mlbench.tasks.task5a import fineweb

    folder = pathlib.Path(data_dir).expanduser() if data_dir else fineweb.default_root()
    good, problems = fineweb.verify(folder)
    for line in problems:
        click.echo(line)
    click.echo(f"{len(good)} of {1 + fineweb.TRAIN_SHARDS} files of FineWeb-10B match its listing in {folder}"
               + (f"; {len(problems)} differ" if problems else ""))
    if problems:
        raise SystemExit(1)


@data.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="The folder for the shards; pass it to `mlbench run task5a --data-dir`.")
@click.option("--val-tokens", type=int, default=1_000_000, show_default=True,
              help="Tokens of the validation shard (the first ones).")
@click.option("--shard-tokens", type=int, default=100_000_000, show_default=True,
              help="Tokens per train shard.")
def tokenize(files: tuple[str, ...], out: str, val_tokens: int, shard_tokens: int) -> None:
    """Tokenise FILES (.txt: one document each; .jsonl: a document per line's "text") with GPT-2's
    encoding into task 5a's shards, as llm.c made FineWeb's (open division: not FineWeb)."""
    from mlbench.tasks.task5a.tokenize import tokenize as write

    written = write([pathlib.Path(f) for f in files], pathlib.Path(out).expanduser(), val_tokens=val_tokens,
                    shard_tokens=shard_tokens)
    click.echo(f"Wrote {len(written)} shards to {out}: {written[0].name} and {len(written) - 1} train shards")
