"""`python tests/mutants [--kernels [ID ...]]`: the per-mutant table (which check killed what)."""

import sys
from pathlib import Path

# tests/, not this folder, on the path: its random.py must not stand in for the standard library's
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from mutants.kernel_runner import _main_kernels, _main_numpy  # noqa: E402

if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description="The mutation suite: the numpy provider's mutants, or with "
        "--kernels the kernel mutants on the emu backend."
    )
    parser.add_argument("--kernels", nargs="*", metavar="ID", help="run the kernel mutants (all, or these ids)")
    arguments = parser.parse_args()
    if arguments.kernels is None:
        _main_numpy()
    else:
        sys.exit(_main_kernels(arguments.kernels))
