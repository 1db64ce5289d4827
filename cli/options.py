"""Option types shared by several commands (kept import-light: start-up reads this module)."""

from enum import Enum


class BackendOption(str, Enum):
    auto = "auto"
    cuda = "cuda"
    emu = "emu"
    numpy = "numpy"


class ArchOption(str, Enum):
    """The architectures the kernels are built for (capsule_core.kernels.ARCHES)."""

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
