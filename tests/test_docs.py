"""The README stays a front door and docs/ stays whole: links reach their pages and headings, every
environment variable the code reads is documented, and CI runs the README's own test command."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for line in _FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#{1,6} (.*)", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_the_readme_is_at_most_200_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def test_every_relative_link_reaches_a_file_and_its_heading():
    broken = []
    for page in PAGES:
        text = _FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_mlbench_variable_the_code_reads_is_documented():
    used = set()
    for source in (REPO / "mlbench").rglob("*.py"):
        used |= set(re.findall(r"\bMLBENCH_[A-Z0-9_]+", source.read_text(encoding="utf-8")))
    table = (REPO / "docs" / "environment-variables.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\|[^|]*`(MLBENCH_[A-Z0-9_]+)`", table, flags=re.M))
    documented |= set(re.findall(r"`(MLBENCH_[A-Z0-9_]+)`", table))
    assert used, "found no MLBENCH_ variable in the code"
    assert not used - documented, f"not in docs/environment-variables.md: {sorted(used - documented)}"


def test_ci_runs_the_readmes_install_and_test_commands():
    readme = README.read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -e '.[test]'\npython3 -m pytest -q\n" in readme
    assert "pip install -q -e '.[test]'" in ci and ci.rstrip().endswith("python3 -m pytest -q")
    assert "pip install torch==2.14.1 torchvision==0.29.1" in readme
