"""Launch plans of the seeded sources (cuda/random.cu): rand_uniform and bernoulli_mask.

One forward launch, no inputs, no backward (VJP mode none). Each thread writes 4 consecutive
elements; element i depends only on (seed, i), so the grid never changes the bits.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, grid_1d
from capsule_core.kernels.nvcc import KernelBudget, register_budget

THREADS = 256
"""CAPSULE_RANDOM_THREADS: the kernels' __launch_bounds__."""
VECTOR = 4
"""Elements per thread and loop step (one 16-byte store)."""


def _plan(op: str, inputs: Mapping[str, Any], params: Mapping[str, Any], scalars: tuple) -> LaunchPlan:
    shape = tuple(int(d) for d in params["shape"])
    n = int(np.prod(shape, dtype=np.int64))
    grid, block = grid_1d(-(-n // VECTOR), THREADS)
    launch = Launch(f"capsule_{op}_fwd", grid, block, ("out", np.uint64(params["seed"]), *scalars, n))
    return LaunchPlan(op, "forward", (Buffer("out", "output", "float32", n),), (launch,), output_shapes={"out": shape})


def _rand_uniform(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    return _plan("rand_uniform", inputs, params, ())


def _bernoulli_mask(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> LaunchPlan:
    return _plan("bernoulli_mask", inputs, params, (np.float32(params["p"]),))


PLANS = {"rand_uniform": (_rand_uniform, None), "bernoulli_mask": (_bernoulli_mask, None)}


BUDGET = KernelBudget(max_registers=register_budget(THREADS))
"""A block of THREADS fits on a multiprocessor."""
