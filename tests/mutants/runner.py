"""Running the catalogue: verify each mutant and tabulate what killed it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from capsule_core.backends.numpy_f32 import NumpyBackend
from mutants.planting import DYNAMIC_CHECKS, Mutant

# -- running ------------------------------------------------------------------------------------

BAD = ("FAILED", "ERROR")


@dataclass(frozen=True)
class Outcome:
    """What verify made of one mutant. `killers`: the checks that FAILED or ERRORed on the mutant
    and did not on the unmutated provider (an engine false alarm kills nothing)."""

    mutant: Mutant
    statuses: dict
    reasons: dict
    killers: tuple[str, ...]
    seconds: float

    @property
    def killed(self) -> bool:
        return bool(self.killers)

    @property
    def right_reason(self) -> bool:
        """An expected check FAILED (not merely ERRORed: a crash is no proof the check works)."""
        return any(self.statuses.get(c) == "FAILED" for c in self.mutant.expect if c in self.killers)


def verify_statuses(op: str, backend, seed: int = 0):
    from capsule_core.catalog import registry
    from capsule_core.verify.engine import verify_capsule

    report = verify_capsule(registry.lookup(op), backend, quick=True, seed=seed, checks=DYNAMIC_CHECKS)
    statuses = {r.check: r.status.value for r in report.results}
    return statuses, {r.check: r.reason for r in report.results}, report.seconds


@lru_cache(maxsize=None)
def baseline(op: str) -> dict:
    """Statuses of the unmutated numpy provider on `op` (cached)."""
    return verify_statuses(op, NumpyBackend())[0]


def outcome(mutant, backend, base: dict, seed: int = 0) -> Outcome:
    """verify of the mutant planted in `backend`, against `base`, the unmutated backend's statuses."""
    statuses, reasons, seconds = verify_statuses(mutant.op, backend, seed)
    killers = tuple(c for c, s in statuses.items() if s in BAD and base.get(c) not in BAD)
    return Outcome(mutant, statuses, reasons, killers, seconds)


def run_mutant(mutant: Mutant, seed: int = 0) -> Outcome:
    return outcome(mutant, mutant.backend(), baseline(mutant.op), seed)


def table(outcomes) -> str:
    rows = []
    for o in outcomes:
        if not o.mutant.expect:
            verdict = (
                "passed (legitimate)"
                if not any(s in BAD + ("MISTRUSTED",) for s in o.statuses.values())
                else "FALSE ALARM"
            )
        else:
            verdict = (
                ("killed" if o.right_reason else "killed (wrong reason)")
                if o.killed
                else ("survived (known gap)" if o.mutant.gap else "SURVIVED")
            )
        rows.append(
            f"{o.mutant.id:40s} {o.mutant.family:10s} {o.mutant.op:20s} {verdict:22s} "
            f"by {', '.join(o.killers) or '-':40s} expected {', '.join(o.mutant.expect) or '-'}"
        )
    return "\n".join(rows)
