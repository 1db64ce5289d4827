"""The mutant catalog: planted bugs in the numpy float32 provider that `capsules verify` must catch.

Design §4 promises discriminating power: a tolerance model that a planted bug cannot exceed is as
wrong as one a legitimate float32 implementation exceeds. Each `Mutant` names one realistic kernel
bug (a sign flipped in a VJP, an off-by-one window, a dropped bias, a wrong axis, a broken NaN or
tie policy, an RNG stream off by one, a write past the end of an output, an input overwritten ...)
and builds a `MutantBackend`: the numpy provider behind verify's Backend interface, which

* swaps in a mutated OpSpec internally (`dataclasses.replace(spec, forward=..., vjp=...)`) while
  the engine keeps the correct spec for its float64 reference, and/or
* post-processes the forward values (nondeterministic jitter), and/or
* misbehaves with the guarded buffers (writes past the end, leaves an element unwritten, writes
  float64 bytes into a float32 buffer), and/or
* misbehaves around the runtime guard (counts a launch before validating, raises the wrong error).

`expect` lists the checks that should catch the bug for the right reason; tests/test_mutants.py
runs `verify_capsule(..., quick=True)` on every mutant and holds the suite to that.

MUTANTS = one list per family (gross bugs), SUBTLE (small numerical errors: TF32 operands, a one-pass
variance, a truncated constant ...) and GAPS (bugs verify misses today, each with a `gap` note saying
what would catch it). LEGIT holds the other side: different but sane float32 implementations
(another summation order, Welford, another tie winner, numpy.fft) that must raise no alarm.
Run `python tests/mutants` for the per-mutant table (which check killed what).

KERNEL_MUTANTS are bugs planted in the CUDA sources themselves (design §8): each replaces one exact
piece of text, which must occur exactly once, in a temporary copy of cuda/ that the emu backend
builds (EmuBackend(family_dir=...); the repository's cuda/ is never touched), and `verify op
--backend emu` must FAIL an expected check. A family build takes 5 to 30 s, so the default tests
(tests/test_kernel_mutants.py) plant KERNEL_REPRESENTATIVES, one per family; `python
tests/mutants --kernels [ID ...]` runs the whole catalog (builds side by side, one per core) and
prints its table and score, exit 1 on a surprise.
"""

import itertools

from mutants.conv_pool import CONV_POOL
from mutants.index import INDEX
from mutants.kernel_catalog import KERNEL_MUTANTS, KernelMutant, StaleMutant
from mutants.kernel_runner import (
    KERNEL_REPRESENTATIVES,
    emu_baseline,
    mutated_sources,
    prebuild,
    run_kernel_mutant,
    unexpected,
)
from mutants.legit import LEGIT
from mutants.linalg import LINALG
from mutants.norm import NORM
from mutants.planting import DYNAMIC_CHECKS, Mutant, MutantBackend, both, forward_is, vjp_is
from mutants.pointwise import POINTWISE
from mutants.random import RANDOM
from mutants.reduce import REDUCE
from mutants.runner import BAD, Outcome, baseline, run_mutant, table, verify_statuses
from mutants.scan import SCAN
from mutants.softmax import SOFTMAX
from mutants.spectral import SPECTRAL
from mutants.subtle import GAPS, SUBTLE
from mutants.view import VIEW

MUTANTS: tuple[Mutant, ...] = tuple(
    itertools.chain(
        POINTWISE, SOFTMAX, REDUCE, VIEW, INDEX, RANDOM, NORM, CONV_POOL, LINALG, SPECTRAL, SCAN, SUBTLE, GAPS
    )
)

__all__ = [
    "BAD",
    "DYNAMIC_CHECKS",
    "KERNEL_MUTANTS",
    "KERNEL_REPRESENTATIVES",
    "KernelMutant",
    "LEGIT",
    "MUTANTS",
    "Mutant",
    "MutantBackend",
    "Outcome",
    "StaleMutant",
    "baseline",
    "both",
    "emu_baseline",
    "forward_is",
    "mutated_sources",
    "prebuild",
    "run_kernel_mutant",
    "run_mutant",
    "table",
    "unexpected",
    "verify_statuses",
    "vjp_is",
]
