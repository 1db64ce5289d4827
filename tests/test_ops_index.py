"""gather and scatter_add against independent implementations (np.take, np.add.at, a one-hot
matrix product), repeats accumulating, bits copied, and the index errors' messages."""

import family_checks as fc
import numpy as np
import pytest

from capsule_core.catalog import reference
from capsule_core.catalog.cpu_providers import NUMPY_F32
from capsule_core.errors import IndexRangeError, ParamError, ShapeError
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng


def _cases(op: str):
    spec = get_spec(op)
    return [
        *spec.samples("small", seeded_rng(op, "small")),
        *spec.samples("medium", seeded_rng(op, "medium")),
        *spec.edges(),
    ]


def _one_hot_scatter(index, src, size: int, axis: int) -> np.ndarray:
    """Σ_j src[..., j, ...]·[index[j] = i] as a matrix product: repeats add up by construction."""
    one_hot = (index[:, None] == np.arange(size)[None, :]).astype(np.float64)  # (K, size)
    moved = np.moveaxis(np.asarray(src, dtype=np.float64), axis, -1)
    return np.moveaxis(moved @ one_hot, -1, axis)


def _finite(sample) -> bool:
    return all(np.isfinite(v).all() for k, v in sample.inputs.items() if k != "index")


def test_gather_forward_is_np_take_bit_for_bit():
    for sample in _cases("gather"):
        x, index, axis = sample.inputs["x"], sample.inputs["index"], sample.params["axis"]
        y = NUMPY_F32.forward("gather", sample.inputs, axis=axis)
        assert np.array_equal(y.view(np.uint32), np.take(x, index, axis=axis).view(np.uint32)), sample.summary()
        r = reference.forward("gather", sample.inputs, axis=axis)
        assert np.array_equal(r, np.take(x, index, axis=axis).astype(np.float64), equal_nan=True)


def test_gather_vjp_is_the_one_hot_transpose():
    for sample in _cases("gather"):
        x, index, axis = sample.inputs["x"], sample.inputs["index"], sample.params["axis"]
        g = seeded_rng("gather", f"test-g/{sample.case}").standard_normal(np.take(x, index, axis=axis).shape)
        dx = reference.vjp("gather", sample.inputs, g, axis=axis)
        assert set(dx) == {"x"}
        want = _one_hot_scatter(index, g, x.shape[axis], axis % x.ndim)
        np.testing.assert_allclose(dx["x"], want, rtol=1e-12, atol=1e-12, err_msg=sample.summary())


def test_gather_vjp_accumulates_repeats():
    x = np.zeros((3, 2), np.float32)
    g = np.float32([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0], [8.0, 80.0]])
    dx = NUMPY_F32.vjp("gather", {"x": x, "index": np.array([2, 0, 2, 2])}, g, axis=0)["x"]
    assert np.array_equal(dx, np.float32([[2.0, 20.0], [0.0, 0.0], [13.0, 130.0]]))


def test_gather_copies_nan_payloads_and_negative_zero():
    x = np.array([0x7FC00001, 0x80000000, 0xFFC12345, 0x7FBFFFFF], dtype=np.uint32).view(np.float32)
    index = np.array([3, 1, 2, 0, 1])
    y = NUMPY_F32.forward("gather", {"x": x, "index": index}, axis=0)
    assert np.array_equal(y.view(np.uint32), x.view(np.uint32)[index])


def test_gather_empty_index_and_empty_axis():
    y = reference.forward("gather", {"x": np.ones((3, 4), np.float32), "index": np.zeros(0, np.int64)}, axis=1)
    assert y.shape == (3, 0)
    y = reference.forward("gather", {"x": np.zeros((0, 4), np.float32), "index": np.zeros(0, np.int64)}, axis=0)
    assert y.shape == (0, 4)


def test_scatter_add_forward_matches_np_add_at_and_one_hot():
    for sample in _cases("scatter_add"):
        base, index, src = (sample.inputs[k] for k in ("base", "index", "src"))
        axis = sample.params["axis"] % base.ndim
        r = reference.forward("scatter_add", sample.inputs, axis=sample.params["axis"])
        with np.errstate(invalid="ignore"):
            at = base.astype(np.float64)
            np.add.at(np.moveaxis(at, axis, 0), index, np.moveaxis(src.astype(np.float64), axis, 0))
        assert np.array_equal(r, at, equal_nan=True), sample.summary()
        if _finite(sample):
            want = base + _one_hot_scatter(index, src, base.shape[axis], axis)
            np.testing.assert_allclose(r, want, rtol=1e-12, atol=1e-12, err_msg=sample.summary())


def test_scatter_add_accumulates_repeats_exactly():
    base = np.float32([0.5, 0.0, -1.0])
    src = np.float32([1.0, 2.0, 4.0, 8.0])
    y = NUMPY_F32.forward("scatter_add", {"base": base, "index": np.array([2, 2, 0, 2]), "src": src}, axis=0)
    assert np.array_equal(y, np.float32([4.5, 0.0, 10.0]))


def test_scatter_add_keeps_untouched_base_bits():
    base = np.array([0x80000000, 0x7FC00001, 0x3F800000], dtype=np.uint32).view(np.float32)
    y = NUMPY_F32.forward("scatter_add", {"base": base, "index": np.array([2]), "src": np.float32([1.0])}, axis=0)
    assert y.view(np.uint32)[0] == 0x80000000 and y.view(np.uint32)[1] == 0x7FC00001 and y[2] == 2.0


def test_scatter_add_vjp_copies_g_to_base_and_gathers_it_for_src():
    rng = np.random.default_rng(3)
    base, src = np.zeros((3, 5), np.float32), np.zeros((3, 4), np.float32)
    index = np.array([4, 0, 4, 1])
    g = rng.standard_normal((3, 5)).astype(np.float32)
    grads = NUMPY_F32.vjp("scatter_add", {"base": base, "index": index, "src": src}, g, axis=-1)
    assert set(grads) == {"base", "src"}
    assert np.array_equal(grads["base"], g)
    assert np.array_equal(grads["src"], np.take(g, index, axis=1))


def test_scatter_add_error_model_covers_every_repeat_count():
    spec = get_spec("scatter_add")
    for sample in _cases("scatter_add"):
        index = sample.inputs["index"]
        largest_repeat = int(np.bincount(index).max()) if index.size else 0
        shapes = {k: np.shape(v) for k, v in sample.inputs.items()}
        assert spec.error.length(shapes, sample.params) >= largest_repeat + 1


X = np.zeros((4, 5), np.float32)
SRC = np.zeros((4, 2), np.float32)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            ("gather", {"x": X, "index": np.array([0, 4, 5, 9])}, {"axis": 1}, IndexRangeError),
            "gather: index: entries must be in [0, 5) (the size of axis 1 of x), got index[2] = 5",
        ),
        (
            ("gather", {"x": X, "index": np.array([3, -1])}, {"axis": 0}, IndexRangeError),
            "gather: index: entries must be in [0, 4) (the size of axis 0 of x), got index[1] = -1",
        ),
        (
            ("gather", {"x": X, "index": np.zeros((2, 1), np.int64)}, {"axis": 0}, ShapeError),
            "gather: index: must have rank 1",
        ),
        (
            ("gather", {"x": X, "index": np.float32([1.0])}, {"axis": 0}, ShapeError),
            "gather: index: must be an integer array",
        ),
        (("gather", {"x": X, "index": np.array([0])}, {"axis": 2}, ParamError), "gather: axis: must be in [-2, 2)"),
        (
            ("scatter_add", {"base": X, "index": np.array([0, 5]), "src": SRC}, {"axis": 1}, IndexRangeError),
            "scatter_add: index: entries must be in [0, 5) (the size of axis 1 of base), got index[1] = 5",
        ),
        (
            ("scatter_add", {"base": X, "index": np.array([-2, 0]), "src": SRC}, {"axis": -1}, IndexRangeError),
            "scatter_add: index: entries must be in [0, 5) (the size of axis 1 of base), got index[0] = -2",
        ),
        (
            (
                "scatter_add",
                {"base": X, "index": np.array([0, 1]), "src": np.zeros((2, 5), np.float32)},
                {"axis": 1},
                ShapeError,
            ),
            "scatter_add: src: must have the shape of base (4, 5) with axis 1 replaced by len(index): (4, 2), got (2, 5)",
        ),
        (
            ("scatter_add", {"base": X, "index": np.array([[0, 1]]), "src": SRC}, {"axis": 1}, ShapeError),
            "scatter_add: index: must have rank 1",
        ),
    ],
)
def test_error_messages_name_argument_and_rule(call, message):
    """call: (op, inputs, params, the error they raise)."""
    assert fc.refusal(*call).startswith(message)
