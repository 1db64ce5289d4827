"""Launch plans of fft_fno (cuda/spectral.cu).

Forward: capsule_fft_fno_fwd_twiddles builds the twiddle table (G pairs (cos, sin)(2π·r/G)) into a
workspace once; capsule_fft_fno_fwd_analysis takes x's spectrum split over the grid axis into
`parts` ranges of ⌈G/parts⌉ points (analysis_parts), the partial spectra into a workspace that
capsule_fft_fno_fwd_sum adds in part order; capsule_fft_fno_fwd_mix mixes the channels per mode,
capsule_fft_fno_fwd_synthesis writes y. With one part the analysis writes the spectrum itself and
no sum launch follows. Backward: the same table kernel, the analyses of x and of g in one
launch (one grid-stride loop over both) and their sums (capsule_fft_fno_bwd_sum, likewise), the
mix's adjoint, the synthesis into dx, the weight cotangents. The analyses and syntheses read the table from
global memory, for any G; grids past 2^31 take the analyses' _wide entry points (64-bit turns).
No atomics: every sum has a fixed order, whatever the grid.
"""

from __future__ import annotations

from typing import Any, Mapping

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, grid_1d
from capsule_core.kernels.nvcc import KernelBudget, register_budget

BLOCK = 256
"""The transform kernels' block (and __launch_bounds__ of every entry point)."""
SMALL_BLOCK = 64
"""The block of the small per-spectrum launches (sums, mixes, weight cotangents, table): a few
tens of thousands of items still spread over every multiprocessor."""
TRANSFORM_BLOCKS = 4
"""kTransformBlocks: blocks of BLOCK per multiprocessor the analysis and synthesis are built for
(64 registers)."""
LEAN_BLOCKS = 8
"""kLeanBlocks: the same for the partial sums (32 registers)."""
MULTIPROCESSORS = 132
"""An H200's: the analysis is split until its threads fill one wave of TRANSFORM_BLOCKS per SM."""
MIN_SPAN = 32
"""The fewest grid points a part of the analysis covers."""
MODES_PER_THREAD = 2
"""cuda/spectral.cu's kModesPerThread: each analysis thread accumulates this many modes ..."""
CHANNELS_PER_THREAD = 4
"""... of kChannelsPerThread channels (c, c + H, c + 2H, ...; H = ⌈C/4⌉): one twiddle load serves four."""
TURN32_LIMIT = 2**31
"""kTurn32Limit: longer grids take the analyses' _wide entry points (64-bit turns)."""
POINTS_PER_THREAD = 2
"""cuda/spectral.cu's kPointsPerThread: each synthesis thread writes this many grid points ..."""
OUTPUTS_PER_THREAD = 4
"""... of kOutputsPerThread channels (o, o + H, ...; H = ⌈O/4⌉): one twiddle load serves four."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def analysis_items(batch: int, grid: int, channels: int, modes: int) -> int:
    """Threads of one part of an analysis: (batch, mode group, channel group)."""
    return batch * _ceil(modes, MODES_PER_THREAD) * _ceil(channels, CHANNELS_PER_THREAD)


def synthesis_items(batch: int, grid: int, channels: int, modes: int) -> int:
    return batch * _ceil(grid, POINTS_PER_THREAD) * _ceil(channels, OUTPUTS_PER_THREAD)


def analysis_parts(items: int, grid: int) -> int:
    """Parts of the grid axis an analysis launch of `items` threads per part is split into: as
    many as keep items × parts threads within one wave of TRANSFORM_BLOCKS blocks of BLOCK per
    multiprocessor, each part at least MIN_SPAN points, and no part empty (parts = ⌈G/span⌉,
    span = ⌈G/parts⌉)."""
    wave = MULTIPROCESSORS * TRANSFORM_BLOCKS * BLOCK
    parts = max(1, min(wave // max(1, items), grid // MIN_SPAN))
    return _ceil(grid, _ceil(grid, parts))


def _dims(inputs: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    batch, grid, c_in = (int(v) for v in inputs["x"].shape)
    modes, _, c_out = (int(v) for v in inputs["w_re"].shape)
    return batch, grid, c_in, c_out, modes


def _f32(name: str, role: str, n: int) -> Buffer:
    return Buffer(name, role, "float32", int(n))


def _small(n: int):
    return grid_1d(n, SMALL_BLOCK)


def _wide(grid: int) -> str:
    return "_wide" if grid > TURN32_LIMIT else ""


def _twiddles(grid: int) -> Launch:
    return Launch("capsule_fft_fno_fwd_twiddles", *_small(grid), ("table", grid))


def forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    b, g, ci, co, m = dims = _dims(inputs)
    items = analysis_items(b, g, ci, m)
    parts = analysis_parts(items, g)
    split = parts > 1
    buffers = (
        _f32("x", "input", b * g * ci),
        _f32("w_re", "input", m * ci * co),
        _f32("w_im", "input", m * ci * co),
        _f32("out", "output", b * g * co),
        _f32("table", "workspace", 2 * g),
        _f32("spectrum", "workspace", 2 * b * m * ci),
        _f32("mixed", "workspace", 2 * b * m * co),
    )
    if split:
        buffers += (_f32("partial", "workspace", 2 * parts * b * m * ci),)
    launches = (
        _twiddles(g),
        Launch(
            f"capsule_fft_fno_fwd_analysis{_wide(g)}",
            *grid_1d(items * parts, BLOCK),
            ("x", "table", "partial" if split else "spectrum", *dims, parts),
        ),
    )
    if split:
        launches += (Launch("capsule_fft_fno_fwd_sum", *_small(b * m * ci), ("partial", "spectrum", *dims, parts)),)
    launches += (
        Launch("capsule_fft_fno_fwd_mix", *_small(b * m * co), ("spectrum", "w_re", "w_im", "mixed", *dims)),
        Launch(
            "capsule_fft_fno_fwd_synthesis",
            *grid_1d(synthesis_items(b, g, co, m), BLOCK),
            ("mixed", "table", "out", *dims),
        ),
    )
    return LaunchPlan("fft_fno", "forward", buffers, launches, output_shapes={"out": (b, g, co)})


def backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    b, g, ci, co, m = dims = _dims(inputs)
    w = m * ci * co
    items = analysis_items(b, g, ci, m) + analysis_items(b, g, co, m)
    parts = analysis_parts(items, g)
    split = parts > 1
    buffers = (
        _f32("x", "input", b * g * ci),
        _f32("w_re", "input", w),
        _f32("w_im", "input", w),
        _f32("g", "input", b * g * co),
        _f32("dx", "output", b * g * ci),
        _f32("dw_re", "output", w),
        _f32("dw_im", "output", w),
        _f32("table", "workspace", 2 * g),
        _f32("xspec", "workspace", 2 * b * m * ci),
        _f32("gspec", "workspace", 2 * b * m * co),
        _f32("gxspec", "workspace", 2 * b * m * ci),
    )
    if split:
        buffers += (
            _f32("xpart", "workspace", 2 * parts * b * m * ci),
            _f32("gpart", "workspace", 2 * parts * b * m * co),
        )
    launches = (
        _twiddles(g),
        Launch(
            f"capsule_fft_fno_bwd_spectra{_wide(g)}",
            *grid_1d(items * parts, BLOCK),
            ("x", "g", "table", *(("xpart", "gpart") if split else ("xspec", "gspec")), *dims, parts),
        ),
    )
    if split:
        launches += (
            Launch(
                "capsule_fft_fno_bwd_sum",
                *_small(b * m * (ci + co)),
                ("xpart", "gpart", "xspec", "gspec", *dims, parts),
            ),
        )
    launches += (
        Launch("capsule_fft_fno_bwd_mix", *_small(b * m * ci), ("gspec", "w_re", "w_im", "gxspec", *dims)),
        Launch(
            "capsule_fft_fno_bwd_x", *grid_1d(synthesis_items(b, g, ci, m), BLOCK), ("gxspec", "table", "dx", *dims)
        ),
        Launch("capsule_fft_fno_bwd_w", *grid_1d(w, BLOCK), ("xspec", "gspec", "dw_re", "dw_im", *dims)),
    )
    return LaunchPlan(
        "fft_fno",
        "backward",
        buffers,
        launches,
        output_shapes={"dx": (b, g, ci), "dw_re": (m, ci, co), "dw_im": (m, ci, co)},
    )


PLANS = {"fft_fno": (forward, backward)}


TRANSFORMS = (
    "capsule_fft_fno_fwd_analysis",
    "capsule_fft_fno_fwd_analysis_wide",
    "capsule_fft_fno_fwd_synthesis",
    "capsule_fft_fno_bwd_spectra",
    "capsule_fft_fno_bwd_spectra_wide",
    "capsule_fft_fno_bwd_x",
)
SUMS = ("capsule_fft_fno_fwd_sum", "capsule_fft_fno_bwd_sum")

BUDGET = KernelBudget(
    max_registers=register_budget(BLOCK),
    registers={
        **{s: register_budget(BLOCK, TRANSFORM_BLOCKS) for s in TRANSFORMS},
        **{s: register_budget(BLOCK, LEAN_BLOCKS) for s in SUMS},
    },
)
"""The transforms: TRANSFORM_BLOCKS blocks of BLOCK per multiprocessor (64 registers); the partial
sums: LEAN_BLOCKS (32); the other kernels: a block of BLOCK fits on a multiprocessor."""
