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

from capsule_core.kernels.nvcc import cuda_source_dir, find_nvcc

HARNESS_DIR = Path(__file__).resolve().parent / "host"


@lru_cache(maxsize=None)
def load(harness: str, build_dir: str) -> ctypes.CDLL:
    """Build tests/host/<harness>.cu (which includes headers from cuda/) into a shared library."""
    source = HARNESS_DIR / f"{harness}.cu"
    target = Path(build_dir) / f"lib{harness}.so"
    cmd = [
        str(find_nvcc().path),
        "-std=c++17",
        "-O2",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "-Werror",
        "all-warnings",
        "-I",
        str(cuda_source_dir()),
        "-o",
        str(target),
        str(source),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"host build of {source.name} failed:\n{result.stderr}")
    return ctypes.CDLL(str(target))


F32P = ctypes.POINTER(ctypes.c_float)
I64P = ctypes.POINTER(ctypes.c_int64)
CTYPES = {"float": ctypes.c_float, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "int32_t": ctypes.c_int32}
"""The ctypes type of each declared C scalar type of the registry."""


def declare(lib: ctypes.CDLL, signatures: dict) -> ctypes.CDLL:
    """Sets restype and argtypes of each named function: {name: argtypes} (returning void) or
    {name: (restype, argtypes)}."""
    for name, signature in signatures.items():
        restype, argtypes = signature if isinstance(signature, tuple) else (None, signature)
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def declare_kernels(lib: ctypes.CDLL, refs) -> ctypes.CDLL:
    """host_<op>_<dir> for each registry symbol capsule_<op>_<dir>, returning void: the declared
    parameters (float pointers as float*)."""
    from capsule_core.kernels.launch import parse_param

    return declare(
        lib,
        {
            ref.symbol.replace("capsule_", "host_", 1): [
                F32P if p.pointer else CTYPES[p.ctype] for p in map(parse_param, ref.params)
            ]
            for ref in refs
        },
    )


def f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def ptr(a: np.ndarray):
    """A float* or int64_t* to a contiguous float32 or int64 array."""
    assert a.dtype in (np.float32, np.int64) and a.flags.c_contiguous
    return a.ctypes.data_as(F32P if a.dtype == np.float32 else I64P)


def f32_ptr(a: np.ndarray):
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return a.ctypes.data_as(F32P)
