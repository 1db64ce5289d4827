"""Option types shared by several commands (kept import-light: start-up reads this module)."""

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer


class BackendOption(str, Enum):
    auto = "auto"
    cuda = "cuda"
    emu = "emu"
    numpy = "numpy"


BackendChoice = Annotated[
    BackendOption,
    typer.Option(
        help="auto: cuda when a GPU answers, else emu (the kernels on the CPU emulator) when a C++ compiler is here, else numpy."
    ),
]


def resolve_backend(name: str, device: int = 0, **emulator):
    """capsule_core.backends.select.resolve for --backend NAME: (the backend, the line saying why);
    exit 3 when this machine cannot run it, 2 for a bad CAPSULES_LAUNCH_TIMEOUT or CAPSULES_EMU_THREADS.
    `emulator`: launch_timeout and emu_threads, as parallel_options.emulator_options returns them."""
    from capsule_core.backends.select import resolve
    from capsule_core.errors import CapsuleError, EnvironmentMissing
    from cli.common import EXIT_ENVIRONMENT, EXIT_USAGE, fail

    try:
        return resolve(name, device, **emulator)
    except EnvironmentMissing as exc:
        raise fail(str(exc), EXIT_ENVIRONMENT)
    except CapsuleError as exc:
        raise fail(str(exc), EXIT_USAGE)


NamesArgument = Annotated[
    Optional[list[str]], typer.Argument(help="Capsule or op names; a library's name for all its capsules.")
]
AllOption = Annotated[bool, typer.Option("--all", help="Every capsule of every loaded library.")]


class ArchOption(str, Enum):
    """The architectures the kernels are built for (capsule_core.kernels.nvcc.ARCHES)."""

    sm_80 = "sm_80"
    sm_90 = "sm_90"


def unwritable_outputs(files: dict, folders: dict | None = None) -> str | None:
    """The first output option whose path cannot be written, as "OPTION: cannot write PATH: REASON",
    or None. Commands call it before any work, so that no run is spent on a report then lost.
    `files` and `folders` map option names to paths (None: not given)."""
    from capsule_core.output_files import unwritable_file, unwritable_folder

    for option, path in files.items():
        reason = None if path is None else unwritable_file(path)
        if reason:
            return f"{option}: cannot write {path}: {reason}"
    for option, path in (folders or {}).items():
        reason = None if path is None else unwritable_folder(path)
        if reason:
            return f"{option}: cannot write into {path}: {reason}"
    return None


OPTIONAL_VALUES = {"--sanitize": ("all", ("memcheck", "racecheck", "synccheck", "initcheck", "all"))}
"""Options whose value may be left out: option -> (the value it then takes, the words a value is made of)."""


def optional_option_values(argv: list[str]) -> list[str]:
    """argv with `--sanitize` given no value (last, or followed by an option or by a word that is
    neither a tool nor a comma list) written `--sanitize=all`: click options always take a value."""
    out = []
    for i, arg in enumerate(argv):
        if arg in OPTIONAL_VALUES:
            default, words = OPTIONAL_VALUES[arg]
            following = argv[i + 1] if i + 1 < len(argv) else None
            if following is None or following.startswith("-") or ("," not in following and following not in words):
                out.append(f"{arg}={default}")
                continue
        out.append(arg)
    return out


LibraryOption = Annotated[
    Optional[list[Path]],
    typer.Option(
        "--library",
        help="Load a capsule library: its declaration (a .py file or a package folder). Repeatable; the "
        "libraries of CAPSULES_LIBRARIES and of installed packages (entry points capsules.libraries) load too.",
    ),
]


def load_libraries(paths, keep_going: bool = False) -> int:
    """Load the --library declarations; say on stderr which library failed and why. A --library
    that fails is a usage error (exit 2) unless `keep_going` (list, doctor: report and go on; the
    caller exits with the code returned). Discovered libraries that fail are warnings."""
    from capsule_core.catalog import registry
    from cli.common import EXIT_OK, EXIT_USAGE, fail

    failed = registry.use_libraries([str(p) for p in paths or ()])
    for failure in registry.library_failures():
        if failure not in failed:
            typer.echo(f"capsules: warning: {failure.source} did not load: {failure.message}", err=True)
    if not failed:
        return EXIT_OK
    if not keep_going:
        raise fail("; ".join(f"{f.source}: {f.message}" for f in failed), EXIT_USAGE)
    for failure in failed:
        typer.echo(f"capsules: error: {failure.source}: {failure.message}", err=True)
    return EXIT_USAGE


def kernel_library_capsules(names, every: bool, command: str) -> list:
    """Every capsule of the kernel libraries when `every`, else the named ones; exit 2 for an
    unknown name or a named capsule that launches no CUDA kernel (`command` takes none of those)."""
    from capsule_core.catalog import registry
    from capsule_core.errors import UnknownNameError
    from cli.common import EXIT_USAGE, fail

    try:
        capsules = registry.kernel_capsules() if every else registry.lookup_many(names)
    except UnknownNameError as exc:
        raise fail(str(exc), EXIT_USAGE)
    foreign = [c.name for c in capsules if not registry.launches_kernels(c)]
    if foreign:
        raise fail(
            f"NAME: {', '.join(foreign)} launch no CUDA kernel; {command} takes the capsules of a kernel library",
            EXIT_USAGE,
        )
    return capsules
