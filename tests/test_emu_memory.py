"""The emulated device memory: freed addresses stay quarantined while their pages are reused."""

import ctypes
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from capsule_core.backends import emu_memory
from capsule_core.backends.emu_memory import PAGE, DeviceAddressSpace


def _protection(address: int) -> str:
    """The permissions /proc/self/maps gives the mapping holding `address` ('' when unmapped)."""
    for line in open("/proc/self/maps"):
        span, perms = line.split()[:2]
        start, end = (int(x, 16) for x in span.split("-"))
        if start <= address < end:
            return perms
    return ""


def _bytes(address: int, n: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_uint8 * n).from_address(address), np.uint8)


def _space() -> DeviceAddressSpace:
    return DeviceAddressSpace(size=1 << 36, gap=1 << 24)


def test_freed_pages_come_back_zeroed_under_a_new_address_and_the_old_one_stays_inaccessible():
    space = _space()
    nbytes = 3 * PAGE + 5
    first = space.allocate(nbytes)
    _bytes(first, 4 * PAGE)[:] = 0xAB
    space.free(first)
    assert space.kept_bytes == 4 * PAGE
    assert _protection(first) == "---p"
    second = space.allocate(nbytes)
    assert second != first and space.kept_bytes == 0
    assert not _bytes(second, 4 * PAGE).any()
    assert _protection(second) == "rw-p" and _protection(first) == "---p"


def test_other_sizes_get_fresh_pages_and_the_kept_ones_wait():
    space = _space()
    space.free(space.allocate(PAGE))
    other = space.allocate(2 * PAGE)
    assert space.kept_bytes == PAGE
    assert not _bytes(other, 2 * PAGE).any()


def test_kept_pages_are_bounded_oldest_returned_first(monkeypatch):
    monkeypatch.setattr(emu_memory, "SPARE_BYTES", 3 * PAGE)
    space = _space()
    space.free(space.allocate(4 * PAGE))
    assert space.kept_bytes == 0
    for _ in range(2):
        space.free(space.allocate(PAGE))
    a, b = space.allocate(PAGE), space.allocate(PAGE)
    assert space.kept_bytes == 0
    space.free(a)
    space.free(b)
    space.free(space.allocate(2 * PAGE))
    assert space.kept_bytes == 3 * PAGE


def test_kept_allocations_are_bounded_in_number(monkeypatch):
    monkeypatch.setattr(emu_memory, "SPARES_KEPT", 2)
    space = _space()
    live = [space.allocate(PAGE) for _ in range(3)]
    for address in live:
        space.free(address)
    assert space.kept_bytes == 2 * PAGE


def _mappings_within(space: DeviceAddressSpace) -> int:
    count = 0
    for line in open("/proc/self/maps"):
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        if start < space.base + space.size and space.base < end:
            count += 1
    return count


def test_freed_allocations_leave_no_mapping_of_their_own():
    """Every free must merge back into the reservation: vm.max_map_count (65,530) bounds a process's
    mappings, and a pytest run frees hundreds of thousands of allocations."""
    space = _space()
    for _ in range(3):
        live = [space.allocate((1 + i % 5) * PAGE) for i in range(40)]
        for address in live:
            space.free(address)
    assert space.kept_bytes > 0
    assert _mappings_within(space) == 1


def test_host_threads_allocating_at_once_never_share_an_allocation():
    """EmuBackends on several host threads share the one address space (the pytest plugin's, a
    library user's thread pool); each allocation stays its thread's own until freed."""
    space = _space()

    def churn(tag: int) -> int:
        clobbered = 0
        for i in range(300):
            address = space.allocate((1 + i % 3) * PAGE)
            view = _bytes(address, PAGE)
            view[:] = tag
            clobbered += int((view != tag).any())
            space.free(address)
        return clobbered

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(churn, range(1, 5), timeout=300)) == [0, 0, 0, 0]
