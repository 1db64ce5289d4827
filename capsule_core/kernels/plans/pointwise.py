"""Launch plans of the pointwise family: one grid-stride launch per direction.

The kernels (cuda/pointwise.cu) move float4 vectors, so the grid is sized for n/4 threads of
BLOCK; any grid is correct (grid-stride loops, a scalar path for unaligned buffers), this one
gives each thread about one vector up to grid_1d's cap of 32 blocks per H200 multiprocessor.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, grid_1d
from capsule_core.kernels.nvcc import KernelBudget, register_budget

BLOCK = 256
VECTOR = 4
"""Elements per 16-byte vector access."""


def launch_shape(n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return grid_1d(-(-n // VECTOR), BLOCK)


def _plan(
    op: str, direction: str, inputs: tuple[str, ...], outputs: tuple[str, ...], shape: tuple, scalars: tuple = ()
) -> LaunchPlan:
    """One launch of capsule_<op>_<fwd|bwd> with the buffers in parameter order (inputs, then
    outputs), then the scalar parameters, then n, as the registry declares them."""
    n = int(np.prod(shape, dtype=np.int64))
    grid, block = launch_shape(n)
    suffix = "fwd" if direction == "forward" else "bwd"
    buffers = tuple(Buffer(b, "input", "float32", n) for b in inputs) + tuple(
        Buffer(b, "output", "float32", n) for b in outputs
    )
    launch = Launch(f"capsule_{op}_{suffix}", grid, block, (*inputs, *outputs, *(np.float32(s) for s in scalars), n))
    return LaunchPlan(op, direction, buffers, (launch,), output_shapes={b: tuple(shape) for b in outputs})


def _unary(op: str, params: tuple[str, ...] = ()):
    def forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
        return _plan(op, "forward", ("x",), ("out",), np.shape(inputs["x"]), tuple(p[k] for k in params))

    def backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
        return _plan(op, "backward", ("x", "g"), ("dx",), np.shape(inputs["x"]), tuple(p[k] for k in params))

    return forward, backward


def _binary(op: str):
    def forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
        return _plan(op, "forward", ("x", "y"), ("out",), np.shape(inputs["x"]))

    def backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
        return _plan(op, "backward", ("x", "y", "g"), ("dx", "dy"), np.shape(inputs["x"]))

    return forward, backward


def _scale():
    """dx = c·g reads only the cotangent."""

    def forward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
        return _plan("scale", "forward", ("x",), ("out",), np.shape(inputs["x"]), (p["c"],))

    def backward(inputs: Mapping[str, Any], p: Mapping[str, Any]) -> LaunchPlan:
        return _plan("scale", "backward", ("g",), ("dx",), np.shape(inputs["x"]), (p["c"],))

    return forward, backward


PLANS = {
    **{
        op: _unary(op)
        for op in ("relu", "gelu", "abs", "sqrt", "sigmoid", "tanh", "softplus", "exp", "sin", "cos", "log", "inv")
    },
    **{op: _binary(op) for op in ("add", "sub", "mul", "max", "min")},
    "scale": _scale(),
    "clamp": _unary("clamp", ("lo", "hi")),
    "safe_log": _unary("safe_log", ("eps",)),
}


BUDGET = KernelBudget(
    max_registers=register_budget(BLOCK, 8),
    stack_frames={
        "capsule_sin_bwd": "libm cosf's Payne-Hanek slow path for huge arguments",
        "capsule_cos_bwd": "libm sinf's Payne-Hanek slow path for huge arguments",
    },
)
"""32 registers: eight blocks of BLOCK threads fill a multiprocessor."""
