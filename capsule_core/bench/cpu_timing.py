"""Timed targets on the CPU: a wall-clock target, the flush of cold mode and what the host's caches
and memory are. Shared by bench (the numpy provider's device) and its CPU baselines."""

from __future__ import annotations

import os
import re
import time
from typing import Any, Callable

import numpy as np


def cpu_cache_bytes() -> int:
    """The last-level cache of this CPU (Linux sysfs), or 32 MiB when it cannot be read."""
    best = 0
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(root):
            if entry.startswith("index"):
                with open(os.path.join(root, entry, "size")) as f:
                    text = f.read().strip().upper()
                match = re.fullmatch(r"(\d+)([KMG]?)", text)
                if match:
                    best = max(
                        best, int(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2)]
                    )
    except OSError:
        pass
    return best or 32 << 20


def host_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


CPU_FLUSH_MAX = 1 << 30
"""Cap of the CPU flush buffer (some virtual machines report a host-sized last-level cache)."""


class CpuFlush:
    """Cold mode on the CPU: overwrite a scratch buffer of `nbytes` (twice the last-level cache)."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 8 << 20)
        self._scratch = None
        self._value = 0.0

    def __call__(self):
        if self._scratch is None:
            self._scratch = np.empty(self.nbytes // 4, dtype=np.float32)
        self._value += 1.0
        self._scratch.fill(self._value)


class WallClockTarget:
    """perf_counter around each call; the optional flush runs before the clock starts."""

    max_batch = 1000
    guarded = None

    def __init__(self, fn: Callable[[], Any], flush: Callable[[], None] | None = None, timer: str = "wall clock"):
        self.fn, self.flush, self.timer_name = fn, flush, timer

    def run(self, n: int, cold: bool) -> list[float]:
        out = []
        clock = time.perf_counter
        for _ in range(n):
            if cold and self.flush is not None:
                self.flush()
            t0 = clock()
            self.fn()
            out.append(clock() - t0)
        return out

    def close(self):
        pass
