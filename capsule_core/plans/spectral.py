"""Launch plans of fft_fno (cuda/spectral.cu).

Forward: capsule_fft_fno_fwd launched three times (stage 0 the analysis of x into `spectrum`,
stage 1 the per-mode channel mix into `mixed`, stage 2 the synthesis into y). Backward: the
analyses of x and of g (one launch, blockIdx.y picks which), the mix's adjoint, the synthesis
into dx, the weight cotangents. The analysis and synthesis launches get 8·G bytes of dynamic
shared memory for their twiddle table when that fits the default 48 KiB (G ≤ 6144); without
it the kernels compute twiddles on the fly, slower but the same contract.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..kernels import KernelBudget, register_budget
from ..launch import Buffer, Launch, LaunchPlan, grid_1d

BLOCK = 256
MODES_PER_THREAD = 4
"""cuda/spectral.cu's kModesPerThread: each analysis thread accumulates this many modes."""
POINTS_PER_THREAD = 4
"""cuda/spectral.cu's kPointsPerThread: each synthesis thread writes this many grid points."""
TABLE_LIMIT = 48 * 1024
"""Dynamic shared memory a launch gets without opting in."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def table_bytes(grid: int) -> int:
    """The twiddle table's dynamic shared memory, or 0 (twiddles on the fly) when it would not fit."""
    return 8 * grid if 8 * grid <= TABLE_LIMIT else 0


def analysis_items(batch: int, grid: int, channels: int, modes: int) -> int:
    return batch * _ceil(modes, MODES_PER_THREAD) * channels


def synthesis_items(batch: int, grid: int, channels: int, modes: int) -> int:
    return batch * _ceil(grid, POINTS_PER_THREAD) * channels


def _dims(inputs: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    batch, grid, c_in = (int(v) for v in inputs["x"].shape)
    modes, _, c_out = (int(v) for v in inputs["w_re"].shape)
    return batch, grid, c_in, c_out, modes


def _f32(name: str, role: str, n: int) -> Buffer:
    return Buffer(name, role, "float32", int(n))


def forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    b, g, ci, co, m = dims = _dims(inputs)
    buffers = (_f32("x", "input", b * g * ci), _f32("w_re", "input", m * ci * co), _f32("w_im", "input", m * ci * co),
               _f32("out", "output", b * g * co), _f32("spectrum", "workspace", 2 * b * m * ci),
               _f32("mixed", "workspace", 2 * b * m * co))
    args = ("x", "w_re", "w_im", "out", "spectrum", "mixed", *dims)
    shared = table_bytes(g)
    launches = (
        Launch("capsule_fft_fno_fwd", *grid_1d(analysis_items(b, g, ci, m), BLOCK), args + (0,), shared),
        Launch("capsule_fft_fno_fwd", *grid_1d(b * m * co, BLOCK), args + (1,)),
        Launch("capsule_fft_fno_fwd", *grid_1d(synthesis_items(b, g, co, m), BLOCK), args + (2,), shared),
    )
    return LaunchPlan("fft_fno", "forward", buffers, launches, output_shapes={"out": (b, g, co)})


def backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
    b, g, ci, co, m = dims = _dims(inputs)
    w = m * ci * co
    buffers = (_f32("x", "input", b * g * ci), _f32("w_re", "input", w), _f32("w_im", "input", w),
               _f32("g", "input", b * g * co),
               _f32("dx", "output", b * g * ci), _f32("dw_re", "output", w), _f32("dw_im", "output", w),
               _f32("xspec", "workspace", 2 * b * m * ci), _f32("gspec", "workspace", 2 * b * m * co),
               _f32("gxspec", "workspace", 2 * b * m * ci))
    shared = table_bytes(g)
    (blocks, _, _), block = grid_1d(max(analysis_items(b, g, ci, m), analysis_items(b, g, co, m)), BLOCK)
    launches = (
        Launch("capsule_fft_fno_bwd_spectra", (blocks, 2, 1), block, ("x", "g", "xspec", "gspec", *dims), shared),
        Launch("capsule_fft_fno_bwd_mix", *grid_1d(b * m * ci, BLOCK), ("gspec", "w_re", "w_im", "gxspec", *dims)),
        Launch("capsule_fft_fno_bwd_x", *grid_1d(synthesis_items(b, g, ci, m), BLOCK), ("gxspec", "dx", *dims), shared),
        Launch("capsule_fft_fno_bwd_w", *grid_1d(w, BLOCK), ("xspec", "gspec", "dw_re", "dw_im", *dims)),
    )
    return LaunchPlan("fft_fno", "backward", buffers, launches,
                      output_shapes={"dx": (b, g, ci), "dw_re": (m, ci, co), "dw_im": (m, ci, co)})


PLANS = {"fft_fno": (forward, backward)}


BUDGET = KernelBudget(max_registers=register_budget(BLOCK))
"""A block of BLOCK threads fits on a multiprocessor."""
