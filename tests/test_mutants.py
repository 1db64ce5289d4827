"""Discriminating power of `capsules verify` (design §4): the mutation suite.

Every mutant of tests/mutants/ (a realistic bug planted in the numpy float32 provider) goes
through `verify_capsule(..., quick=True, seed=0)` on the dynamic checks. A mutant is killed when a
check FAILS or ERRORs that does not on the unmutated provider; it is killed for the right reason
when one of the checks its catalog entry expects FAILED. The other side of the same coin: the
unmutated provider, and a few other legitimate float32 implementations, raise no alarm at all.
"""

from __future__ import annotations

import time

import pytest
from mutants import BAD, DYNAMIC_CHECKS, LEGIT, MUTANTS, baseline, run_mutant, table, verify_statuses

from capsule_core.ops import FAMILIES, all_specs
from capsule_core.verify.checks import CHECKS

MIN_SCORE = 0.95
TIME_BUDGET_S = 60.0

REQUIRED_KINDS = {
    "VJP sign",
    "off by one",
    "dropped bias",
    "wrong axis",
    "transposed weights",
    "missing 1/n",
    "tie rule",
    "RNG stream",
    "NaN policy",
    "write out of bounds",
    "unwritten output",
    "input overwritten",
    "zeros for small values",
    "nondeterminism",
    "wrong eps",
    "wrong dtype",
    "missing guard",
}
"""The bug classes the mutation suite must cover (the issue's list and the engine's door-closers)."""


@pytest.fixture(scope="module")
def outcomes():
    start = time.perf_counter()
    result = [run_mutant(m) for m in MUTANTS]
    return result, time.perf_counter() - start


def test_catalog_covers_every_family_and_kind():
    ids = [m.id for m in MUTANTS + tuple(LEGIT)]
    assert len(ids) == len(set(ids)), "mutant ids must be unique"
    assert len(MUTANTS) >= 30
    assert {m.family for m in MUTANTS} == set(FAMILIES)
    assert REQUIRED_KINDS <= {m.kind for m in MUTANTS}, REQUIRED_KINDS - {m.kind for m in MUTANTS}
    for m in MUTANTS:
        assert m.expect and set(m.expect) <= set(DYNAMIC_CHECKS), m.id
        assert m.op in all_specs() and m.hooks and m.description, m.id
    assert set(DYNAMIC_CHECKS) <= set(CHECKS)


def test_mutation_score(outcomes):
    results, seconds = outcomes
    killed = sum(o.killed for o in results)
    survivors = [f"{o.mutant.id}: {o.mutant.gap or 'no check failed'}" for o in results if not o.killed]
    assert killed / len(results) >= MIN_SCORE, (
        f"mutation score {killed}/{len(results)} below {MIN_SCORE:.0%}; survivors:\n"
        + "\n".join(survivors)
        + "\n\n"
        + table(results)
    )


def test_every_survivor_is_a_known_gap(outcomes):
    """A new survivor is a hole in verify; a known gap that is now killed should lose its note."""
    results, _ = outcomes
    unexplained = [o.mutant.id for o in results if not o.killed and not o.mutant.gap]
    closed = [o.mutant.id for o in results if o.killed and o.mutant.gap]
    assert not unexplained, "mutants verify no longer catches:\n" + table([o for o in results if not o.killed])
    assert not closed, f"gaps now closed (remove their `gap` note): {closed}"


def test_kills_are_for_the_right_reason(outcomes):
    """A mutant killed only by an unrelated check, or by an ERROR (a crash), counts in the score but
    proves nothing about the check meant to catch it."""
    results, _ = outcomes
    flagged = [o for o in results if o.killed and not o.right_reason]
    assert not flagged, "killed for the wrong reason:\n" + "\n".join(
        f"{o.mutant.id}: expected {o.mutant.expect}, got "
        + ", ".join(f"{c}={o.statuses[c]} ({o.reasons[c][:120]})" for c in o.killers)
        for o in flagged
    )


def test_suite_runs_in_budget(outcomes):
    _, seconds = outcomes
    assert seconds < TIME_BUDGET_S, f"the mutation suite took {seconds:.1f} s"


@pytest.mark.parametrize("op", sorted(all_specs()))
def test_unmutated_provider_raises_no_alarm(op):
    statuses = baseline(op)
    alarms = {c: s for c, s in statuses.items() if s in BAD + ("MISTRUSTED",)}
    assert not alarms, f"{op}: the honest numpy provider got {alarms}"


@pytest.mark.parametrize("variant", LEGIT, ids=lambda m: m.id)
def test_legitimate_variant_raises_no_alarm(variant):
    """Another sane float32 implementation (summation order, Welford, tie winner ...) passes too:
    a tolerance model it exceeded would be wrong (design §4)."""
    statuses, reasons, _ = verify_statuses(variant.op, variant.backend())
    alarms = {c: f"{s}: {reasons[c][:200]}" for c, s in statuses.items() if s in BAD + ("MISTRUSTED",)}
    assert not alarms, f"{variant.id} ({variant.description}): {alarms}"
