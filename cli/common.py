"""What every command shares: the exit codes, the one-line error, the progress bar and the
writing of report files. Kept light at import time (capsules --help reads this module)."""

import os

import typer

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE, EXIT_ENVIRONMENT = 0, 1, 2, 3


def fail(message: str, code: int) -> typer.Exit:
    """Write `message` to stderr and return the Exit to raise (so callers read `raise fail(...)`)."""
    typer.echo(f"capsules: error: {message}", err=True)
    return typer.Exit(code)


def progress_bar():
    """A progress bar on a terminal, nothing in CI (stderr not a tty, or CAPSULES_PROGRESS=0)."""
    import contextlib
    import sys

    if os.environ.get("CAPSULES_PROGRESS", "1") == "0" or not sys.stderr.isatty():
        return contextlib.nullcontext(None)
    from rich.console import Console
    from rich.progress import Progress

    return Progress(console=Console(stderr=True), transient=True)


def write_reports(json_file, junit_file, record, junit) -> None:
    """The --json (record() as JSON) and --junit (junit()) reports, both or neither, written
    atomically; exit 3 if that fails."""
    import json

    from capsule_core.output_files import write_texts_atomic

    texts = {}
    if json_file is not None:
        texts[json_file] = json.dumps(record(), indent=2) + "\n"
    if junit_file is not None:
        texts[junit_file] = junit() + "\n"
    try:
        write_texts_atomic(texts)
    except OSError as exc:
        raise fail(f"cannot write the reports ({exc.filename}: {exc.strerror})", EXIT_ENVIRONMENT)
