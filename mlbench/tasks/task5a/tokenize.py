"""Your own text as task 5a's shards, tokenised as llm.c tokenised FineWeb.

llm.c's ``dev/data/fineweb.py``: GPT-2's encoding (tiktoken's ``gpt2``), each document preceded by
the end-of-text token 50256, the tokens concatenated and cut into shards; the first shard is
the validation shard. Here the validation shard takes the first ``val_tokens`` tokens and the
train shards ``shard_tokens`` each, named as FineWeb's are, so that ``--data-dir`` reads them
as it reads FineWeb's. A document is a ``.txt`` file, or a line of a ``.jsonl`` file whose
``text`` field holds it (FineWeb's own rows).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from mlbench.errors import DataError, UsageError
from mlbench.tasks.task5a import fineweb
from mlbench.tasks.task5a.shards import write_shard

END_OF_TEXT = 50256


def documents(paths: Iterable[pathlib.Path]) -> Iterator[str]:
    """The documents of ``paths`` in order: a ``.txt`` file whole, a ``.jsonl`` file's ``text`` per line."""
    for path in paths:
        try:
            if path.suffix == ".jsonl":
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        if line.strip():
                            try:
                                yield str(json.loads(line)["text"])
                            except (ValueError, KeyError, TypeError):
                                raise DataError(f"{path}, line {number}: not a JSON object with a \"text\" field")\
                                    from None
            else:
                yield path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise DataError(f"{path} is not UTF-8 text") from None


def gpt2_encoding() -> Any:
    """tiktoken's GPT-2 encoding (tiktoken fetches its two files once, then reads its cache)."""
    from mlbench.extras import needs

    with needs("gpt"):
        import tiktoken
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as exc:  # tiktoken raises requests' and its own errors when it cannot fetch
        raise DataError(f"could not load GPT-2's tokenizer ({type(exc).__name__}: {exc}); tiktoken fetches it "
                        "once from openaipublic.blob.core.windows.net (or set TIKTOKEN_CACHE_DIR)") from None


def tokenize(paths: list[pathlib.Path], out: pathlib.Path, *, val_tokens: int, shard_tokens: int,
             encoding: Any = None) -> list[pathlib.Path]:
    """Write the shards of ``paths`` into ``out`` with ``encoding`` (GPT-2's by default: an object
    with tiktoken's ``encode_ordinary``); returns them, the validation shard first."""
    if val_tokens < 1 or shard_tokens < 1:
        raise UsageError("--val-tokens and --shard-tokens must be at least 1")
    encoding = encoding or gpt2_encoding()
    buffer: list[int] = []
    written: list[pathlib.Path] = []

    def flush(name: str, count: int) -> None:
        write_shard(out / name, np.asarray(buffer[:count], dtype=np.uint16))
        del buffer[:count]
        written.append(out / name)

    for text in documents(paths):
        buffer.append(END_OF_TEXT)
        buffer.extend(encoding.encode_ordinary(text))
        if not written and len(buffer) >= val_tokens:
            flush(fineweb.VAL_NAME, val_tokens)
        while written and len(buffer) >= shard_tokens:
            flush(fineweb.train_name(len(written)), shard_tokens)
    if not written:
        raise DataError(f"the text holds {len(buffer):,} tokens, not more than the {val_tokens:,} of the "
                        "validation shard; pass a smaller --val-tokens")
    if buffer:
        flush(fineweb.train_name(len(written)), len(buffer))
    if len(written) == 1:
        raise DataError("no tokens are left for training after the validation shard; pass a smaller --val-tokens")
    return written
