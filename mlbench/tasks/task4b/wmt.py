"""WMT17 English-German, the data set of task 4b: where it comes from and the plain-text layout.

The training data is the selection of the original MLBench reference (and of the MLPerf
Transformer reference it came from) among the WMT17 news-task en-de corpora; BLEU is measured
on newstest2014 (3,003 sentences), the test set of Vaswani et al. 2017:

=====================  ===========================================================================  =======
corpus                 archive (first address; the second is Hugging Face's copy)                    size
=====================  ===========================================================================  =======
Europarl v7            https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz               658 MB
                       https://huggingface.co/datasets/wmt/wmt13/resolve/main/training-parallel-europarl-v7.tgz
Common Crawl           https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz               918 MB
                       https://huggingface.co/datasets/wmt/wmt13/resolve/main/training-parallel-commoncrawl.tgz
News Commentary v12    https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz  169 MB
                       https://huggingface.co/datasets/wmt/wmt17-data/resolve/main/translation-task/training-parallel-nc-v12.tgz
newstest2014 (full)    https://statmt.org/wmt14/test-full.tgz (md5 a8cd784e006feb32ac6f3d9ec7eb389a,
                       the archive sacreBLEU's ``wmt14/full`` uses)
=====================  ===========================================================================  =======

About 4.6 M sentence pairs, 1.7 GB to download. A data folder (``--data-dir``, or
``default_data_root()/wmt17-en-de`` where the download lands) holds four line-aligned UTF-8
text files, one sentence per line: ``train.en``, ``train.de``, ``newstest2014.en``,
``newstest2014.de``. The download writes exactly these (the archives are removed afterwards);
the test set's SGML segments are read as sacreBLEU reads them.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass

from mlbench.errors import DataError
from mlbench.tasks.data.download import DOWNLOAD_ERRORS, exclusive, fetch, one_line
from mlbench.tasks.data.download import default_data_root as default_data_root  # still importable from here
from mlbench.tasks.task4b.wmt_layout import FILES, LANGS, TEST, TRAIN, aligned_pairs, default_folder

_SIDE_NAMES = {"en": "English (source)", "de": "German (target)"}


@dataclass(frozen=True)
class Archive:
    """One downloadable archive and the files (per language) taken from it."""

    name: str
    urls: tuple[str, ...]
    members: dict[str, str]
    md5: str | None = None


_HF = "https://huggingface.co/datasets/wmt"
TRAIN_ARCHIVES = (
    Archive("europarl-v7", ("https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
                            f"{_HF}/wmt13/resolve/main/training-parallel-europarl-v7.tgz"),
            {"en": "training/europarl-v7.de-en.en", "de": "training/europarl-v7.de-en.de"}),
    Archive("commoncrawl", ("https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
                            f"{_HF}/wmt13/resolve/main/training-parallel-commoncrawl.tgz"),
            {"en": "commoncrawl.de-en.en", "de": "commoncrawl.de-en.de"}),
    Archive("news-commentary-v12",
            ("https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
             f"{_HF}/wmt17-data/resolve/main/translation-task/training-parallel-nc-v12.tgz"),
            {"en": "training/news-commentary-v12.de-en.en", "de": "training/news-commentary-v12.de-en.de"}),
)
TEST_ARCHIVE = Archive("newstest2014", ("https://statmt.org/wmt14/test-full.tgz",),
                       {"en": "test-full/newstest2014-deen-src.en.sgm", "de": "test-full/newstest2014-deen-ref.de.sgm"},
                       md5="a8cd784e006feb32ac6f3d9ec7eb389a")


_NAMES = "train.en, train.de, newstest2014.en and newstest2014.de (line-aligned text, one sentence per line)"


def _hint(folder: pathlib.Path) -> str:
    if folder == default_folder():
        return f"put {_NAMES} into {folder} or pass --data-dir DIR holding them"
    return f"--data-dir must hold {_NAMES}"


def wmt17_folder(data_dir: str | os.PathLike | None = None, download: bool = True) -> pathlib.Path:
    """The folder holding the four text files (a missing or empty one is a DataError; the line
    counts are checked by :func:`check_parallel` when the BPE cache is built); with ``data_dir``
    None, ``default_data_root()/wmt17-en-de``, downloaded there on first use."""
    if data_dir is not None:
        folder = pathlib.Path(data_dir).expanduser()
    else:
        folder = default_folder()
        if not all((folder / name).is_file() for name in FILES):
            if not download:
                raise DataError(f"WMT17 en-de is not in {folder}; {_hint(folder)}")
            _download(folder)
    for split in (TRAIN, TEST):
        for lang in LANGS:
            path = folder / f"{split}.{lang}"
            if not path.is_file():
                raise DataError(f"{path} is missing (the {_SIDE_NAMES[lang]} side of {split}); {_hint(folder)}")
            if path.stat().st_size == 0:
                raise DataError(f"{path} is empty; {_hint(folder)}")
    return folder


def count_lines(path: pathlib.Path) -> int:
    """Lines of a file (a last line without a newline counts)."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def check_parallel(folder: pathlib.Path) -> dict[str, int]:
    """Sentence pairs per split of a folder :func:`wmt17_folder` accepted; a DataError when the
    two sides of a split have different line counts."""
    return aligned_pairs(folder, count_lines)


def _download(folder: pathlib.Path) -> None:
    """Download the archives and write the four text files into ``folder`` (once, under a lock;
    the files appear together, the archives are removed)."""
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder / ".lock"):
        if all((folder / name).is_file() for name in FILES):
            return
        staging = pathlib.Path(tempfile.mkdtemp(prefix=".download-", dir=folder))
        try:
            for archive in TRAIN_ARCHIVES:
                _append_members(archive, staging, TRAIN)
            _extract_test(staging)
            for name in FILES:
                os.replace(staging / name, folder / name)
        except (*DOWNLOAD_ERRORS, KeyError) as exc:
            raise DataError(f"could not download WMT17 en-de ({one_line(exc)}); {_hint(folder)}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _fetch_any(archive: Archive, dest: pathlib.Path) -> None:
    """Download from the first address that answers; the last failure is raised."""
    for i, url in enumerate(archive.urls):
        try:
            fetch(url, dest, md5=archive.md5)
            return
        except DOWNLOAD_ERRORS as exc:
            if i == len(archive.urls) - 1:
                raise OSError(f"{archive.name} from {url}: {one_line(exc)}") from None


def _members(archive: Archive, staging: pathlib.Path) -> dict[str, pathlib.Path]:
    """Download ``archive`` and extract its member per language; the archive is removed."""
    path = staging / f"{archive.name}.tgz"
    _fetch_any(archive, path)
    wanted = {member: lang for lang, member in archive.members.items()}
    out: dict[str, pathlib.Path] = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for info in tar:
                lang = wanted.get(info.name.removeprefix("./"))
                source = tar.extractfile(info) if lang else None
                if lang is not None and source is not None:
                    out[lang] = staging / f"{archive.name}.{lang}.part"
                    with source, open(out[lang], "wb") as target:
                        shutil.copyfileobj(source, target)
    finally:
        path.unlink(missing_ok=True)
    missing = sorted(set(archive.members.values()) - {archive.members[lang] for lang in out})
    if missing:
        raise KeyError(f"{archive.name} has no {', '.join(missing)}")
    return out


def _append_members(archive: Archive, staging: pathlib.Path, split: str) -> None:
    parts = _members(archive, staging)
    if count_lines(parts["en"]) != count_lines(parts["de"]):
        raise OSError(f"the two sides of {archive.name} have different line counts")
    for lang, part in parts.items():
        with open(part, "rb") as source, open(staging / f"{split}.{lang}", "ab") as target:
            shutil.copyfileobj(source, target)
            if target.tell() and not _ends_with_newline(part):
                target.write(b"\n")
        part.unlink()


def _ends_with_newline(path: pathlib.Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() == 0:
            return True
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")


def sgm_segments(text: str) -> list[str]:
    """The segments of an SGML test file, cleaned as sacreBLEU cleans them (whitespace runs
    become one space; entities are kept as written)."""
    return [re.sub(r"\s+", " ", _SEG.sub(r"\1", line.strip()).strip())
            for line in text.splitlines() if line.strip().startswith("<seg ")]


def _extract_test(staging: pathlib.Path) -> None:
    parts = _members(TEST_ARCHIVE, staging)
    for lang, part in parts.items():
        segments = sgm_segments(part.read_text(encoding="utf-8"))
        (staging / f"{TEST}.{lang}").write_text("".join(s + "\n" for s in segments), encoding="utf-8")
        part.unlink()
