"""Discriminating power of `verify --backend emu` (design §8, issue 12 piece 4): bugs planted in
the CUDA sources themselves.

Each kernel mutant of tests/mutants/ replaces one exact piece of cuda/ text (a vector tail that
starts late, a dropped barrier or shuffle step, a tile count that rounds down, swapped strides, a
lost carry, a backward handed the wrong operand ...) in a temporary copy of cuda/, which the emu
backend builds instead of the real one; verify's dynamic checks must then FAIL one of the checks
the mutant expects. A family build costs 5 to 30 s, so the default run plants one representative
mutant per family (KERNEL_REPRESENTATIVES); `python tests/mutants --kernels` runs the whole
catalog and prints its table and score. That the unmutated kernels raise no alarm is
`verify --all --backend emu`'s job, tested elsewhere.
"""

from __future__ import annotations

import hashlib

import pytest
from mutants import (
    BAD,
    DYNAMIC_CHECKS,
    KERNEL_MUTANTS,
    KERNEL_REPRESENTATIVES,
    KernelMutant,
    StaleMutant,
    emu_baseline,
    mutated_sources,
    prebuild,
    run_kernel_mutant,
)

from capsule_core.backends import emu
from capsule_core.kernels import nvcc as kernels
from capsule_core.ops import FAMILIES, all_specs
from capsule_core.source_files import include_closure

pytestmark = pytest.mark.skipif(
    emu.shutil.which("g++") is None and emu.shutil.which("clang++") is None,
    reason="no C++ compiler (g++ or clang++) for the emulator",
)

REQUIRED_KINDS = {
    "vector tail",
    "dropped barrier",
    "dropped shuffle",
    "tile count",
    "swapped strides",
    "lost carry",
    "wrong operand",
    "off by one",
    "wrong identity",
}
"""The kernel bug classes the catalog must cover (issue 12's list and the brief's)."""

REPRESENTATIVES = tuple(m for m in KERNEL_MUTANTS if m.id in KERNEL_REPRESENTATIVES)


def _digest(folder) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def test_kernel_catalog_is_current_and_covers_every_family_and_kind():
    """Cheap, no build: every mutant's text is in its file exactly once (a kernel change that
    invalidates one fails here, by name), in a file of its op's family build."""
    ids = [m.id for m in KERNEL_MUTANTS]
    assert len(ids) == len(set(ids)), "kernel mutant ids must be unique"
    assert {m.family for m in KERNEL_MUTANTS} == set(FAMILIES)
    assert REQUIRED_KINDS <= {m.kind for m in KERNEL_MUTANTS}, REQUIRED_KINDS - {m.kind for m in KERNEL_MUTANTS}
    source = kernels.cuda_source_dir()
    for m in KERNEL_MUTANTS:
        assert m.op in all_specs() and m.description and m.original != m.replacement, m.id
        assert m.expect and set(m.expect) <= set(DYNAMIC_CHECKS), m.id
        closure = {p.name for p in include_closure(source / f"{m.family}.cu")}
        assert m.file in closure, f"{m.id}: cuda/{m.file} is not part of the {m.family} build"
        m.planted((source / m.file).read_text())
    assert len(KERNEL_REPRESENTATIVES) == len(REPRESENTATIVES) == len(FAMILIES)
    assert {m.family for m in REPRESENTATIVES} == set(FAMILIES)
    assert not any(m.gap for m in REPRESENTATIVES)


@pytest.mark.parametrize("source, count", [("__syncthreads();", 0), ("acc = 0; acc = 0;", 2)])
def test_a_stale_mutant_fails_loudly(source, count):
    stale = KernelMutant(
        "stale", "reduce.cu", "acc = 0;", "acc = 1;", "reduce_sum", "wrong identity", "stale", ("value",)
    )
    with pytest.raises(
        StaleMutant, match=f"kernel mutant stale: its source text occurs {count} times in cuda/reduce.cu, not once"
    ):
        stale.planted(source)


def test_a_mutant_is_planted_in_a_copy_built_under_its_own_key():
    """The repository's cuda/ is never edited, and the mutated build cannot collide with the real one
    in the cache (the key hashes the sources)."""
    mutant = REPRESENTATIVES[0]
    real = kernels.cuda_source_dir()
    before = _digest(real)
    compiler = emu.find_host_compiler()
    driver = emu.dispatch_source(real / f"{mutant.family}.cu", emu.family_refs(mutant.family))
    real_key = emu.build_key(real / f"{mutant.family}.cu", driver, compiler, emu.HOST_FLAGS)
    with mutated_sources(mutant) as folder:
        assert mutant.replacement in (folder / mutant.file).read_text()
        assert emu.build_key(folder / f"{mutant.family}.cu", driver, compiler, emu.HOST_FLAGS) != real_key
    assert _digest(real) == before


def test_copies_of_a_mutant_share_one_build_key():
    """prebuild and the run plant a mutant in two temporary folders: the run must find the build
    prebuild made, so the key depends on the files, not on the folder they are in."""
    mutant = REPRESENTATIVES[0]
    compiler = emu.find_host_compiler()

    def key(folder):
        source = folder / f"{mutant.family}.cu"
        driver = emu.dispatch_source(source, emu.family_refs(mutant.family))
        return emu.build_key(source, driver, compiler, emu.HOST_FLAGS)

    with mutated_sources(mutant) as first, mutated_sources(mutant) as second:
        assert first != second
        assert key(first) == key(second)


@pytest.fixture(scope="module")
def built():
    """The representatives' family builds, side by side (cached by content hash across runs)."""
    prebuild(REPRESENTATIVES)


@pytest.mark.parametrize("mutant", REPRESENTATIVES, ids=lambda m: m.id)
def test_representative_kernel_mutant_is_killed(built, mutant):
    outcome = run_kernel_mutant(mutant)
    found = "; ".join(f"{c}={s} {outcome.reasons[c][:160]}" for c, s in outcome.statuses.items() if s != "SKIPPED")
    alarms = {c: s for c, s in emu_baseline(mutant.op).items() if s in BAD}
    assert not alarms, f"the unmutated kernels already fail verify {mutant.op} --backend emu: {alarms}"
    assert outcome.killed, f"{mutant.id} ({mutant.description}) survived verify --backend emu: {found}"
    assert outcome.right_reason, f"{mutant.id}: expected {mutant.expect} to FAIL, killed by {outcome.killers}: {found}"
