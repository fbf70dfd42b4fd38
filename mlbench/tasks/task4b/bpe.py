"""Task 4b's text as BPE token ids: one shared vocabulary, trained once, encoded once, memory-mapped.

The vocabulary is a SentencePiece BPE model (Kudo & Richardson 2018, arXiv:1808.06226; BPE as
Sennrich et al. 2016) trained on the English and German training text together, so source,
target and output share one embedding as in Vaswani et al. 2017 (a joint vocabulary of about
32,000; mlbench uses 32,768). SentencePiece works on raw text, so decoding a translation gives
detokenised text, which is what sacreBLEU scores. Special ids: pad 0, unk 1, bos 2, eos 3.

Per data folder and vocabulary size, one cache entry in ``default_data_root()/wmt17-cache``
holds ``spm.model``, and per split and language the token ids of all sentences back to back
(``*.tokens.bin``, uint16 while the vocabulary fits, read with ``np.memmap``) plus where each
sentence starts (``*.offsets.npy``, int64 [N + 1]). Encoding runs in chunks, so building the
cache of the 4.6 M training pairs needs memory for one chunk, not for the corpus; the workers
of a run share the cache through the page cache.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import shutil
import tempfile
from dataclasses import dataclass, field

import numpy as np

from mlbench.errors import DataError
from mlbench.extras import needs
from mlbench.tasks.data.download import default_data_root, exclusive, one_line
from mlbench.tasks.task4b.wmt import FILES, LANGS, TEST, TRAIN, check_parallel

PAD, UNK, BOS, EOS = 0, 1, 2, 3
#: Sentences sampled to train the BPE model (SentencePiece's own sampling; the full corpus is encoded).
TRAINING_SENTENCES = 2_000_000
_CHUNK_LINES = 100_000
_CACHE_VERSION = 1


@dataclass
class Side:
    """One language of one split: sentence i is ``tokens[offsets[i]:offsets[i+1]]``."""

    tokens: np.ndarray
    offsets: np.ndarray
    _lengths: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        """Tokens per sentence (computed once: batching asks for it per micro-batch)."""
        if self._lengths is None:
            self._lengths = np.diff(self.offsets)
        return self._lengths

    def sentence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


@dataclass
class EncodedCorpus:
    """The encoded splits (``{"train": {"en": Side, "de": Side}, "newstest2014": ...}``), the
    raw German references of the test set and the BPE model that decodes translations."""

    splits: dict[str, dict[str, Side]]
    references: list[str]
    model_path: pathlib.Path
    vocab_size: int

    def processor(self):
        import sentencepiece as spm

        return spm.SentencePieceProcessor(model_file=str(self.model_path))


def _sentencepiece():
    with needs("nlp"):
        import sentencepiece as spm
    return spm


def encode_wmt17(folder: pathlib.Path, vocab_size: int) -> EncodedCorpus:
    """The checked text folder of :func:`mlbench.tasks.task4b.wmt.wmt17_folder`, BPE-encoded
    through its cache entry (built on first use, rebuilt when a file or the size changes)."""
    _sentencepiece()
    folder = folder.resolve()
    stats = {name: [(folder / name).stat().st_size, (folder / name).stat().st_mtime_ns] for name in FILES}
    key = {"version": _CACHE_VERSION, "source": str(folder), "vocab_size": vocab_size, "files": stats}
    cache_root = default_data_root() / "wmt17-cache"
    entry = cache_root / hashlib.sha1(f"{folder}\0{vocab_size}".encode()).hexdigest()[:16]
    if not _is_current(entry, key):
        try:
            with exclusive(cache_root / f".{entry.name}.lock"):
                if not _is_current(entry, key):
                    _build(folder, entry, key, vocab_size)
        except OSError as exc:
            raise DataError(f"could not write the WMT17 cache in {cache_root} ({one_line(exc)}); "
                            "free disk space there or set MLBENCH_DATA to another folder") from None
    meta = json.loads((entry / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    splits = {split: {lang: _open_side(entry / f"{split}.{lang}", dtype) for lang in LANGS}
              for split in (TRAIN, TEST)}
    references = list(_lines(folder / f"{TEST}.de"))
    return EncodedCorpus(splits, references, entry / "spm.model", meta["pieces"])


def _open_side(stem: pathlib.Path, dtype: np.dtype) -> Side:
    offsets = np.load(f"{stem}.offsets.npy")
    path = pathlib.Path(f"{stem}.tokens.bin")
    tokens = (np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype))
    return Side(tokens, offsets)


def _is_current(entry: pathlib.Path, key: dict) -> bool:
    try:
        return json.loads((entry / "meta.json").read_text())["key"] == key
    except (OSError, ValueError, KeyError):
        return False


def _train_bpe(folder: pathlib.Path, prefix: pathlib.Path, vocab_size: int) -> None:
    spm = _sentencepiece()
    try:
        spm.SentencePieceTrainer.train(
            input=[str(folder / f"{TRAIN}.{lang}") for lang in LANGS], model_prefix=str(prefix),
            model_type="bpe", vocab_size=vocab_size, hard_vocab_limit=False, character_coverage=1.0,
            pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS, input_sentence_size=TRAINING_SENTENCES,
            shuffle_input_sentence=True, num_threads=os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as exc:
        raise DataError(f"could not train the BPE vocabulary on {folder} ({one_line(exc)})") from None


def _lines(path: pathlib.Path):
    """Decoded lines without their newline (invalid UTF-8 replaced, as a tokenizer must cope)."""
    with open(path, "rb") as handle:
        for raw in handle:
            yield raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8", errors="replace")


def _encode_file(processor, source: pathlib.Path, stem: pathlib.Path, dtype: np.dtype) -> None:
    offsets = [np.zeros(1, dtype=np.int64)]
    total = 0
    with open(f"{stem}.tokens.bin", "wb") as out:
        lines = _lines(source)
        while chunk := list(itertools.islice(lines, _CHUNK_LINES)):
            ids = processor.encode(chunk, out_type=int, num_threads=os.cpu_count() or 1)
            lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
            out.write(flat.tobytes())
            offsets.append(total + np.cumsum(lengths))
            total += int(lengths.sum())
    np.save(f"{stem}.offsets.npy", np.concatenate(offsets))


def _build(folder: pathlib.Path, entry: pathlib.Path, key: dict, vocab_size: int) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    check_parallel(folder)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        _train_bpe(folder, staging / "spm", vocab_size)
        spm = _sentencepiece()
        processor = spm.SentencePieceProcessor(model_file=str(staging / "spm.model"))
        pieces = processor.get_piece_size()
        dtype = np.dtype(np.uint16 if pieces <= 1 << 16 else np.uint32)
        for split in (TRAIN, TEST):
            for lang in LANGS:
                _encode_file(processor, folder / f"{split}.{lang}", staging / f"{split}.{lang}", dtype)
        (staging / "meta.json").write_text(json.dumps({"key": key, "dtype": dtype.str, "pieces": pieces}))
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
