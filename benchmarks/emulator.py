"""The CPU emulator's own speed: emulated launches per second and elements per second for kernels
of different kinds, beside numpy computing the same op in float32.

The kernels: a pointwise map (relu), a row reduction (softmax), the tiled SGEMM with cp.async
(matmul 512^3) and a barrier-heavy scan (selective_scan). Each plan is staged once on the emu
backend (DeviceBackend.stage: buffers allocated and uploaded) and then run again and again, so a
sample is the plan's launches alone. A change that slows the emulator shows here, not in a timed
test. Each workload runs with the blocks of a launch on 1, 2 and all usable cores (the emulator's
OS threads, --threads to choose); `speedup` is against 1 thread.

Usage: python benchmarks/emulator.py [--repeat 3] [--threads 1,2,16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from capsule_core.backends.emu import EmuBackend
from capsule_core.catalog import registry
from capsule_core.kernels.launch import flat_buffers, plan_functions
from capsule_core.kernels.nvcc import usable_cpus
from capsule_core.ops import get_spec
from capsule_core.ops.base import validate, working_params

rng = np.random.default_rng(0)

WORKLOADS = {
    "pointwise (relu, 2^22 elements)": ("relu", {"x": rng.standard_normal(1 << 22, dtype=np.float32)}, {}),
    "row reduction (softmax, 1024 x 1024)": ("softmax", {"x": rng.standard_normal((1024, 1024), dtype=np.float32)}, {}),
    "tiled SGEMM, cp.async (matmul 512^3)": (
        "matmul",
        {
            "a": rng.standard_normal((512, 512), dtype=np.float32),
            "b": rng.standard_normal((512, 512), dtype=np.float32),
        },
        {},
    ),
    "barrier-heavy scan (selective_scan, 4 x 1024 x 64)": (
        "selective_scan",
        {
            "x": rng.standard_normal((4, 1024, 64), dtype=np.float32),
            "a": rng.uniform(0.5, 1.0, (64,)).astype(np.float32),
            "b": rng.standard_normal((64,), dtype=np.float32),
            "h0": np.zeros((4, 64), np.float32),
        },
        {},
    ),
}


def seconds_per_call(call, repeat: int) -> float:
    call()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(backend: EmuBackend, label: str, op: str, inputs: dict, params: dict, repeat: int) -> dict:
    """One workload at backend.threads emulator threads."""
    spec = get_spec(op)
    capsule = registry.lookup(op)
    arrays, p, _ = validate(spec, inputs, params, np.float32)
    plan = plan_functions(capsule)[0](arrays, p)
    staged = backend.stage(capsule, plan, flat_buffers(arrays))
    try:
        emulated = seconds_per_call(lambda: backend.run(staged), repeat)
    finally:
        backend.release(staged)
    fp = working_params(p, np.float32)
    with np.errstate(all="ignore"):
        reference = seconds_per_call(lambda: spec.forward(arrays, fp), max(repeat, 5))
    elements = sum(int(np.size(a)) for a in arrays.values())
    launches = len(plan.kernel_launches)
    return {
        "workload": label,
        "op": op,
        "threads": backend.threads,
        "launches": launches,
        "elements": elements,
        "emulated_s": emulated,
        "launches_per_s": launches / emulated,
        "elements_per_s": elements / emulated,
        "numpy_s": reference,
        "slowdown_vs_numpy": emulated / reference,
    }


def thread_counts(text: str | None) -> list[int]:
    cores = usable_cpus()
    if text:
        return [int(t) for t in text.split(",")]
    return sorted({1, min(2, cores), cores})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per workload (median)")
    parser.add_argument("--threads", help="comma-separated emulator thread counts (default: 1, 2 and all usable cores)")
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    counts = thread_counts(args.threads)
    backend = EmuBackend(launch_timeout=0)
    rows = []
    for label, work in WORKLOADS.items():
        first = None
        for threads in counts:
            backend.threads = threads
            row = measure(backend, label, *work, args.repeat)
            first = first or row
            row["speedup"] = first["emulated_s"] / row["emulated_s"]
            rows.append(row)
    document = {"usable_cpus": usable_cpus(), "emulator": backend.description, "rows": rows}
    print(f"{backend.description}; {usable_cpus()} usable CPUs; median of {args.repeat} runs")
    print(
        f"{'workload':<52} {'threads':>7} {'launches/s':>11} {'elements/s':>11} {'emulated':>10} "
        f"{'speedup':>8} {'numpy':>10} {'x numpy':>8}"
    )
    for r in rows:
        print(
            f"{r['workload']:<52} {r['threads']:>7} {r['launches_per_s']:11.3g} {r['elements_per_s']:11.3g} "
            f"{r['emulated_s']:9.3f}s {r['speedup']:7.2f}x {r['numpy_s']:9.4f}s {r['slowdown_vs_numpy']:8.0f}"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(document, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
