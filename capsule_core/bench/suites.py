"""Named benchmark suites for `capsules bench --suite NAME`: fixed workloads at explicit shapes.

`--size` draws an op's own samples and resizes them; a suite instead pins each workload to the
shape a performance claim was made about, so that two runs (before and after a kernel change,
or on two devices) time exactly the same calls. The reference suite holds the shapes of the
static kernel review (issue 15): the large inputs its predictions of % of peak are about.

Cases are data; the values are made here, seeded per case, only when a case is timed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from capsule_core.ops import get_spec
from capsule_core.ops.base import Sample, seeded_rng

DIRECTIONS = ("fwd", "bwd")


@dataclass(frozen=True)
class SuiteCase:
    """One workload: an op at explicit input shapes (a tuple of shapes for a variadic input) and
    parameters, timed forward or backward (the VJP at a seeded cotangent)."""

    op: str
    label: str
    """The shape in a few characters, e.g. 32x65536: with op and direction it names the case."""
    shapes: Mapping[str, Any]
    params: Mapping[str, Any] = field(default_factory=dict)
    direction: str = "fwd"

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"suite case {self.op} {self.label}: direction must be one of {DIRECTIONS}")

    @property
    def case(self) -> str:
        """The case id in a bench report (its op is reported beside it)."""
        return f"{self.label} {self.direction}"

    @property
    def name(self) -> str:
        return f"{self.op} {self.case}"

    def stand_in(self) -> Sample:
        """The case's inputs without their memory: zero-stride float views and zero indices (valid
        for every index input), for validating shapes and for reports of cases never run."""
        return self._sample(
            lambda dtype, shape: (
                np.zeros(shape, np.int64) if dtype == "int64" else np.broadcast_to(np.float32(0), shape)
            )
        )

    def sample(self, seed: int = 0) -> Sample:
        """The case's inputs: float values uniform in [-1, 1) (bounded, so every op of a suite stays
        finite, a scan's decay included), index inputs zero; seeded by (op, case, seed)."""
        rng = seeded_rng(self.op, f"suite/{self.case}", seed)

        def draw(dtype, shape):
            if dtype == "int64":
                return np.zeros(shape, np.int64)
            values = rng.random(shape, dtype=np.float32)  # in place from here: one buffer per input
            values *= 2
            values -= 1
            return values

        return self._sample(draw)

    def _sample(self, make) -> Sample:
        inputs = {}
        for t in get_spec(self.op).inputs:
            shape = self.shapes[t.name]
            inputs[t.name] = tuple(make(t.dtype, s) for s in shape) if t.variadic else make(t.dtype, shape)
        return Sample(inputs, dict(self.params), self.case)


@dataclass(frozen=True)
class Suite:
    name: str
    cases: tuple[SuiteCase, ...]


def _case(op: str, label: str, direction: str = "fwd", params: Mapping[str, Any] | None = None, **shapes) -> SuiteCase:
    """A SuiteCase with its input shapes as keywords: one line per workload below."""
    return SuiteCase(op, label, shapes, params or {}, direction)


# The kernel review's reference shapes (issue 15), FP32: the large inputs of its predictions, and the
# shapes benchmarks/plan_reference.py shows the launch plans of.
REFERENCE = Suite(
    "reference",
    (
        _case("relu", "2^28", x=(2**28,)),
        _case("softmax", "32x65536", x=(32, 65536)),
        _case("softmax", "4096x4096", x=(4096, 4096)),
        _case("layer_norm", "4096x8192", x=(4096, 8192), gamma=(8192,), beta=(8192,)),
        _case("layer_norm", "4096x8192", "bwd", x=(4096, 8192), gamma=(8192,), beta=(8192,)),
        _case("reduce_sum", "2^28", x=(2**28,)),
        _case("matmul", "4096^3", a=(4096, 4096), b=(4096, 4096)),
        _case("linear", "8x4096 w4096x4096", x=(8, 4096), w=(4096, 4096), b=(4096,)),
        _case(
            "conv",
            "32x64x224x224 w64x64x3x3",
            params={"stride": 1, "padding": 1},
            x=(32, 64, 224, 224),
            w=(64, 64, 3, 3),
            b=(64,),
        ),
        _case("batch_norm", "64x256x56x56", x=(64, 256, 56, 56), gamma=(256,), beta=(256,)),
        _case("max_pool", "2x2 32x64x224x224", params={"kernel": 2}, x=(32, 64, 224, 224)),
        _case(
            "max_pool",
            "3x3s2 32x64x112x112",
            "bwd",
            params={"kernel": 3, "stride": 2, "padding": 1},
            x=(32, 64, 112, 112),
        ),
        _case("fft_fno", "B20 G4096 C64 M16", x=(20, 4096, 64), w_re=(16, 64, 64), w_im=(16, 64, 64)),
        _case(
            "selective_scan", "B4 T4096 D1536", x=(4, 4096, 1536), a=(4, 4096, 1536), b=(4, 4096, 1536), h0=(4, 1536)
        ),
        _case("permute", "8192x8192 transpose", params={"perm": (1, 0)}, x=(8192, 8192)),
        _case("concat", "2x 8192x4096 axis 1", params={"axis": 1}, xs=((8192, 4096), (8192, 4096))),
    ),
)

SUITES: dict[str, Suite] = {REFERENCE.name: REFERENCE}
