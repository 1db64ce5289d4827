"""The launch plans of issue 15's reference shapes, as `capsules plan` prints them: the static
figures (grids, registers, occupancy, waves, roofline floors) a kernel change is judged by.
benchmarks/plan-before.txt holds them before the kernel work; rerun after it and compare.

Usage: python benchmarks/plan_reference.py [--arch sm_90] [--json] > benchmarks/plan-after.txt
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

REFERENCE = [
    ["linear", "--input", "x=8x4096", "--input", "w=4096x4096"],
    ["softmax", "--input", "x=32x65536"],
    ["softmax", "--input", "x=4096x4096"],
    ["layer_norm", "--input", "x=4096x8192"],
    ["layer_norm", "--input", "x=4096x8192", "--direction", "bwd"],
    ["reduce_sum", "--input", "x=268435456"],
    ["matmul", "--input", "a=4096x4096", "--input", "b=4096x4096"],
    ["conv", "--input", "x=32x64x224x224", "--input", "w=64x64x3x3", "--param", "padding=1"],
    ["fft_fno", "--input", "x=20x4096x64", "--input", "w_re=16x64x64"],
]
"""(op and arguments) per reference shape: linear x(8,4096) w(4096,4096); softmax x(32,65536)
and x(4096,4096); layer_norm x(4096,8192) forward and backward; reduce_sum over 2^28 floats;
matmul 4096^3; a 3x3 "same" conv 64->64 on 32 images of 224^2; fft_fno with B=20, G=4096,
C=64, M=16. Left-out inputs (biases, gamma, beta, w_im) take the shapes the others imply."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", help="passed to capsules plan (default: the local GPU's, else sm_90)")
    parser.add_argument("--json", action="store_true", help="one JSON document per shape instead of the tables")
    args = parser.parse_args()
    extra = (["--arch", args.arch] if args.arch else []) + (["--json"] if args.json else [])
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    print(f"# capsules plan, reference shapes of issue 15; tree {commit.stdout.strip() or 'unknown'}\n")
    worst = 0
    for argv in REFERENCE:
        print(f"$ capsules plan {' '.join(argv + extra)}", flush=True)
        result = subprocess.run(
            [sys.executable, "-m", "cli", "plan", *argv, *extra], cwd=ROOT, capture_output=True, text=True
        )
        print(result.stdout.rstrip("\n") + result.stderr.rstrip("\n") + "\n", flush=True)
        worst = max(worst, result.returncode)
    return worst


if __name__ == "__main__":
    sys.exit(main())
