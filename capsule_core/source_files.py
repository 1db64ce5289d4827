"""What a CUDA source reads: the headers it includes, transitively. The build cache keys on them,
and a capsule library's loader looks for kernel definitions in them."""

from __future__ import annotations

import re
from pathlib import Path

_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.MULTILINE)


def include_closure(source: Path, include_dirs=()) -> list[Path]:
    """The source and every header it includes, transitively, that lies beside the including file
    or in one of `include_dirs` (system headers are not followed)."""
    seen: dict[Path, None] = {}
    pending = [Path(source)]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen[path] = None
        for name in _INCLUDE.findall(path.read_text(errors="replace")):
            for folder in (path.parent, *map(Path, include_dirs)):
                candidate = (folder / name).resolve()
                if candidate.is_file():
                    pending.append(candidate)
                    break
    return list(seen)
