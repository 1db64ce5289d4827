"""Compile a kernel family's __host__ __device__ math for the host and call it from numpy.

The device math of the kernels runs here, without a GPU: nvcc builds a small C++ harness that
includes cuda/<family>.cuh into a shared library, loaded with ctypes. Built once per session.
"""

from __future__ import annotations

import ctypes
import subprocess
from functools import lru_cache
from pathlib import Path

import numpy as np

from capsule_core.kernels import cuda_source_dir, find_nvcc

HARNESS_DIR = Path(__file__).resolve().parent / "host"


@lru_cache(maxsize=None)
def load(harness: str, build_dir: str) -> ctypes.CDLL:
    """Build tests/host/<harness>.cu (which includes headers from cuda/) into a shared library."""
    source = HARNESS_DIR / f"{harness}.cu"
    target = Path(build_dir) / f"lib{harness}.so"
    cmd = [str(find_nvcc().path), "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC", "-Werror", "all-warnings",
           "-I", str(cuda_source_dir()), "-o", str(target), str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"host build of {source.name} failed:\n{result.stderr}")
    return ctypes.CDLL(str(target))


def f32_ptr(a: np.ndarray):
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def u64_ptr(a: np.ndarray):
    assert a.dtype == np.uint64 and a.flags.c_contiguous
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64))
