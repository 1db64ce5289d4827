"""The view family against numpy's own ops, bit for bit, plus what the generic contract tests
cannot see: no copy for reshape, NaN payloads and −0 carried through, rank 0, the messages."""

import family_checks as fc
import numpy as np
import pytest

from capsule_core.catalog import reference
from capsule_core.catalog.cpu_providers import NUMPY_F32
from capsule_core.errors import ParamError, ShapeError
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng

OPS = ("reshape", "permute", "broadcast", "concat", "slice")

PAYLOADS = np.array(
    [0x7FC00001, 0xFFC12345, 0x7FBFFFFF, 0x80000000, 0x00000001, 0x7F800000, 0x3F800000], dtype=np.uint32
).view(np.float32)
"""Quiet and signalling NaNs with payloads, −0, the smallest subnormal, +inf, 1."""


def _independent(op: str, inputs: dict, params: dict):
    """numpy's own op, run in the inputs' dtype."""
    if op == "reshape":
        return np.reshape(inputs["x"], params["shape"])
    if op == "permute":
        return np.transpose(inputs["x"], params["perm"])
    if op == "broadcast":
        return np.broadcast_to(inputs["x"], params["shape"])
    if op == "concat":
        return np.concatenate(inputs["xs"], axis=params["axis"])
    if op == "slice":
        x = inputs["x"]
        return np.take(x, np.arange(params["start"], params["start"] + params["length"]), axis=params["axis"])
    raise AssertionError(op)


def _cases(op: str):
    spec = get_spec(op)
    return [
        *spec.samples("small", seeded_rng(op, "small")),
        *spec.samples("medium", seeded_rng(op, "medium")),
        *spec.edges(),
    ]


def _bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("op", OPS)
def test_forward_is_numpys_op_bit_for_bit(op):
    for sample in _cases(op):
        y32 = NUMPY_F32.forward(op, sample.inputs, **sample.params)
        expected = _independent(op, sample.inputs, sample.params)
        assert y32.shape == expected.shape, sample.summary()
        assert np.array_equal(_bits(y32), _bits(expected)), sample.summary()
        r = reference.forward(op, sample.inputs, **sample.params)
        assert np.array_equal(r, expected.astype(np.float64), equal_nan=True), sample.summary()


def _one_hot_vjp(op: str, inputs: dict, params: dict, g: np.ndarray):
    """The VJP as Jᵀg with J built explicitly: forward applied to the identity's columns."""
    leaves = list(inputs["xs"]) if op == "concat" else [inputs["x"]]
    sizes = [a.size for a in leaves]
    eye = np.eye(sum(sizes))
    columns = []
    for k in range(sum(sizes)):
        parts = np.split(eye[k], np.cumsum(sizes)[:-1])
        shaped = [p.reshape(a.shape) for p, a in zip(parts, leaves)]
        probe = {"xs": tuple(shaped)} if op == "concat" else {"x": shaped[0]}
        columns.append(np.ravel(_independent(op, probe, params)))
    flat = np.stack(columns) @ np.ravel(g.astype(np.float64))
    grads = [p.reshape(a.shape) for p, a in zip(np.split(flat, np.cumsum(sizes)[:-1]), leaves)]
    return tuple(grads) if op == "concat" else grads[0]


@pytest.mark.parametrize("op", OPS)
def test_vjp_is_the_transposed_jacobian(op):
    spec = get_spec(op)
    for sample in spec.samples("small", seeded_rng(op, "small")):
        y = reference.forward(op, sample.inputs, **sample.params)
        g = seeded_rng(op, f"test-g/{sample.case}").standard_normal(y.shape)
        got = reference.vjp(op, sample.inputs, g, **sample.params)
        name = spec.differentiable[0]
        want = _one_hot_vjp(op, sample.inputs, sample.params, g)
        pairs = zip(got[name], want) if op == "concat" else [(got[name], want)]
        for a, b in pairs:
            np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14, err_msg=sample.summary())


@pytest.mark.parametrize(
    "op, inputs, params",
    [
        ("reshape", {"x": PAYLOADS}, {"shape": (7, 1)}),
        ("permute", {"x": PAYLOADS.reshape(7, 1)}, {"perm": (1, 0)}),
        ("broadcast", {"x": PAYLOADS}, {"shape": (3, 7)}),
        ("concat", {"xs": (PAYLOADS, PAYLOADS[::-1].copy())}, {"axis": 0}),
        ("slice", {"x": PAYLOADS}, {"axis": 0, "start": 0, "length": 7}),
    ],
)
def test_views_copy_bits_nan_payloads_and_negative_zero_included(op, inputs, params):
    y = NUMPY_F32.forward(op, inputs, **params)
    assert np.array_equal(_bits(y), _bits(_independent(op, inputs, params)))
    assert (_bits(y) == 0x80000000).any(), "-0 must survive"
    assert (_bits(y) == 0xFFC12345).any(), "a NaN payload must survive"


def test_reference_keeps_quiet_nan_payloads_and_negative_zero():
    quiet = np.array([0x7FC00001, 0xFFC12345, 0x80000000], dtype=np.uint32).view(np.float32)
    r = reference.forward("permute", {"x": quiet.reshape(3, 1)}, perm=(1, 0))
    assert np.array_equal(_bits(r.astype(np.float32)), quiet.view(np.uint32).reshape(1, 3))


def test_reshape_shares_the_buffer_and_costs_nothing():
    x = np.arange(12, dtype=np.float32)
    y = NUMPY_F32.forward("reshape", {"x": x}, shape=(3, -1))
    assert y.shape == (3, 4) and np.shares_memory(x, y)
    cost = get_spec("reshape").cost({"x": (12,)}, {"shape": (3, -1)})
    assert (cost.bytes_read, cost.bytes_written, cost.flops) == (0, 0, 0)


def test_reshape_infers_the_free_axis():
    x = np.zeros((2, 0, 3), np.float32)
    assert reference.forward("reshape", {"x": x}, shape=(-1, 3)).shape == (0, 3)
    assert reference.forward("reshape", {"x": np.zeros((4, 6), np.float32)}, shape=(2, -1, 3)).shape == (2, 4, 3)


def test_permute_rank8_matches_transpose_and_its_vjp_inverts_it():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 1, 3, 1, 2, 3, 1, 2)).astype(np.float32)
    perm = (7, 2, 5, 0, 3, 6, 1, 4)
    y = reference.forward("permute", {"x": x}, perm=perm)
    assert np.array_equal(y, np.transpose(x, perm))
    assert np.array_equal(reference.vjp("permute", {"x": x}, y, perm=perm)["x"], x)


def test_broadcast_vjp_sums_every_copy():
    x = np.float32([[1.0], [2.0]])  # (2, 1) -> (3, 2, 4): 12 copies of each element
    g = np.arange(24, dtype=np.float32).reshape(3, 2, 4)
    dx = reference.vjp("broadcast", {"x": x}, g, shape=(3, 2, 4))["x"]
    assert np.array_equal(dx, g.sum(axis=(0, 2)).reshape(2, 1))
    assert get_spec("broadcast").vjp_error.length({"x": (2, 1)}, {"shape": (3, 2, 4)}) == 12


def test_broadcast_to_an_empty_axis_gives_zero_gradient():
    x = np.float32([[1.0, 2.0, 3.0]])
    y = reference.forward("broadcast", {"x": x}, shape=(0, 3))
    dx = reference.vjp("broadcast", {"x": x}, np.zeros((0, 3)), shape=(0, 3))["x"]
    assert y.shape == (0, 3) and np.array_equal(dx, np.zeros((1, 3)))


def test_concat_vjp_gives_each_input_its_slice():
    xs = (np.zeros((2, 1), np.float32), np.zeros((2, 0), np.float32), np.zeros((2, 2), np.float32))
    g = np.arange(6, dtype=np.float32).reshape(2, 3)
    dxs = reference.vjp("concat", {"xs": xs}, g, axis=-1)["xs"]
    assert [d.shape for d in dxs] == [(2, 1), (2, 0), (2, 2)]
    assert np.array_equal(np.concatenate(dxs, axis=1), g)


def test_slice_vjp_places_g_in_zeros():
    x = np.ones((2, 5), np.float32)
    g = np.float32([[1.0, 2.0], [3.0, 4.0]])
    dx = reference.vjp("slice", {"x": x}, g, axis=1, start=3, length=2)["x"]
    assert np.array_equal(dx, np.pad(g, ((0, 0), (3, 0))))


def test_rank0_semantics_in_the_spec_functions():
    """Rank 0 straight through the OpSpec callables."""
    x = np.array(-2.5)
    reshape, permute, broadcast = get_spec("reshape"), get_spec("permute"), get_spec("broadcast")
    assert reshape.shape({"x": ()}, {"shape": (1, 1)}) == (1, 1)
    assert reshape.forward({"x": x}, {"shape": (1, 1)}).shape == (1, 1)
    assert reshape.vjp({"x": x}, {"shape": (1, 1)}, None, np.array([[3.0]]))["x"].shape == ()
    assert permute.shape({"x": ()}, {"perm": ()}) == ()
    assert permute.forward({"x": x}, {"perm": ()}).shape == ()
    assert permute.vjp({"x": x}, {"perm": ()}, None, np.array(1.5))["x"].shape == ()
    assert broadcast.shape({"x": ()}, {"shape": ()}) == ()
    assert broadcast.vjp({"x": x}, {"shape": (2, 3)}, None, np.ones((2, 3)))["x"] == 6.0


def test_rank0_through_the_provider():
    assert reference.forward("permute", {"x": np.float32(2.0)}, perm=()).shape == ()
    assert reference.forward("broadcast", {"x": np.float32(2.0)}, shape=()).shape == ()
    assert reference.vjp("reshape", {"x": np.float32(2.0)}, np.float32([[3.0]]), shape=(1, 1))["x"].shape == ()


@pytest.mark.parametrize(
    "call, message",
    [
        (
            ("reshape", {"x": np.zeros((3, 4))}, {"shape": (5, 2)}, ParamError),
            "reshape: shape: must hold the 12 elements of x (3, 4), got (5, 2) (10 elements)",
        ),
        (
            ("reshape", {"x": np.zeros((3, 4))}, {"shape": (-1, -1)}, ParamError),
            "reshape: shape: at most one -1 is allowed",
        ),
        (
            ("permute", {"x": np.zeros((2, 3, 4))}, {"perm": (0, 2, 2)}, ParamError),
            "permute: perm: must be a permutation of range(3)",
        ),
        (
            ("permute", {"x": np.zeros((2, 3))}, {"perm": (0, 1, 2)}, ParamError),
            "permute: perm: must have one entry per axis of x (rank 2)",
        ),
        (
            ("broadcast", {"x": np.zeros((3, 4))}, {"shape": (3, 5)}, ShapeError),
            "broadcast: shape: axis 1 of size 5 cannot take axis 1 of x (3, 4)",
        ),
        (("broadcast", {"x": np.zeros((3, 4))}, {"shape": (4,)}, ParamError), "broadcast: shape: must have rank >="),
        (
            ("concat", {"xs": (np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((3, 4)))}, {"axis": 1}, ShapeError),
            "concat: xs[2]: must match xs[0] (2, 3) on every axis but 1, got shape (3, 4)",
        ),
        (("concat", {"xs": []}, {"axis": 0}, ShapeError), "concat: xs: must be a non-empty list"),
        (
            ("slice", {"x": np.zeros((4, 6))}, {"axis": 1, "start": 4, "length": 3}, ParamError),
            "slice: length: start + length must be <= 6 (the size of axis 1 of x), got 4 + 3",
        ),
        (
            ("slice", {"x": np.zeros((4, 6))}, {"axis": -3, "start": 0, "length": 1}, ParamError),
            "slice: axis: must be in [-2, 2) for rank 2, got -3",
        ),
    ],
)
def test_error_messages_name_argument_and_rule(call, message):
    """call: (op, inputs, params, the error they raise)."""
    assert fc.refusal(*call).startswith(message)
