"""Start-up cost of the CLI against `python -c "import typer"` (median wall time of N runs).

Usage: python benchmarks/startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMANDS = {
    "python -c 'import typer'": [sys.executable, "-c", "import typer"],
    "capsules --help": [sys.executable, "-m", "cli", "--help"],
    "capsules list": [sys.executable, "-m", "cli", "list"],
}


def median_seconds(argv: list[str], runs: int) -> float:
    """Median of `runs` timed runs after one warm-up run (which writes the bytecode caches, as an
    installed package has them: PYTHONDONTWRITEBYTECODE is dropped for the measurement)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    samples = []
    for i in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        if i == 0:
            continue
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    results = {name: median_seconds(argv, args.runs) for name, argv in COMMANDS.items()}
    base = results["python -c 'import typer'"]
    for name, seconds in results.items():
        print(f"{name:<28} {seconds * 1000:7.1f} ms  {seconds / base:5.2f}x")


if __name__ == "__main__":
    main()
