"""FineWeb's 10B-token sample in GPT-2 tokens: where it comes from, how it is fetched and checked.

The shards are the modded-nanogpt speedrun's (``data/cached_fineweb10B.py``): the Hugging Face
dataset ``kjj0/fineweb10B-gpt2``, 103 train shards ``fineweb_train_000001.bin`` ...
``fineweb_train_000103.bin`` and the validation shard ``fineweb_val_000000.bin``, each about 100M
tokens in the format of :mod:`.shards`. They were made by llm.c's ``dev/data/fineweb.py`` from
FineWeb's ``sample-10BT`` (Penedo et al. 2024): documents tokenised with GPT-2's encoding, each
preceded by the end-of-text token 50256.

Each file's size and SHA-256 come from the Hub's file listing (the Git LFS object id is the
file's SHA-256), kept as ``manifest.json`` beside the shards, so that a download is checked as it
lands and ``mlbench data verify`` works offline later. ``$HF_ENDPOINT`` (as for huggingface_hub)
points at a mirror of the Hub. Downloads resume, show progress and hold the folder's lock
(:func:`mlbench.tasks.data.download.fetch`).
"""

from __future__ import annotations

import json
import os
import pathlib
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from mlbench.errors import DataError
from mlbench.jsonfile import write_json_atomic
from mlbench.tasks.data.paths import default_data_root, one_line

REPO = "kjj0/fineweb10B-gpt2"
ENDPOINT_ENV = "HF_ENDPOINT"
DEFAULT_ENDPOINT = "https://huggingface.co"
FOLDER = "fineweb10B"
MANIFEST = "manifest.json"
TRAIN_SHARDS = 103
VAL_NAME = "fineweb_val_000000.bin"
LISTING_TIMEOUT_S = 60


def train_name(index: int) -> str:
    """The name of train shard ``index`` (1 to 103)."""
    return f"fineweb_train_{index:06d}.bin"


def official_names() -> list[str]:
    """Every file of the data set: the validation shard, then the train shards in order."""
    return [VAL_NAME] + [train_name(i) for i in range(1, TRAIN_SHARDS + 1)]


def endpoint() -> str:
    return os.environ.get(ENDPOINT_ENV, DEFAULT_ENDPOINT).rstrip("/")


def listing_url() -> str:
    return f"{endpoint()}/api/datasets/{REPO}/tree/main"


def file_url(name: str) -> str:
    return f"{endpoint()}/datasets/{REPO}/resolve/main/{name}"


def default_root() -> pathlib.Path:
    return default_data_root() / FOLDER


@dataclass(frozen=True)
class Entry:
    """One file as its publisher lists it."""

    name: str
    size: int
    sha256: str


def parse_listing(entries: list[dict[str, Any]]) -> dict[str, Entry]:
    """The shards of a Hub tree listing (``[{"type": "file", "path", "size", "lfs": {"oid", "size"}}]``)."""
    found: dict[str, Entry] = {}
    for item in entries:
        lfs = item.get("lfs") or {}
        name = str(item.get("path", ""))
        if item.get("type") == "file" and name.endswith(".bin") and lfs.get("oid"):
            found[name] = Entry(name, int(lfs.get("size", item.get("size", 0))), str(lfs["oid"]))
    return found


def _fetch_listing() -> dict[str, Entry]:
    """The listing from the Hub, following its pages (a ``Link: <...>; rel="next"`` header)."""
    url: str | None = listing_url()
    entries: list[dict[str, Any]] = []
    while url:
        request = urllib.request.Request(url, headers={"User-Agent": "mlbench"})
        try:
            with urllib.request.urlopen(request, timeout=LISTING_TIMEOUT_S) as response:
                entries.extend(json.loads(response.read()))
                url = _next_page(response.headers.get("Link") or "")
        except (OSError, ValueError) as exc:
            raise DataError(f"could not list the files of {REPO} at {listing_url()} ({one_line(exc)}); "
                            "put the shards in a folder and pass --data-dir DIR") from None
    return parse_listing(entries)


def _next_page(link: str) -> str | None:
    for part in link.split(","):
        if 'rel="next"' in part and "<" in part:
            return part[part.index("<") + 1:part.index(">")]
    return None


def manifest(folder: pathlib.Path, fetch_missing: bool = True) -> dict[str, Entry]:
    """The files' sizes and SHA-256: ``folder/manifest.json``, or the Hub's listing saved there."""
    path = folder / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {name: Entry(name, int(e["size"]), str(e["sha256"])) for name, e in data["files"].items()}
    except FileNotFoundError:
        if not fetch_missing:
            raise DataError(f"{folder} has no {MANIFEST}: run `mlbench data download fineweb10B` once") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path} is damaged ({one_line(exc)}); delete it to list the files again") from None
    listed = _fetch_listing()
    missing = [n for n in official_names() if n not in listed]
    if missing:
        raise DataError(f"the listing of {REPO} lacks {len(missing)} of its shards ({missing[0]} first)")
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"repo": REPO, "files": {n: {"size": listed[n].size, "sha256": listed[n].sha256}
                                                     for n in official_names()}})
    return {n: listed[n] for n in official_names()}


def download(folder: pathlib.Path | None = None, train_shards: int = TRAIN_SHARDS) -> pathlib.Path:
    """Fetch the validation shard and the first ``train_shards`` train shards into ``folder``
    (default: the data root's ``fineweb10B``), each checked against the manifest; returns the folder."""
    from mlbench.tasks.data.download import exclusive, fetch

    if not 1 <= train_shards <= TRAIN_SHARDS:
        raise DataError(f"--train-shards {train_shards}: FineWeb's sample has 1 to {TRAIN_SHARDS} train shards")
    folder = folder or default_root()
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder / ".lock"):
        files = manifest(folder)
        for name in [VAL_NAME] + [train_name(i) for i in range(1, train_shards + 1)]:
            entry = files[name]
            target = folder / name
            if target.is_file() and target.stat().st_size != entry.size:
                raise DataError(f"{target} has {target.stat().st_size:,} bytes, not the {entry.size:,} listed; "
                                "delete it to download it again")
            try:
                fetch(file_url(name), target, sha256=entry.sha256, label=f"FineWeb {name}")
            except urllib.error.URLError as exc:
                raise DataError(f"could not download {name} from {file_url(name)} ({one_line(exc)}); "
                                "put the shards in a folder and pass --data-dir DIR") from None
            except (OSError, RuntimeError) as exc:
                raise DataError(f"could not download {name} ({one_line(exc)})") from None
    return folder


def verify(folder: pathlib.Path) -> tuple[list[str], list[str]]:
    """(the official files in ``folder`` that match the manifest, the problems: one line each)."""
    import hashlib

    files = manifest(folder, fetch_missing=False)
    good, problems = [], []
    for name in official_names():
        path = folder / name
        if not path.is_file():
            continue
        size = path.stat().st_size
        if size != files[name].size:
            problems.append(f"{name}: {size:,} bytes, not {files[name].size:,}")
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
        if digest.hexdigest() != files[name].sha256:
            problems.append(f"{name}: SHA-256 {digest.hexdigest()[:12]}..., not {files[name].sha256[:12]}...")
        else:
            good.append(name)
    return good, problems
