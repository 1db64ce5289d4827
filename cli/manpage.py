"""man/capsules.1 generated from the Typer app, so the page cannot drift from the CLI.

Regenerate with: python -m cli.manpage > man/capsules.1
"""

from __future__ import annotations

import typer

from capsule_core import __version__
from cli.app import app


def _escape(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + line) if line.startswith((".", "'")) else line for line in text.splitlines())


def _metavar(param) -> str:
    choices = getattr(param.type, "choices", None)
    if choices:
        return "[" + "|".join(str(getattr(c, "value", c)) for c in choices) + "]"
    return {"str": "TEXT", "text": "TEXT", "integer": "INTEGER", "float": "FLOAT", "path": "FILE"}.get(
        param.type.name, param.type.name.upper()
    )


def _option_lines(command) -> list[str]:
    """Arguments and options of a command (Typer's click objects, read by duck typing)."""
    lines = []
    for param in command.params:
        if param.param_type_name == "argument":
            lines += [".TP", f"\\fI{param.name.upper()}\\fR"]
            lines.append(_escape(getattr(param, "help", None) or "argument"))
        elif not getattr(param, "hidden", False):
            names = ", ".join(param.opts + param.secondary_opts)
            meta = "" if param.is_flag else f" \\fI{_escape(_metavar(param))}\\fR"
            lines += [".TP", f"\\fB{_escape(names)}\\fR{meta}"]
            text = param.help or ""
            if param.default not in (None, False) and not param.is_flag and param.show_default is not False:
                default = getattr(param.default, "value", param.default)
                text += f" Default: {default}."
            lines.append(_escape(text.strip()))
    return lines


def render() -> str:
    root = typer.main.get_command(app)
    out = [
        f'.TH CAPSULES 1 "" "capsules {__version__}" "User Commands"',
        ".SH NAME",
        "capsules \\- make native CUDA kernels accountable",
        ".SH SYNOPSIS",
        "\\fBcapsules\\fR [\\fB\\-\\-version\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGS\\fR]",
        ".SH DESCRIPTION",
        _escape(root.help or ""),
        ".SH GLOBAL OPTIONS",
        *_option_lines(root),
        ".SH COMMANDS",
    ]
    for name, command in root.commands.items():
        out += [".SS " + name, _escape(command.help or ""), *_option_lines(command)]
    out += [
        ".SH EXIT STATUS",
        "0 all passed; 1 a contract violation or regression was found; 2 usage error (an unknown name, "
        "a bad option); 3 the environment lacks what was asked (nvcc, pycuda, a GPU).",
        ".SH SEE ALSO",
        "nvcc(1), README.md of the capsules project",
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
