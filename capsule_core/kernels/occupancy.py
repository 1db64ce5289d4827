"""Theoretical occupancy: how many blocks of a kernel one multiprocessor holds at once.

The rules are those of CUDA's occupancy calculator as the toolkit ships it
(cuda_occupancy.h, cudaOccMaxActiveBlocksPerMultiprocessor), for the default shared-memory
carveout (the driver gives a kernel the largest one it needs):

- warps: a block takes ceil(threads / 32) of the SM's warp slots;
- registers: each warp takes registers-per-thread x 32, rounded up to 256; they are allocated
  per sub-partition (4 per SM), so an SM holds 4 x floor((65536 / 4) / registers-per-warp) warps.
  A block whose registers, with its warps rounded up to the 4 sub-partitions, exceed 64K per
  block cannot launch at all;
- shared memory: static (ptxas) + dynamic + the 1 KiB the driver reserves per block on sm_80
  and later, rounded up to 128 bytes, against the SM's shared memory; beyond 48 KiB per block a
  kernel must opt in (the cuda backend does) and is then bounded by the arch's per-block maximum;
- blocks: at most 32 resident blocks per SM (sm_80, sm_90).

Block barriers (sm_90: two per resident block) never bind for kernels with one barrier, and are
left out. Stdlib only, no GPU needed.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class ArchLimits:
    """One architecture's per-SM and per-block resources (CUDA C++ Programming Guide,
    "Technical Specifications per Compute Capability", and cuda_occupancy.h)."""

    arch: str
    max_threads_per_sm: int
    max_blocks_per_sm: int
    shared_per_sm: int
    """Bytes of shared memory per SM at the largest carveout."""
    shared_per_block_optin: int
    """The largest shared memory a block may use once the kernel opts in."""
    registers_per_sm: int = 64 * KIB
    registers_per_block: int = 64 * KIB
    max_registers_per_thread: int = 255
    register_unit: int = 256
    """Registers are allocated per warp in units of 256."""
    sub_partitions: int = 4
    shared_per_block: int = 48 * KIB
    """Shared memory a block may use without opting in."""
    shared_reserved_per_block: int = 1 * KIB
    """Reserved by the driver for every resident block (sm_80 and later)."""
    shared_unit: int = 128
    warp_size: int = 32
    max_threads_per_block: int = 1024

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size


def _ampere_or_hopper(arch: str, shared_per_sm_kib: int, shared_per_block_optin_kib: int) -> ArchLimits:
    """sm_80 and sm_90 alike hold 2048 threads and 32 blocks per SM; their shared memory differs."""
    return ArchLimits(
        arch,
        max_threads_per_sm=2048,
        max_blocks_per_sm=32,
        shared_per_sm=shared_per_sm_kib * KIB,
        shared_per_block_optin=shared_per_block_optin_kib * KIB,
    )


ARCHES = {"sm_80": _ampere_or_hopper("sm_80", 164, 163), "sm_90": _ampere_or_hopper("sm_90", 228, 227)}
"""The architectures the kernels are built for (capsule_core.kernels.nvcc.ARCHES): A100 (sm_80) and
H100/H200 (sm_90)."""


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM of one kernel launch configuration, and what bounds them."""

    threads_per_block: int
    warps_per_block: int
    max_warps_per_sm: int
    limits: dict[str, int]
    """Blocks per SM each resource allows: "warps", "registers", "shared memory", "blocks"."""
    registers_per_block: int
    """Registers allocated to one block (warps x the rounded registers per warp)."""
    shared_per_block: int
    """Shared memory allocated to one block: static + dynamic + reserved, rounded up."""
    refusal: str | None = None
    """Why a block cannot launch at all (then no block is resident)."""

    @property
    def blocks_per_sm(self) -> int:
        return 0 if self.refusal else min(self.limits.values())

    @property
    def active_warps(self) -> int:
        return self.blocks_per_sm * self.warps_per_block

    @property
    def fraction(self) -> float:
        """Active warps over the SM's warp slots: the calculator's "occupancy"."""
        return self.active_warps / self.max_warps_per_sm

    @property
    def limiters(self) -> tuple[str, ...]:
        """The resources that bound the resident blocks (several when they tie)."""
        if self.refusal:
            return ()
        return tuple(name for name, n in self.limits.items() if n == self.blocks_per_sm)


def occupancy(
    limits: ArchLimits, threads: int, registers: int, static_shared: int = 0, dynamic_shared: int = 0
) -> Occupancy:
    """Resident blocks per SM for a block of `threads` threads using `registers` registers per
    thread and the given shared memory (bytes), by cudaOccMaxActiveBlocksPerMultiprocessor's rules."""
    warps = -(-threads // limits.warp_size)
    regs_per_warp = _round_up(registers * limits.warp_size, limits.register_unit)
    regs_per_block = regs_per_warp * warps
    regs_as_hardware_counts = regs_per_warp * _round_up(warps, limits.sub_partitions)
    shared_used = static_shared + dynamic_shared
    shared = _round_up(shared_used + limits.shared_reserved_per_block, limits.shared_unit)
    opted_in = shared_used > limits.shared_per_block
    shared_limit = (
        limits.shared_per_block_optin if opted_in else limits.shared_per_block
    ) + limits.shared_reserved_per_block

    refusal = None
    if threads < 1 or threads > limits.max_threads_per_block:
        refusal = f"{threads} threads per block (limit {limits.max_threads_per_block})"
    elif registers > limits.max_registers_per_thread:
        refusal = f"{registers} registers per thread (limit {limits.max_registers_per_thread})"
    elif max(regs_per_block, regs_as_hardware_counts) > limits.registers_per_block:
        refusal = (
            f"{regs_as_hardware_counts} registers per block as the hardware counts them "
            f"(warps rounded up to {limits.sub_partitions} sub-partitions; limit {limits.registers_per_block})"
        )
    elif shared > shared_limit:
        refusal = (
            f"{shared} bytes of shared memory per block with the {limits.shared_reserved_per_block}-byte "
            f"reservation (limit {shared_limit} on {limits.arch})"
        )

    by_registers = limits.max_blocks_per_sm
    if regs_per_warp:
        warps_per_sub_partition = limits.registers_per_sm // limits.sub_partitions // regs_per_warp
        by_registers = warps_per_sub_partition * limits.sub_partitions // max(warps, 1)
    return Occupancy(
        threads_per_block=threads,
        warps_per_block=warps,
        max_warps_per_sm=limits.max_warps_per_sm,
        limits={
            "warps": limits.max_warps_per_sm // max(warps, 1),
            "registers": by_registers,
            "shared memory": limits.shared_per_sm // shared,
            "blocks": limits.max_blocks_per_sm,
        },
        registers_per_block=regs_per_block,
        shared_per_block=shared,
        refusal=refusal,
    )
