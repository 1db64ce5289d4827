"""The emulator's device memory: an address space of its own, so that a wild access faults.

One reservation per process (RESERVATION bytes, mapped inaccessible, never backed) holds every
allocation of every EmuBackend, as a GPU's memory holds every context's. Each allocation is
committed page-aligned inside it, GAP inaccessible bytes after the one before, so that a store
one stride too far lands in no-man's-land and faults, never in the verifier's heap or in another
buffer. A freed allocation is decommitted (inaccessible again) and its addresses are not handed
out again until the cursor has gone round the whole reservation (a quarantine of thousands of
allocations), so a use after free faults too. Only the addresses are quarantined: a freed
allocation's pages are kept (up to SPARE_BYTES, moved out of the reservation by mremap) and moved
under a later allocation of the same size, which is zero-filled like a fresh one. Fresh pages cost
a fault and the kernel's zeroing each (16 MiB: 13 ms against 0.7 ms to fill pages already there),
and verify allocates the same sizes over and over. Plan buffers carry names (name_buffer), and a
fault address is described against the nearest buffer, live or freed, in compute-sanitizer's
words: "4,096 bytes after the end of buffer `y` (1,024 bytes)".

Guard bands and the NaN prefill (DeviceBackend.execute, EmuBackend.allocate) stay: they catch
the near misses, which land inside an allocation's own pages.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import threading
from collections import deque
from dataclasses import dataclass

RESERVATION = 4 << 40
"""4 TiB of address space (of x86-64's 128 TiB): room for 4,096 allocations at GAP spacing."""
GAP = 1 << 30
"""Inaccessible bytes before every allocation: a store at an index times a large stride (up to
256 Mi float32 elements past a buffer) faults instead of reaching the next one."""
PAGE = mmap.PAGESIZE
SPARE_BYTES = 512 << 20
"""Freed pages kept for reuse, at most (the oldest go back to the system first)."""
SPARES_KEPT = 256
"""Freed allocations kept, at most: each is a mapping of its own (vm.max_map_count bounds them)."""
FREED_REMEMBERED = 8192
"""Freed buffers kept for naming a use after free (the quarantine holds at most 4,096)."""

_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FIXED, _MAP_NORESERVE = 0x10, 0x4000
_MREMAP_MAYMOVE, _MREMAP_FIXED, _MREMAP_DONTUNMAP = 1, 2, 4


class DeviceMemoryError(MemoryError):
    """The emulated device cannot hold an allocation (larger than the reservation, or the
    reservation is full of live allocations)."""


@dataclass
class Allocation:
    address: int
    nbytes: int
    committed: int
    """Bytes mapped readable and writable (nbytes rounded up to whole pages)."""


@dataclass(frozen=True)
class NamedBuffer:
    """A plan buffer inside an allocation: what a fault address is described against."""

    address: int
    nbytes: int
    name: str
    freed: bool = False


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mremap.restype = ctypes.c_void_p
    libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


class DeviceAddressSpace:
    """Allocations in a reservation of their own, separated by gaps, freed into a quarantine."""

    def __init__(self, size: int = RESERVATION, gap: int = GAP):
        self._libc = _libc()
        self.size, self.gap = size, gap
        base = self._libc.mmap(None, size, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise DeviceMemoryError(
                f"cannot reserve {size >> 30} GiB of address space for the emulated device (errno {ctypes.get_errno()})"
            )
        self.base = int(base)
        self._lock = threading.Lock()
        """One allocation or free at a time: EmuBackends on several host threads share this space,
        and the ctypes calls inside let another thread run (two got the same address)."""
        self._cursor = self.base
        self._live: dict[int, Allocation] = {}
        self._buffers: dict[int, list[NamedBuffer]] = {}
        self._freed: deque[NamedBuffer] = deque(maxlen=FREED_REMEMBERED)
        self._spares: deque[tuple[int, int]] = deque()
        """(committed bytes, address outside the reservation) of freed pages kept, oldest first."""

    def _map(self, address: int, nbytes: int, prot: int, extra: int = 0):
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | extra
        if self._libc.mmap(address, nbytes, prot, flags, -1, 0) != address:
            raise DeviceMemoryError(
                f"mmap of {nbytes} bytes of emulated device memory failed (errno {ctypes.get_errno()})"
            )

    def allocate(self, nbytes: int) -> int:
        """A fresh, zero-filled, page-aligned allocation of nbytes, GAP bytes past the last one."""
        committed = max(PAGE, -(-int(nbytes) // PAGE) * PAGE)
        if committed + 2 * self.gap > self.size:
            raise DeviceMemoryError(
                f"an allocation of {nbytes:,} bytes does not fit the emulated device "
                f"({self.size >> 30} GiB of address space)"
            )
        with self._lock:
            address = self._place(committed)
            if not self._reuse(address, committed):
                self._map(address, committed, _PROT_RW)
            self._live[address] = Allocation(address, int(nbytes), committed)
            self._cursor = address + committed
            return address

    def _place(self, committed: int) -> int:
        """The next address GAP past the cursor whose span (and the GAPs around it) touches no live
        allocation, going round to the start of the reservation when the end is reached."""
        start, wrapped = self._cursor, False
        live = sorted(self._live.values(), key=lambda a: a.address)
        while True:
            address = -(-(start + self.gap) // PAGE) * PAGE
            if address + committed + self.gap > self.base + self.size:
                if wrapped:
                    raise DeviceMemoryError(f"the emulated device is full: {len(self._live)} live allocations")
                start, wrapped = self.base, True
                continue
            clash = next(
                (
                    a
                    for a in live
                    if a.address < address + committed + self.gap and address < a.address + a.committed + self.gap
                ),
                None,
            )
            if clash is None:
                return address
            start = clash.address + clash.committed

    @property
    def kept_bytes(self) -> int:
        """Freed pages held for reuse, in bytes."""
        return sum(size for size, _ in self._spares)

    def _reuse(self, address: int, committed: int) -> bool:
        """Move kept pages of exactly `committed` bytes to `address` (mapped inaccessible, which
        the move replaces) and zero them; False when none are kept or the move failed."""
        for i, (size, spare) in enumerate(self._spares):
            if size == committed:
                del self._spares[i]
                moved = self._libc.mremap(spare, size, size, _MREMAP_MAYMOVE | _MREMAP_FIXED, address)
                if moved != address:
                    self._libc.munmap(spare, size)
                    return False
                ctypes.memset(address, 0, size)
                return True
        return False

    def _keep(self, address: int, committed: int) -> bool:
        """Move the pages of a freed allocation out of the reservation, leaving its addresses mapped
        inaccessible (MREMAP_DONTUNMAP empties the range without unmapping it, so no other mapping
        can land there); False when they are not kept (too large, or the kernel cannot).

        The emptied range is then mapped afresh rather than mprotect-ed: it keeps the anon_vma of
        the pages that left, so the kernel would never merge it with the inaccessible reservation
        around it, and every free would cost a mapping of its own until vm.max_map_count (65,530)
        ran out, a few thousand tests into a pytest run."""
        if committed > SPARE_BYTES:
            return False
        while self._spares and (len(self._spares) >= SPARES_KEPT or self.kept_bytes + committed > SPARE_BYTES):
            size, spare = self._spares.popleft()
            self._libc.munmap(spare, size)
        moved = self._libc.mremap(address, committed, committed, _MREMAP_MAYMOVE | _MREMAP_DONTUNMAP, None)
        if moved in (None, ctypes.c_void_p(-1).value):
            return False
        try:
            self._map(address, committed, _PROT_NONE, _MAP_NORESERVE)
        except DeviceMemoryError:
            self._libc.munmap(moved, committed)
            raise
        self._spares.append((committed, int(moved)))
        return True

    def free(self, address: int):
        """Decommit: the pages become inaccessible (a later access faults); they are kept for a
        later allocation of their size, or go back to the system."""
        with self._lock:
            allocation = self._live.pop(address, None)
            if allocation is None:
                return
            if not self._keep(address, allocation.committed):
                self._map(address, allocation.committed, _PROT_NONE, _MAP_NORESERVE)
            for b in self._buffers.pop(address, ()):
                self._freed.append(NamedBuffer(b.address, b.nbytes, b.name, freed=True))

    def name_buffer(self, address: int, nbytes: int, name: str):
        """Record that the plan buffer `name` occupies [address, address + nbytes) of an allocation."""
        with self._lock:
            owner = self._owner(address)
            if owner is not None:
                self._buffers.setdefault(owner.address, []).append(NamedBuffer(int(address), int(nbytes), name))

    def _owner(self, address: int) -> Allocation | None:
        starts = sorted(self._live)
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0:
            a = self._live[starts[i]]
            if address < a.address + a.committed:
                return a
        return None

    def contains(self, address: int) -> bool:
        return self.base <= address < self.base + self.size

    def describe(self, address: int) -> str:
        """Where `address` lies against the nearest named buffer (live first, then the freed ones),
        e.g. "4,096 bytes after the end of buffer `y` (1,024 bytes)"; "" when no buffer is near."""
        if not self.contains(address):
            return "outside the emulated device's memory (not a device address: a host pointer, or null plus an offset)"
        with self._lock:
            live = [b for bs in self._buffers.values() for b in bs]
            freed_buffers = list(self._freed)
        best = _nearest(address, live, self.gap)
        if best is not None:
            return best
        freed = _nearest(address, freed_buffers, self.gap)
        if freed is not None:
            return freed
        return "in the emulated device's memory, far from every buffer of the run"


def _nearest(address: int, buffers: list[NamedBuffer], reach: int) -> str | None:
    inside = [b for b in buffers if b.address <= address < b.address + max(b.nbytes, 1)]
    if inside:
        b = inside[-1]
        where = f"{address - b.address:,} bytes inside buffer `{b.name}` ({b.nbytes:,} bytes)"
        return where + (", which was freed (a use after free)" if b.freed else "")

    def distance(b: NamedBuffer) -> int:
        return address - (b.address + b.nbytes) if address >= b.address + b.nbytes else b.address - address

    near = [b for b in buffers if distance(b) <= reach]
    if not near:
        return None
    b = min(near, key=distance)
    if address >= b.address + b.nbytes:
        where = f"{address - (b.address + b.nbytes):,} bytes after the end of buffer `{b.name}` ({b.nbytes:,} bytes)"
    else:
        where = f"{b.address - address:,} bytes before the start of buffer `{b.name}` ({b.nbytes:,} bytes)"
    return where + (", which was freed" if b.freed else "")


_SPACE: DeviceAddressSpace | None = None


def address_space() -> DeviceAddressSpace:
    """The process's one emulated device memory, reserved on first use."""
    global _SPACE
    if _SPACE is None:
        _SPACE = DeviceAddressSpace()
    return _SPACE
