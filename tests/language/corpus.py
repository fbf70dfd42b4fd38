"""Small data sets in the real formats, written by the tests: Wikitext-style text and a tiny
English-German parallel corpus (line-aligned text, and the SGML of the WMT test archives)."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ["the", "of", "and", "in", "to", "a", "was", "is", "for", "on", "as", "by", "with", "he", "at",
         "from", "his", "an", "were", "are", "which", "this", "also", "be", "had", "it", "first", "one",
         "their", "its", "new", "after", "who", "they", "have", "her", "she", "two", "been", "other", "when",
         "there", "all", "during", "into", "school", "time", "may", "years", "more", "most", "only", "over",
         "city", "some", "world", "would", "where", "later", "up", "such", "used", "many", "can", "state",
         "about", "national", "out", "known", "university", "united", "then", "made"]

#: English -> German, word by word: enough structure for a model to learn something.
LEXICON = {"the": "die", "cat": "Katze", "dog": "Hund", "house": "Haus", "tree": "Baum", "runs": "läuft",
           "sees": "sieht", "a": "ein", "big": "groß", "small": "klein", "red": "rot", "green": "grün",
           "blue": "blau", "eats": "isst", "sleeps": "schläft", "and": "und", "old": "alt", "man": "Mann"}


def wikitext_lines(n: int, seed: int) -> list[str]:
    """Lines as in wiki.*.tokens: headings, blank lines, space-separated sentences ending with ' . '."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        if i % 10 == 0:
            lines.append(f" = Heading {i} = ")
        elif i % 7 == 0:
            lines.append("")
        else:
            lines.append(" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 25))) + " . ")
    return lines


def write_wikitext(folder: Path, sizes: tuple[int, int, int] = (600, 120, 120)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for (split, n), seed in zip(zip(("train", "valid", "test"), sizes), range(3)):
        (folder / f"wiki.{split}.tokens").write_text("\n".join(wikitext_lines(n, seed)) + "\n", encoding="utf-8")
    return folder


def sentence_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    english, german = [], []
    for _ in range(n):
        words = [rng.choice(list(LEXICON)) for _ in range(rng.randint(3, 12))]
        english.append(" ".join(words).capitalize() + ".")
        german.append(" ".join(LEXICON[w] for w in words).capitalize() + ".")
    return english, german


def write_parallel(folder: Path, train: int = 300, test: int = 24) -> Path:
    """train.{en,de} and newstest2014.{en,de} as the WMT17 data folder holds them."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", train, 0), ("newstest2014", test, 1)):
        for lang, lines in zip(("en", "de"), sentence_pairs(n, seed)):
            (folder / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return folder


def sgm(lines: list[str], kind: str) -> str:
    """An SGML file as in the WMT test archives."""
    body = "".join(f'<seg id="{i + 1}"> {line} </seg>\n' for i, line in enumerate(lines))
    return (f'<{kind}set setid="newstest2014" srclang="any">\n<doc sysid="ref" docid="1" genre="news">\n'
            f"<p>\n{body}</p>\n</doc>\n</{kind}set>\n")
