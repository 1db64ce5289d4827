"""The process NVIDIA's compute-sanitizer watches for `verify --sanitize` on a GPU
(sanitize.engine.compute_sanitizer starts it): the value and vjp checks of one op on the cuda
backend, run in this process, so the sanitizer sees every launch. Exit 0 when they pass, 1 when
one fails or errs, 3 without a GPU (compute-sanitizer's findings set its own exit code).

Example: python -m capsule_core.drivers.sanitized_verify relu --quick --seed 0
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m capsule_core.drivers.sanitized_verify")
    parser.add_argument("op")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--case")
    parser.add_argument("--library", action="append", default=[])
    options = parser.parse_args(argv)
    from capsule_core.backends.select import resolve
    from capsule_core.catalog.registry import lookup, use_libraries
    from capsule_core.errors import CapsuleError, EnvironmentMissing
    from capsule_core.verify.engine import Status, verify_capsule

    failed = use_libraries(options.library)
    if failed:
        print(f"capsules: error: {'; '.join(f.message for f in failed)}", file=sys.stderr)
        return 2
    try:
        capsule = lookup(options.op)
        backend, _ = resolve("cuda")
    except EnvironmentMissing as exc:
        print(f"capsules: error: {exc}", file=sys.stderr)
        return 3
    except CapsuleError as exc:
        print(f"capsules: error: {exc}", file=sys.stderr)
        return 2
    report = verify_capsule(
        capsule, backend, quick=options.quick, seed=options.seed, checks=("value", "vjp"), case=options.case
    )
    for r in report.results:
        print(f"{r.status.value} {capsule.name} {r.check}: {r.reason}")
    return 1 if report.status in (Status.FAILED, Status.ERROR) else 0


if __name__ == "__main__":
    sys.exit(main())
