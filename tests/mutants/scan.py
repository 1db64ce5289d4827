"""Mutants of the scan family: gross bugs that verify must catch."""

from __future__ import annotations

import numpy as np

from capsule_core.ops import scan as sc
from mutants.planting import Mutant, forward_is, vjp_is

# -- scan ---------------------------------------------------------------------------------------


def _scan_previous_state(f, a, p):
    """Stores h before the update: y[t] = h[t-1]."""
    return sc._previous(a["h0"], f(a, p))


def _scan_dh0_without_a0(f, a, p, y, g):
    grads = f(a, p, y, g)
    total, _ = sc._reverse(a["a"], g)
    grads["h0"] = total[:, 0].copy() if g.shape[1] else np.zeros_like(a["h0"])
    return grads


SCAN = [
    Mutant(
        "selective-scan-off-by-one-step",
        "selective_scan",
        "off by one",
        "y[t] = h[t-1]: the state stored before the update",
        ("value",),
        {"spec": forward_is(_scan_previous_state)},
    ),
    Mutant(
        "selective-scan-dh0-missing-a0",
        "selective_scan",
        "wrong VJP",
        "dh0 = total[0] without the factor A[0]",
        ("vjp",),
        {"spec": vjp_is(_scan_dh0_without_a0)},
    ),
]
