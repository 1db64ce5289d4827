"""Running the kernel mutants: sources planted in a copy of cuda/, built and verified on emu."""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import contextmanager
from functools import lru_cache, partial
from pathlib import Path

from capsule_core.kernels.nvcc import cuda_source_dir
from mutants.kernel_catalog import KERNEL_MUTANTS, KernelMutant, StaleMutant  # noqa: F401
from mutants.runner import BAD, Outcome, outcome, run_mutant, table, verify_statuses

KERNEL_REPRESENTATIVES = (
    "pw-vector-tail-starts-late",
    "softmax-dropped-max-shuffle",
    "reduce-tile-dropped-barrier",
    "slice-bwd-off-by-one",
    "scatter-add-dropped-base",
    "random-stream-off-by-one",
    "batch-norm-bwd-x-swapped-sums",
    "pool-bwd-window-off-by-one",
    "sgemm-tile-count-rounds-down",
    "fno-mix-swapped-strides",
    "scan-lost-carry",
)
"""One kernel mutant per family, of as many kinds as there are families: what the default test run
plants (a build of a family costs 5 to 30 s; the whole catalog runs with --kernels)."""


@contextmanager
def mutated_sources(mutant: KernelMutant):
    """A temporary copy of cuda/ with the mutant planted: the folder an EmuBackend(family_dir=...)
    builds the family from (against the package's emulator header)."""
    with tempfile.TemporaryDirectory(prefix=f"capsules-mutant-{mutant.id}-") as work:
        folder = Path(work) / "cuda"
        shutil.copytree(cuda_source_dir(), folder)
        path = folder / mutant.file
        path.write_text(mutant.planted(path.read_text()))
        yield folder


def prebuild(mutants) -> None:
    """Builds the mutated families side by side through the shared build pool (one host compiler
    per usable core; a build takes 5 to 30 s, a verify run mostly under 2), into the content-hash
    cache the runs then load from. A mutant that does not compile is an error of the catalog."""
    from capsule_core.backends.emu import build_family
    from capsule_core.kernels.nvcc import build_in_parallel

    def build(mutant):
        with mutated_sources(mutant) as folder:
            build_family(mutant.family, family_dir=folder)

    failed = build_in_parallel({m.id: partial(build, m) for m in mutants})
    if failed:
        raise RuntimeError(f"kernel mutants that do not build: {failed}")


@lru_cache(maxsize=None)
def emu_baseline(op: str) -> dict:
    """Statuses of the unmutated kernels on `op` (cached)."""
    from capsule_core.backends.emu import EmuBackend

    return verify_statuses(op, EmuBackend())[0]


def run_kernel_mutant(mutant: KernelMutant, seed: int = 0) -> Outcome:
    from capsule_core.backends.emu import EmuBackend

    base = emu_baseline(mutant.op)
    with mutated_sources(mutant) as folder:
        return outcome(mutant, EmuBackend(family_dir=folder), base, seed)


def unexpected(outcomes) -> list:
    """Outcomes that break the catalog's promise: a mutant without a gap note that survived or was
    killed for the wrong reason, or a known gap that is now killed (its note should go)."""
    return [o for o in outcomes if (o.killed and o.mutant.gap) or (not o.mutant.gap and not o.right_reason)]


def _details(o: Outcome) -> str:
    return f"{o.mutant.id}: " + "; ".join(
        f"{c}={s} {o.reasons[c][:200]}" for c, s in o.statuses.items() if s != "SKIPPED"
    )


def _main_numpy():
    from mutants import LEGIT, MUTANTS

    start = time.perf_counter()
    outcomes = [run_mutant(m) for m in MUTANTS]
    seconds = time.perf_counter() - start
    legit = [run_mutant(m) for m in LEGIT]
    print(table(outcomes))
    print()
    print(table(legit))
    killed = sum(o.killed for o in outcomes)
    print(
        f"\nmutation score {killed}/{len(outcomes)} = {killed / len(outcomes):.1%}; "
        f"{sum(o.killed and not o.right_reason for o in outcomes)} for the wrong reason; {seconds:.1f} s"
    )
    for o in outcomes + legit:
        bad = (
            (not o.killed or not o.right_reason)
            if o.mutant.expect
            else any(s in BAD + ("MISTRUSTED",) for s in o.statuses.values())
        )
        if bad:
            print("\n" + _details(o))


def _main_kernels(ids: list[str]) -> int:
    known = {m.id for m in KERNEL_MUTANTS}
    if set(ids) - known:
        raise SystemExit(f"unknown kernel mutants: {', '.join(sorted(set(ids) - known))}")
    chosen = [m for m in KERNEL_MUTANTS if not ids or m.id in ids]
    start = time.perf_counter()
    prebuild(chosen)
    built = time.perf_counter()
    outcomes = [run_kernel_mutant(m) for m in chosen]
    print(table(outcomes))
    killed = sum(o.killed for o in outcomes)
    print(
        f"\nkernel mutation score {killed}/{len(outcomes)} = {killed / len(outcomes):.1%} "
        f"({sum(bool(o.mutant.gap) for o in outcomes)} known gaps); builds {built - start:.1f} s, "
        f"verify runs {time.perf_counter() - built:.1f} s"
    )
    for o in outcomes:
        if o.mutant.gap:
            print(f"\n{o.mutant.id} (known gap): {o.mutant.gap}")
    wrong = unexpected(outcomes)
    for o in wrong:
        print("\nUNEXPECTED " + _details(o))
    return 1 if wrong else 0
