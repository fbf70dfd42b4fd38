"""docs/cli.md is the CLI reference generated from the click commands (mlbench/cli/reference.py):
it must be what the generator gives now, and each of its sections what `--help` prints, so the
reference cannot drift from the commands."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from mlbench.cli import cli, commands  # noqa: F401  (registers the commands)
from mlbench.cli import reference

REPO = Path(__file__).resolve().parents[1]


def test_docs_cli_md_is_what_the_generator_gives_now():
    current = (REPO / reference.DOCS_PATH).read_text(encoding="utf-8")
    assert current == reference.reference(), (
        "docs/cli.md is out of date with the click commands: run `python -m mlbench.cli.reference --write`")


def test_every_section_is_what_help_prints():
    text = (REPO / reference.DOCS_PATH).read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## (mlbench[^\n]*)\n\n```\n(.*?)\n```$", text, flags=re.S | re.M))
    assert {"mlbench run", "mlbench status", "mlbench wait", "mlbench image build"} <= set(sections)
    runner = CliRunner()
    for path, block in sections.items():
        args = path.split()[1:] + ["--help"]
        result = runner.invoke(cli, args, prog_name="mlbench", terminal_width=reference.WIDTH)
        assert result.exit_code == 0, (path, result.output)
        assert result.output.rstrip() == block, path


def test_the_reference_lists_every_visible_command_and_no_hidden_option():
    text = (REPO / reference.DOCS_PATH).read_text(encoding="utf-8")
    for name, command in cli.commands.items():
        assert (f"## mlbench {name}\n" in text) != command.hidden, name
    charts = text[text.index("## mlbench charts\n"):text.index("## mlbench check-optimizer\n")]
    assert "--out-dir" in charts and "Deprecated spelling" not in charts  # its hidden `-o DIR` stays hidden
