"""cuda/common.cuh compiled for the host: the kernels' SplitMix64 stream and output-length rules
against the reference."""

import ctypes

import numpy as np
import pytest
from hostmath import f32_ptr, load

from capsule_core.ops.random import uniform_bits, uniform_values


@pytest.fixture(scope="module")
def lib(host_build_dir):
    lib = load("common_host", host_build_dir)
    for name in ("host_window_out_len", "host_transpose_out_len"):
        getattr(lib, name).restype = ctypes.c_int64
        getattr(lib, name).argtypes = [ctypes.c_int64] * 4
    return lib


@pytest.mark.parametrize("seed", [0, 1, 1234567, 2**63 + 5, 2**64 - 1])
def test_stream_bits_match_the_reference_generator(lib, seed):
    n = 4099
    bits = np.empty(n, np.uint32)
    lib.host_stream_bits(ctypes.c_uint64(seed), ctypes.c_int64(n), bits.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)))
    assert np.array_equal(bits, uniform_bits(seed, n).astype(np.uint32))
    u = np.empty(n, np.float32)
    lib.host_uniform(ctypes.c_uint64(seed), ctypes.c_int64(n), f32_ptr(u))
    assert np.array_equal(u, uniform_values(seed, n, np.float32))


@pytest.mark.parametrize(
    "size, k, s, p", [(5, 3, 1, 0), (5, 3, 2, 1), (2, 5, 1, 1), (1, 5, 1, 1), (7, 7, 3, 0), (10, 4, 3, 2)]
)
def test_output_lengths(lib, size, k, s, p):
    expected = 0 if size + 2 * p < k else (size + 2 * p - k) // s + 1
    assert lib.host_window_out_len(size, k, s, p) == expected
    assert lib.host_transpose_out_len(size, k, s, p) == max(0, (size - 1) * s + k - 2 * p)
