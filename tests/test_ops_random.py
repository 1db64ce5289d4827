"""rand_uniform and bernoulli_mask: SplitMix64 against its published outputs, the counter
stream built on it, the value conventions and two statistical tests."""

import time

import numpy as np
import pytest

from capsule_core.backends.numpy_f32 import forward as numpy_forward
from capsule_core.catalog import reference
from capsule_core.errors import ParamError
from capsule_core.ops.random import GOLDEN_GAMMA, mix, splitmix64_stream, uniform_bits

stats = pytest.importorskip("scipy.stats")

PUBLISHED_1234567 = [
    6457827717110365317,
    3203168211198807973,
    9817491932198370423,
    4593380528125082431,
    16408922859458223821,
]
"""The first five outputs of the standard SplitMix64 generator seeded with 1234567."""


def test_mix_reproduces_the_published_splitmix64_sequence():
    # The standard generator's i-th output is mix(seed + i·γ): mix adds γ before mixing.
    outputs = [mix((1234567 + i * GOLDEN_GAMMA) % 2**64) for i in range(5)]
    assert outputs == PUBLISHED_1234567


def test_vectorised_mix_equals_the_integer_mix():
    states = 1234567 + np.arange(5, dtype=np.uint64) * np.uint64(GOLDEN_GAMMA)
    assert mix(states).tolist() == PUBLISHED_1234567


def test_counter_stream_is_mix_of_key_plus_index():
    seed = 1234567
    key = mix(seed)
    expected = [mix((key + i) % 2**64) for i in range(6)]
    assert splitmix64_stream(seed, 6).tolist() == expected
    assert uniform_bits(seed, 6).tolist() == [v & 0xFFFFFFFF for v in expected]


def test_counter_stream_wraps_past_2_to_the_64():
    seed = 2**64 - 1
    key = mix(seed)
    stream = splitmix64_stream(seed, 3)
    assert stream.tolist() == [mix((key + i) % 2**64) for i in range(3)]


def test_uniform_values_are_the_top_24_of_the_low_32_bits():
    u = reference.forward("rand_uniform", {}, shape=(2, 3), seed=42)
    bits = uniform_bits(42, 6)
    assert u.reshape(-1).tolist() == [(int(b) >> 8) * 2.0**-24 for b in bits]


def test_ten_million_draws_are_vectorised():
    """10^7 draws in well under a second of this process's CPU time (a Python loop per element
    would take minutes): CPU time, not wall time, so a loaded machine cannot fail it."""
    start = time.process_time()
    u = numpy_forward("rand_uniform", {}, shape=(10**7,), seed=3)
    assert time.process_time() - start < 1.0
    assert u.dtype == np.float32 and u.shape == (10**7,)


def test_uniform_is_in_unit_interval_on_the_2_to_the_minus_24_grid():
    u = reference.forward("rand_uniform", {}, shape=(1000, 100), seed=11)
    assert u.min() >= 0.0 and u.max() < 1.0
    scaled = u * 2.0**24
    assert np.array_equal(scaled, np.floor(scaled))


def test_float32_and_reference_draw_the_same_values():
    r = reference.forward("rand_uniform", {}, shape=(64, 33), seed=99)
    y = numpy_forward("rand_uniform", {}, shape=(64, 33), seed=99)
    assert y.dtype == np.float32 and np.array_equal(y.astype(np.float64), r)


def test_values_depend_only_on_seed_and_index():
    flat = reference.forward("rand_uniform", {}, shape=(60,), seed=5)
    shaped = reference.forward("rand_uniform", {}, shape=(3, 4, 5), seed=5)
    prefix = reference.forward("rand_uniform", {}, shape=(7,), seed=5)
    assert np.array_equal(shaped.reshape(-1), flat)
    assert np.array_equal(prefix, flat[:7])
    assert not np.array_equal(reference.forward("rand_uniform", {}, shape=(60,), seed=6), flat)


def test_bernoulli_extremes():
    assert not reference.forward("bernoulli_mask", {}, shape=(1000,), p=0.0, seed=1).any()
    assert reference.forward("bernoulli_mask", {}, shape=(1000,), p=1.0, seed=1).all()


def test_bernoulli_thresholds_the_uniform_stream():
    u = reference.forward("rand_uniform", {}, shape=(500,), seed=8)
    mask = reference.forward("bernoulli_mask", {}, shape=(500,), p=0.3, seed=8)
    p32 = float(np.float32(0.3))
    assert np.array_equal(mask, np.where(u < p32, 1.0, 0.0))


def test_uniform_passes_kolmogorov_smirnov():
    u = reference.forward("rand_uniform", {}, shape=(10**5,), seed=20240601)
    assert stats.kstest(u, "uniform").pvalue > 1e-3


def test_bernoulli_passes_a_binomial_test():
    mask = reference.forward("bernoulli_mask", {}, shape=(10**5,), p=0.3, seed=20240601)
    ones = int(mask.sum())
    assert stats.binomtest(ones, mask.size, 0.3).pvalue > 1e-3


@pytest.mark.parametrize("p", [1.0000001, -1e-9])
def test_bernoulli_refuses_p_outside_unit_interval(p):
    with pytest.raises(ParamError, match=r"^bernoulli_mask: p: must be in \[0, 1\]"):
        reference.forward("bernoulli_mask", {}, shape=(3,), p=p, seed=1)
