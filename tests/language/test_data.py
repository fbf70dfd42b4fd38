"""Data of tasks 3a and 4b: Wikitext-2 and WMT17 readers, caches, downloads, bad data, batching."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from mlbench.errors import DataError
from mlbench.tasks.task3a import wikitext
from mlbench.tasks.task3a.bptt import batchify, bptt_batches, bptt_lengths, eval_lengths, worker_columns
from mlbench.tasks.task4b import bpe, wmt
from mlbench.tasks.task4b.bucketing import (GlobalBatches, accumulation, corpus_problem, steps_problem,
                                            token_batches)
from tests.language.corpus import sentence_pairs, sgm, wikitext_lines, write_parallel


# -- Wikitext-2 -------------------------------------------------------------------------------
def test_wikitext_ids_follow_the_reference_tokenisation(wikitext_dir):
    corpus = wikitext.load_wikitext2(wikitext_dir)
    lines = {split: (wikitext_dir / f"wiki.{split}.tokens").read_text().splitlines()
             for split in ("train", "valid", "test")}
    vocab: dict[str, int] = {}
    for split in ("train", "valid", "test"):
        expected = [vocab.setdefault(w, len(vocab)) for line in lines[split] for w in line.split() + ["<eos>"]]
        assert getattr(corpus, split).tolist() == expected
    assert corpus.vocab == list(vocab)


def test_wikitext_cache_is_memory_mapped_and_rebuilt_when_a_file_changes(wikitext_dir):
    first = wikitext.load_wikitext2(wikitext_dir)
    assert isinstance(first.train, np.memmap)
    with open(wikitext_dir / "wiki.test.tokens", "a") as f:
        f.write(" brandnewword . \n")
    again = wikitext.load_wikitext2(wikitext_dir)
    assert again.vocab[-1] == "brandnewword" and len(again.test) == len(first.test) + 3


def test_wikitext_in_a_wikitext2_subfolder_is_found(tmp_path, wikitext_dir):
    wikitext_dir.rename(tmp_path / "wikitext-2")
    assert len(wikitext.load_wikitext2(tmp_path).vocab) > 10


def test_empty_wikitext_file_is_one_line_data_error(wikitext_dir):
    (wikitext_dir / "wiki.valid.tokens").write_text("")
    with pytest.raises(DataError, match=r"wiki\.valid\.tokens is empty; replace it") as info:
        wikitext.load_wikitext2(wikitext_dir)
    assert "\n" not in str(info.value)


def test_missing_wikitext_file_says_which_and_where_to_put_it(wikitext_dir):
    (wikitext_dir / "wiki.train.tokens").unlink()
    with pytest.raises(DataError, match=r"^--data-dir .*/wikitext has no wiki\.train\.tokens; it must hold "
                                        r"wiki\.train\.tokens, wiki\.valid\.tokens and wiki\.test\.tokens \(from"):
        wikitext.load_wikitext2(wikitext_dir)


def test_offline_wikitext_download_is_one_line_saying_where_to_put_the_files(monkeypatch):
    monkeypatch.setattr(wikitext, "URL", "http://127.0.0.1:9/wikitext-2-v1.zip")
    with pytest.raises(DataError) as info:
        wikitext.load_wikitext2()
    message = str(info.value)
    assert message.startswith("could not download Wikitext-2 from http://127.0.0.1:9/wikitext-2-v1.zip (")
    assert "put wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens (from wikitext-2-v1.zip" in message
    assert message.endswith("or pass --data-dir DIR holding them") and "\n" not in message
    root = wikitext.default_data_root() / "wikitext2"
    assert sorted(p.name for p in root.iterdir()) == [".lock"]  # nothing half-written left behind


@pytest.fixture
def http_files(tmp_path):
    """A local HTTP server over a folder; yields (folder, base url)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.handle_error = lambda *args: None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_wikitext_download_extracts_the_archive_once(http_files, monkeypatch):
    served, base = http_files
    with zipfile.ZipFile(served / "wikitext-2-v1.zip", "w") as zf:
        for split, n in (("train", 200), ("valid", 40), ("test", 40)):
            zf.writestr(f"wikitext-2/wiki.{split}.tokens", "\n".join(wikitext_lines(n, 0)) + "\n")
    monkeypatch.setattr(wikitext, "URL", f"{base}/wikitext-2-v1.zip")
    monkeypatch.setattr(wikitext, "MD5", hashlib.md5((served / "wikitext-2-v1.zip").read_bytes()).hexdigest())
    corpus = wikitext.load_wikitext2()
    root = wikitext.default_data_root() / "wikitext2"
    assert sorted(p.name for p in root.iterdir()) == [".lock", "wikitext-2"]  # the archive is gone
    monkeypatch.setattr(wikitext, "URL", "http://127.0.0.1:9/unused")
    assert wikitext.load_wikitext2().train.tolist() == corpus.train.tolist()


def test_the_clusters_data_job_prepares_wikitext2_onto_its_volume(http_files, monkeypatch, capsys):
    """`python -m mlbench.launch.k8s_data wikitext2`, as the data Job of a cluster runs it: the
    language data sets are prepared by their own code, not loaded as tensors."""
    from mlbench.launch import k8s_data

    served, base = http_files
    with zipfile.ZipFile(served / "wikitext-2-v1.zip", "w") as zf:
        for split, n in (("train", 200), ("valid", 40), ("test", 40)):
            zf.writestr(f"wikitext-2/wiki.{split}.tokens", "\n".join(wikitext_lines(n, 0)) + "\n")
    monkeypatch.setattr(wikitext, "URL", f"{base}/wikitext-2-v1.zip")
    monkeypatch.setattr(wikitext, "MD5", hashlib.md5((served / "wikitext-2-v1.zip").read_bytes()).hexdigest())
    assert k8s_data.main(["wikitext2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("Done in ") and ": prepared, " in out
    assert (wikitext.default_data_root() / "wikitext2" / "wikitext-2" / "wiki.train.tokens").is_file()


# -- WMT17 ------------------------------------------------------------------------------------
def test_bpe_cache_encodes_both_sides_with_one_shared_vocabulary(parallel_dir):
    corpus = bpe.encode_wmt17(wmt.wmt17_folder(parallel_dir), vocab_size=120)
    processor = corpus.processor()
    english, german = sentence_pairs(300, 0)
    en, de = corpus.splits["train"]["en"], corpus.splits["train"]["de"]
    assert len(en) == len(de) == 300 and isinstance(en.tokens, np.memmap)
    assert processor.decode(en.sentence(5).tolist()) == english[5]
    assert processor.decode(de.sentence(7).tolist()) == german[7]  # the same model decodes German
    assert corpus.references == sentence_pairs(24, 1)[1]
    assert (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()) == (0, 1, 2, 3)


@pytest.mark.parametrize("damage,expected", [
    (lambda d: (d / "train.de").unlink(), r"train\.de is missing \(the German \(target\) side of train\); "
                                          r"--data-dir must hold train\.en, train\.de, newstest2014\.en and"),
    (lambda d: (d / "newstest2014.en").unlink(), r"newstest2014\.en is missing \(the English \(source\) side"),
    (lambda d: (d / "train.en").write_text(""), r"train\.en is empty"),
    (lambda d: (d / "train.de").write_text("Ein Satz.\n"), r"train\.en has 300 lines but .*train\.de has 1; "
                                                           r"the two sides of a parallel corpus must be line-aligned"),
])
def test_bad_parallel_corpus_is_one_line_data_error(parallel_dir, damage, expected):
    damage(parallel_dir)
    with pytest.raises(DataError, match=expected) as info:
        bpe.encode_wmt17(wmt.wmt17_folder(parallel_dir), vocab_size=120)
    assert "\n" not in str(info.value)


def test_offline_wmt_download_is_one_line_saying_where_to_put_the_files(monkeypatch):
    monkeypatch.setattr(wmt, "TRAIN_ARCHIVES", (wmt.Archive("europarl-v7", ("http://127.0.0.1:9/ep.tgz",),
                                                           {"en": "a.en", "de": "a.de"}),))
    with pytest.raises(DataError) as info:
        wmt.wmt17_folder()
    message = str(info.value)
    assert message.startswith("could not download WMT17 en-de (europarl-v7 from http://127.0.0.1:9/ep.tgz: ")
    assert "put train.en, train.de, newstest2014.en and newstest2014.de (line-aligned" in message
    assert message.endswith("or pass --data-dir DIR holding them") and "\n" not in message
    assert sorted(p.name for p in (wmt.default_data_root() / "wmt17-en-de").iterdir()) == [".lock"]


def _tgz(path: Path, members: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_wmt_download_concatenates_the_corpora_and_reads_the_sgml_test_set(http_files, monkeypatch):
    served, base = http_files
    (en1, de1), (en2, de2), (test_en, test_de) = sentence_pairs(5, 0), sentence_pairs(3, 1), sentence_pairs(4, 2)
    _tgz(served / "one.tgz", {"training/one.en": "\n".join(en1) + "\n", "training/one.de": "\n".join(de1) + "\n"})
    _tgz(served / "two.tgz", {"two.en": "\n".join(en2), "two.de": "\n".join(de2)})  # no final newline
    _tgz(served / "test.tgz", {"test-full/src.en.sgm": sgm(test_en, "src"),
                               "test-full/ref.de.sgm": sgm(test_de, "ref")})
    monkeypatch.setattr(wmt, "TRAIN_ARCHIVES", (
        wmt.Archive("one", ("http://127.0.0.1:9/dead.tgz", f"{base}/one.tgz"),  # the first address is down
                    {"en": "training/one.en", "de": "training/one.de"}),
        wmt.Archive("two", (f"{base}/two.tgz",), {"en": "two.en", "de": "two.de"})))
    monkeypatch.setattr(wmt, "TEST_ARCHIVE", wmt.Archive(
        "newstest2014", (f"{base}/test.tgz",), {"en": "test-full/src.en.sgm", "de": "test-full/ref.de.sgm"},
        md5=hashlib.md5((served / "test.tgz").read_bytes()).hexdigest()))
    folder = wmt.wmt17_folder()
    assert (folder / "train.en").read_text().splitlines() == en1 + en2
    assert (folder / "train.de").read_text().splitlines() == de1 + de2
    assert (folder / "newstest2014.de").read_text().splitlines() == test_de
    assert sorted(p.name for p in folder.iterdir()) == [".lock", *sorted(wmt.FILES)]


def test_sgml_segments_are_read_as_sacrebleu_reads_them():
    text = ('<refset>\n<doc docid="x">\n<seg id="1">  Ein   Satz &amp; mehr </seg>\n<p>\n'
            '<seg id="2">Zwei</seg>\n</doc>\n')
    assert wmt.sgm_segments(text) == ["Ein Satz &amp; mehr", "Zwei"]


# -- 3a batches -------------------------------------------------------------------------------
def test_each_worker_takes_its_own_columns_of_the_one_batchified_matrix():
    stream = np.arange(1000)
    whole = batchify(stream, 8)                      # one process, batch 8
    assert whole.shape == (125, 8) and whole[:, 1].tolist() == list(range(125, 250))
    parts = [worker_columns(batchify(stream, 8), r, 2) for r in range(4)]  # 4 workers, batch 2
    assert torch.equal(torch.cat(parts, dim=1), whole)


def test_random_bptt_lengths_are_shared_by_seed_and_follow_the_reference_rule():
    a, b = bptt_lengths(20_000, 70, seed=3, epoch=2), bptt_lengths(20_000, 70, seed=3, epoch=2)
    assert a == b and a != bptt_lengths(20_000, 70, seed=3, epoch=1)
    assert sum(a) in (19_998, 19_999)              # up to the last row that has a target
    assert min(a[:-1]) >= 5
    lengths = np.array(a[:-1])
    assert 0.02 < (lengths < 50).mean() < 0.09     # the 5% of base 35 (plus the Normal's tail)
    assert abs(np.median(lengths) - 69.5) <= 2.0


def test_evaluation_covers_every_row_once():
    matrix = batchify(np.arange(10 * 31), 10)
    lengths = eval_lengths(31, 7)
    assert lengths == [7, 7, 7, 7, 2]
    targets = torch.cat([t for _, t in bptt_batches(matrix, lengths)])
    assert torch.equal(targets, matrix[1:].reshape(-1))


# -- 4b batches -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lengths():
    rng = np.random.default_rng(0)
    return rng.integers(1, 100, 20_000), rng.integers(1, 100, 20_000)


def test_token_buckets_hold_at_most_max_tokens_in_multiples_of_8(lengths):
    src, tgt = lengths
    batches = token_batches(src, tgt, max_tokens=2 ** 13, max_len=80, seed=1)
    size = np.maximum(src, tgt)
    assert max(len(b) * size[b].max() for b in batches) <= 2 ** 13
    assert sum(len(b) % 8 != 0 for b in batches) <= 1        # only the last batch may be ragged
    kept = np.concatenate(batches)
    assert len(kept) == len(set(kept.tolist())) == ((np.minimum(src, tgt) >= 2) & (size <= 80)).sum()


def test_global_batches_are_the_same_for_1_2_and_4_workers(lengths):
    src, tgt = lengths
    batches = token_batches(src, tgt, max_tokens=2 ** 13, max_len=80, seed=1)
    sequences = {}
    for k in (1, 2, 4):
        schedule = GlobalBatches(batches, k, accumulation(k, 2 ** 17, 2 ** 13))
        assert schedule.per_step == 16
        order = schedule.epoch_order(seed=0, epoch=3)
        shares = [[schedule.share(ids, r) for r in range(k)] for ids in order]
        assert all(len(s) == 16 // k for step in shares for s in step)
        sequences[k] = [np.concatenate(step).tolist() for step in shares]  # worker shares, in rank order
    assert sequences[1] == sequences[2] == sequences[4]
    assert GlobalBatches(batches, 3, accumulation(3, 2 ** 17, 2 ** 13)).per_step == 18


def test_each_epoch_shuffles_the_micro_batches_alike_on_every_rank(lengths):
    batches = token_batches(*lengths, max_tokens=2 ** 13, max_len=80, seed=1)
    schedule = GlobalBatches(batches, 2, 8)
    assert np.array_equal(schedule.epoch_order(0, 1), schedule.epoch_order(0, 1))
    assert not np.array_equal(schedule.epoch_order(0, 1), schedule.epoch_order(0, 2))


@pytest.mark.parametrize("pairs", [0, 3, 40, 300, 2_000, 20_000])
@pytest.mark.parametrize("world", [1, 3])
def test_a_corpus_is_judged_too_small_exactly_when_its_micro_batches_make_no_global_step(lengths, pairs, world):
    """The refusal before a 4b run is recorded bounds the micro-batch count from the tokens, and
    cuts only a small corpus: its verdict is that of the batches the runtime makes."""
    src, tgt = lengths[0][:pairs], lengths[1][:pairs]
    for global_tokens in (2 ** 12, 2 ** 17):
        batches = token_batches(src, tgt, max_tokens=1024, max_len=80, seed=5)
        steps = GlobalBatches(batches, world, accumulation(world, global_tokens, 1024)).steps_per_epoch()
        problem = corpus_problem(src, tgt, world, global_tokens=global_tokens, max_tokens=1024, max_len=80)
        assert (problem is None) == (steps >= 1), (pairs, world, global_tokens)
        assert problem == steps_problem(len(batches), world, global_tokens=global_tokens, max_tokens=1024,
                                        max_len=80)


def test_the_global_tokens_a_too_small_corpus_is_told_to_set_make_one_step():
    for batches, world in ((14, 1), (14, 2), (25, 3)):
        problem = steps_problem(batches, world, global_tokens=2 ** 17, max_tokens=256, max_len=80)
        fitting = int(problem.split("--set global_tokens=")[1].split()[0])
        assert steps_problem(batches, world, global_tokens=fitting, max_tokens=256, max_len=80) is None
        assert steps_problem(batches, world, global_tokens=fitting + 1, max_tokens=256, max_len=80) is not None
    assert "run at most 2 workers" in steps_problem(2, 4, global_tokens=2 ** 17, max_tokens=256, max_len=80)
    assert "no sentence pair to train on" in steps_problem(0, 1, global_tokens=512, max_tokens=256, max_len=80)


def test_pairs_longer_than_max_len_or_with_an_empty_side_are_left_out():
    batches = token_batches(np.array([5, 81, 1, 80]), np.array([5, 3, 4, 2]), max_tokens=1000, max_len=80)
    assert sorted(np.concatenate(batches).tolist()) == [0, 3]


def test_bpe_vocabulary_is_not_retrained_when_the_cache_is_current(parallel_dir):
    first = bpe.encode_wmt17(wmt.wmt17_folder(parallel_dir), vocab_size=120)
    stamp = first.model_path.stat().st_mtime_ns
    again = bpe.encode_wmt17(wmt.wmt17_folder(parallel_dir), vocab_size=120)
    assert again.model_path.stat().st_mtime_ns == stamp
    write_parallel(parallel_dir, train=310)
    rebuilt = bpe.encode_wmt17(wmt.wmt17_folder(parallel_dir), vocab_size=120)
    assert len(rebuilt.splits["train"]["en"]) == 310
