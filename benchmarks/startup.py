"""Start-up cost of the CLI as a user sees it, against `python -c "import typer"`.

Whole processes, A and B alternating (so a busy machine slows both alike), PAIRS pairs, the
median of the pair ratios B/A. B is the `capsules` console script next to this interpreter (an
editable install, `pip install -e .`, is what developers run), or `python -m cli` without one.
The target is `capsules list` within 1.5x of `import typer`; --max-ratio makes it exit 1 beyond.

Usage: python benchmarks/startup.py [--pairs 20] [--max-ratio 1.5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = [sys.executable, "-c", "import typer"]


def capsules_argv() -> list[str]:
    script = Path(sys.executable).parent / "capsules"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cli"]


def install_kind() -> str:
    """editable, regular or not installed (python -m cli from the checkout)."""
    try:
        direct = metadata.distribution("capsules").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return "not installed"
    editable = json.loads(direct or "{}").get("dir_info", {}).get("editable", False)
    return "editable" if editable else "regular"


def seconds(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def pair_ratios(command: list[str], pairs: int, env: dict) -> tuple[list[float], list[float]]:
    """(baseline seconds, command seconds), run as pairs alternating which goes first."""
    base, timed = [], []
    for i in range(pairs):
        if i % 2:
            timed.append(seconds(command, env))
            base.append(seconds(BASELINE, env))
        else:
            base.append(seconds(BASELINE, env))
            timed.append(seconds(command, env))
    return base, timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--max-ratio", type=float, default=None, help="exit 1 when `capsules list` is slower")
    args = parser.parse_args()
    # Installed packages have their bytecode caches: let the warm-up runs write ours.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    capsules = capsules_argv()
    commands = {"capsules --help": [*capsules, "--help"], "capsules list": [*capsules, "list"]}
    for argv in (BASELINE, *commands.values()):
        seconds(argv, env)
    print(
        f"{' '.join(capsules)} ({install_kind()} install), {args.pairs} alternating pairs against "
        f"`python -c 'import typer'`; median of the pair ratios:"
    )
    ratios = {}
    for name, argv in commands.items():
        base, timed = pair_ratios(argv, args.pairs, env)
        ratios[name] = statistics.median(t / b for t, b in zip(timed, base))
        print(
            f"  {name:<16} {ratios[name]:5.2f}x   (medians {statistics.median(timed) * 1e3:6.1f} ms "
            f"against {statistics.median(base) * 1e3:6.1f} ms)"
        )
    if args.max_ratio is not None and ratios["capsules list"] > args.max_ratio:
        print(f"capsules list: {ratios['capsules list']:.2f}x is over {args.max_ratio}x")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
