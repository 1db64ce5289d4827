"""Start-up stays light, the man page matches the CLI, the README's commands are the CI's."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from capsule_core.catalog import registry
from capsule_core.render import report

ROOT = Path(__file__).resolve().parent.parent
HEAVY = (
    "pycuda",
    "hypothesis",
    "scipy",
    "numpy",
    "ray",
    "importlib.metadata",
    "capsule_core.ops",
    "capsule_core.backends",
    "capsule_core.kernels",
    "capsule_core.verify",
    "capsule_core.fuzz",
    "capsule_core.bench",
    "capsule_core.check",
    "capsule_core.sanitize",
    "capsule_core.explain",
    "capsule_core.drivers",
    "capsule_core.catalog.library",
    "capsule_core.catalog.planner",
)
"""What `capsules --help` and `capsules list` never import: the engines, the kernel layer, numpy,
the library loader (only a library that loads needs it), the planner (its dataclasses cost
`capsules list` a tenth of its margin to 1.5x `import typer`) and importlib.metadata (entry points
are read from entry_points.txt)."""


def _imported_modules(*args) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [("--help",), ("list",), ("list", "--format", "json")])
def test_help_and_list_import_nothing_heavy(args):
    modules = _imported_modules(*args)
    assert "capsule_core.catalog.registry" in modules or args == ("--help",)
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY or any(m.startswith(h) for h in HEAVY))
    assert heavy == []


def test_help_first_line_names_every_command():
    """The app's one-line description names every command group, so `capsules --help` opens with
    what the tool does, all of it."""
    import typer

    from cli.app import app

    first_line = app.info.help.split("\n")[0]
    commands = typer.main.get_command(app).commands
    assert [name for name in commands if not re.search(rf"\b{name}\b", first_line)] == []


def test_simple_table_is_tabulates_simple_format():
    from tabulate import tabulate

    rows = report.list_rows(registry.catalog())
    assert report.simple_table(rows) == tabulate(rows, headers="keys", tablefmt="simple", disable_numparse=True)


def test_man_page_matches_the_cli():
    from cli.manpage import render

    committed = (ROOT / "man" / "capsules.1").read_text()
    assert committed == render(), "man/capsules.1 is stale: python -m cli.manpage > man/capsules.1"


def test_man_page_documents_every_command_and_option():
    import typer

    from cli.app import app

    page = (ROOT / "man" / "capsules.1").read_text()
    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        assert f".SS {name}" in page
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-"):
                    assert opt.replace("-", "\\-") in page, (name, opt)


def test_ci_runs_the_readmes_commands():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    setup = readme.split("<!-- setup -->")[1].split("```")[1].strip("\nbash").strip()
    tests = readme.split("<!-- tests -->")[1].split("```")[1].strip("\nbash").strip()
    assert setup in ci and tests in ci
