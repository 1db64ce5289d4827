"""Output files of the commands (reports, replays, plots): a path that cannot be written is refused
before any work, so no run is wasted on a report that is then lost, and every file is written
atomically (a temporary file in the same folder, then os.replace), so a reader never sees half a
report and an interrupted write leaves the previous file intact."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


def unwritable_file(path: Path) -> str | None:
    """Why `path` cannot be written as an output file, or None when it can."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        return "it is a directory"
    if not folder.exists():
        return f"the folder {folder} does not exist"
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if path.exists() and not os.access(path, os.W_OK):
        return "the file is read-only"
    return _cannot_create_in(folder)


def unwritable_folder(folder: Path) -> str | None:
    """Why files cannot be written into `folder` (made, with its parents, on the first write), or None."""
    folder = Path(folder)
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is not a folder"
    return _cannot_create_in(existing)


def _cannot_create_in(folder: Path) -> str | None:
    """Create and remove a file in `folder`: the only sure test (permissions, read-only mounts, quotas)."""
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".capsules-probe-")
    except OSError as exc:
        return f"cannot create a file in {folder}: {exc.strerror}"
    os.close(handle)
    os.unlink(probe)
    return None


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix, so writers that go by it still work), moved over
    `path` when the block succeeds and removed when it raises."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    os.close(handle)
    temporary = Path(temporary)
    try:
        yield temporary
        os.chmod(temporary, _file_mode(path))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    write_texts_atomic({path: text})


def write_texts_atomic(texts: dict[Path, str]) -> None:
    """Every file or none: all texts go to temporary files first, and are renamed into place only
    when every one is written."""
    with contextlib.ExitStack() as stack:
        for path, text in texts.items():
            stack.enter_context(atomic_path(path)).write_text(text, encoding="utf-8")


def _file_mode(path: Path) -> int:
    """The mode of the file being replaced, or what the umask gives a new file (mkstemp's is 0600)."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
