"""reduction.order and where the error model ends (design §4).

reduction.order runs each reduction op's order inputs (OpSpec.order_inputs: 2²⁴, 1, …, 1, −2²⁴
along the accumulation axis, in several orders): a fixed-left capsule must be bitwise the
float32 left fold, an implementation-defined one within the order-free worst-case bound. Both
must be able to fail, and the honest numpy provider must pass. Elements whose float32
intermediates overflow are out of model: counted, never compared, by verify as by fuzz.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from mutants import MutantBackend, forward_is

from capsule_core.backends.numpy_f32 import NumpyBackend
from capsule_core.catalog import native_cuda, registry
from capsule_core.model import NumericalPolicy, ReductionPolicy
from capsule_core.ops import get_spec
from capsule_core.ops.base import ORDER_LENGTH, Sample, order_terms
from capsule_core.ops.conv_pool import WINDOW_ORDER_LENGTH
from capsule_core.render import report
from capsule_core.verify import engine
from capsule_core.verify.engine import Status, VerifyReport, verify_capsule
from capsule_core.verify.numerics import Float32Run, compare, out_of_model

ORDER = ("reduction.order",)


def order_result(capsule, backend):
    return verify_capsule(capsule, backend, quick=True, checks=ORDER).results[0]


def declared_fixed_left(op: str):
    """The native capsule of `op`, declared fixed-left (no native capsule is today)."""
    return dataclasses.replace(registry.lookup(op), numerical_policy=NumericalPolicy(ReductionPolicy.FIXED_LEFT))


def _axis_terms(a, p):
    x, axis = a["x"], p["axis"]
    return x.reshape(-1) if axis is None else np.moveaxis(x, axis % x.ndim, -1)


def _reversed_left_fold(f, a, p):
    """A sequential float32 fold from the last term to the first."""
    terms = _axis_terms(a, p)[..., ::-1]
    return np.asarray(np.add.accumulate(terms, axis=-1)[..., -1]) if terms.shape[-1] else f(a, p)


def _left_fold(f, a, p):
    terms = _axis_terms(a, p)
    return np.asarray(np.add.accumulate(terms, axis=-1)[..., -1]) if terms.shape[-1] else f(a, p)


def _float16_accumulator(f, a, p):
    """The terms and the running sum in float16 (an accumulator that cannot hold 2²⁴)."""
    terms = _axis_terms(a, p).astype(np.float16)
    with np.errstate(over="ignore"):
        return np.asarray(np.sum(terms, axis=-1, dtype=np.float16), dtype=np.float32)


def _matmul_float16(f, a, p):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.matmul(a["a"].astype(np.float16), a["b"].astype(np.float16)).astype(np.float32)


# -- the order inputs ---------------------------------------------------------------------------


def test_order_terms_make_the_float32_sum_depend_on_the_order():
    terms = order_terms()
    assert set(terms) == {"descending", "ascending", "spread"}
    exact = ORDER_LENGTH - 2
    for values in terms.values():
        assert values.dtype == np.float32 and values.size == ORDER_LENGTH
        assert float(np.sum(values.astype(np.float64))) == exact
    left_fold = {name: float(np.add.accumulate(v)[-1]) for name, v in terms.items()}
    assert left_fold["descending"] == 0.0 and left_fold["ascending"] == exact
    positive = order_terms(signed=False)
    assert float(np.add.accumulate(positive["descending"])[-1]) == 2.0**24
    assert float(np.add.accumulate(positive["ascending"])[-1]) == 2.0**24 + ORDER_LENGTH - 1


@pytest.mark.parametrize("capsule", native_cuda.CAPSULES, ids=lambda c: c.op.value)
def test_the_numpy_provider_raises_no_order_alarm(capsule):
    result = order_result(capsule, NumpyBackend())
    policy = capsule.numerical_policy.reduction
    if policy is ReductionPolicy.NOT_APPLICABLE:
        assert result.status is Status.SKIPPED and result.reason == "no reduction (policy n/a)"
    elif capsule.op.value == "max_pool":
        assert result.status is Status.SKIPPED and result.reason.startswith("a selection sums nothing")
    else:
        assert result.status is Status.PASSED, result.reason
        assert result.reason.startswith("within the order-free worst-case bound on ")
        assert 0 < result.worst <= 1 and result.case.startswith("order-")
        assert result.repro.endswith("--backend numpy")


def test_every_reduction_op_has_order_inputs_along_its_accumulation_axis():
    """Each op's order inputs hold the large terms (2²⁴; 2¹² squared for mse_loss; ln 2²⁴ for the
    exponentials of the softmax family and smooth_max_pool), pass the op's runtime guard, and are
    judged with an accumulation length of at least ORDER_LENGTH (conv's window: WINDOW_ORDER_LENGTH,
    the emulator's cost): the terms lie along the sum."""
    from capsule_core.ops.base import shapes_of, validate

    ops = {
        c.op.value for c in native_cuda.CAPSULES if c.numerical_policy.reduction is not ReductionPolicy.NOT_APPLICABLE
    }
    assert get_spec("max_pool").order_inputs is None
    for op in sorted(ops - {"max_pool"}):
        spec = get_spec(op)
        samples = spec.order_inputs()
        assert samples and all(s.worst_case and s.case.startswith("order-") for s in samples), op
        for sample in samples:
            arrays, params, _ = validate(spec, sample.inputs, sample.params, np.float32)
            big = max(float(np.abs(a).max()) for a in arrays.values() if a.dtype.kind == "f")
            assert big in (2.0**24, 2.0**12, float(np.float32(np.log(2.0**24)))), (op, big)
            shortest = WINDOW_ORDER_LENGTH if (op, sample.case) == ("conv", "order-window") else ORDER_LENGTH
            assert spec.error.length(shapes_of(arrays), params) >= shortest, op


# -- fixed-left: bitwise the float32 left fold ----------------------------------------------------


def _left_fold_mean(f, a, p):
    return _left_fold(f, a, p) * (1.0 / _axis_terms(a, p).shape[-1])


@pytest.mark.parametrize("op, fold", [("reduce_sum", _left_fold), ("reduce_mean", _left_fold_mean)])
def test_fixed_left_passes_a_sequential_left_fold(op, fold):
    result = order_result(declared_fixed_left(op), MutantBackend("left-fold", spec=forward_is(fold)))
    assert result.status is Status.PASSED, result.reason
    assert result.reason.startswith("bitwise the float32 left fold on 3 order inputs")


def test_fixed_left_fails_a_provider_that_folds_from_the_other_end():
    result = order_result(
        declared_fixed_left("reduce_sum"), MutantBackend("reversed", spec=forward_is(_reversed_left_fold))
    )
    assert result.status is Status.FAILED
    assert result.reason.startswith("y against the float32 left fold order-")
    assert "not bitwise equal" in result.reason and "--check reduction.order" in result.repro


def test_fixed_left_fails_numpy_pairwise_summation():
    """numpy's np.sum adds a contiguous row pairwise: a fine implementation-defined sum, not a left fold."""
    result = order_result(declared_fixed_left("reduce_sum"), NumpyBackend())
    assert result.status is Status.FAILED and result.case == "order-rows", result.reason
    assert order_result(registry.lookup("reduce_sum"), NumpyBackend()).status is Status.PASSED


def test_fixed_left_without_a_left_fold_reference_says_so():
    result = order_result(declared_fixed_left("matmul"), NumpyBackend())
    assert result.status is Status.SKIPPED
    assert result.reason == "declared fixed-left, but matmul has no float32 left fold"


# -- implementation-defined: within the order-free worst-case bound -------------------------------


def test_implementation_defined_fails_a_float16_accumulator():
    result = order_result(registry.lookup("reduce_sum"), MutantBackend("fp16", spec=forward_is(_float16_accumulator)))
    assert result.status is Status.FAILED, result.reason
    assert "NaN where the reference is not" in result.reason and result.case.startswith("order-")  # inf − inf


def test_implementation_defined_fails_a_float16_matmul():
    result = order_result(registry.lookup("matmul"), MutantBackend("fp16", spec=forward_is(_matmul_float16)))
    assert result.status is Status.FAILED and result.case == "order-k", result.reason


def test_other_sane_orders_pass_implementation_defined():
    for fold in (_left_fold, _reversed_left_fold):
        assert (
            order_result(registry.lookup("reduce_sum"), MutantBackend("fold", spec=forward_is(fold))).status
            is Status.PASSED
        )


def test_the_rerun_line_runs_one_order_input():
    capsule = registry.lookup("reduce_sum")
    report_ = verify_capsule(capsule, NumpyBackend(), quick=True, checks=ORDER, case="order-columns")
    assert report_.results[0].status is Status.PASSED
    assert report_.results[0].reason.startswith("within the order-free worst-case bound on 1 order input ")


# -- where the model ends -------------------------------------------------------------------------

OVERFLOWING_SUM = Sample(
    {"x": np.float32([[3e38, 3e38, 0.0], [1.0, 2.0, 3.5]])}, {"axis": 1}, "edge-sum-of-two-3e38", True
)
"""Row 0 sums two 3e38 (its float32 partial sums overflow): out of model; row 1 is compared."""
OVERFLOWING_ROW = Sample(
    {
        "x": np.float32([[3e38, 1.0, 2.0, 3.0], [0.5, -1.0, 2.0, 0.25]]),
        "gamma": np.ones(4, np.float32),
        "beta": np.zeros(4, np.float32),
    },
    {},
    "edge-3e38-in-a-row",
    True,
)
"""A 3e38 in a layer_norm row: the float32 variance overflows."""


def test_out_of_model_marks_the_overflowing_sum_only():
    from capsule_core.catalog.cpu_providers import NUMPY_F32, REFERENCE

    spec = get_spec("reduce_sum")
    x = OVERFLOWING_SUM.inputs["x"]
    r, m = REFERENCE.forward(spec, {"x": x}, axis=1), REFERENCE.magnitude(spec, {"x": x}, axis=1)
    with np.errstate(over="ignore"):
        y = NUMPY_F32.forward(spec, {"x": x}, axis=1)
    run = Float32Run(y, True, m)
    outside = out_of_model(y, r, m, spec.error, 3, run)
    assert outside.tolist() == [True, False]
    garbage_in_row_0 = np.float32([np.nan, 6.5])
    assert compare(garbage_in_row_0, r, m, spec.error, 3, True, outside) == compare(
        y, r, m, spec.error, 3, True, outside
    )
    result = compare(garbage_in_row_0, r, m, spec.error, 3, True, outside)
    assert result.passed and result.out_of_model == 1
    wrong_row_1 = compare(np.float32([np.inf, 6.0]), r, m, spec.error, 3, True, outside)
    assert not wrong_row_1.passed and wrong_row_1.out_of_model == 1


def with_edges(monkeypatch, op: str, *edges):
    """verify's spec of `op` with these edges and no samples."""
    spec = dataclasses.replace(get_spec(op), samples=lambda size, rng: [], edges=lambda: list(edges))
    monkeypatch.setattr(engine, "get_spec", lambda name: spec if name == op else get_spec(name))


def test_verify_counts_out_of_model_elements_and_still_compares_the_others(monkeypatch):
    with_edges(monkeypatch, "reduce_sum", OVERFLOWING_SUM)
    capsule = registry.lookup("reduce_sum")
    honest = verify_capsule(capsule, NumpyBackend(), quick=True, checks=("value", "bounds")).results
    assert [(r.check, r.status, r.out_of_model) for r in honest] == [
        ("value", Status.PASSED, 1),
        ("bounds", Status.PASSED, 0),
    ]

    def wrong_sum_of_small_values(f, a, p):
        y = f(a, p)
        return np.where(np.isfinite(y), y + 1, y).astype(y.dtype)

    value = verify_capsule(
        capsule, MutantBackend("plus-one", spec=forward_is(wrong_sum_of_small_values)), quick=True, checks=("value",)
    ).results[0]
    assert value.status is Status.FAILED and value.reason.endswith(
        "|y-r| = 1.0 exceeds the bound 1.5497209719939437e-06 (645277.451923073 times the bound)"
    )
    assert value.out_of_model == 1


def test_a_3e38_in_a_layer_norm_row_is_out_of_model_not_a_failure(monkeypatch):
    """The float32 variance overflows and misses the bound: the whole output of that case is out
    of model (another sane variance, Welford's, fails elsewhere), the other case is compared."""
    ordinary = dataclasses.replace(get_spec("layer_norm").edges()[4], worst_case=True)
    with_edges(monkeypatch, "layer_norm", OVERFLOWING_ROW, ordinary)
    results = verify_capsule(registry.lookup("layer_norm"), NumpyBackend(), quick=True, checks=("value", "vjp")).results
    # value: both rows of the overflowing case; vjp: dgamma, whose sums over rows take in row 0
    assert [(r.status, r.out_of_model) for r in results] == [(Status.PASSED, 8), (Status.PASSED, 4)], results
    alone = verify_capsule(
        registry.lookup("layer_norm"), NumpyBackend(), quick=True, checks=("value",), case=OVERFLOWING_ROW.case
    )
    assert alone.results[0].status is Status.MISTRUSTED
    assert alone.results[0].reason == "every element was out of model: none was compared"


def test_the_report_shows_the_count(monkeypatch):
    with_edges(monkeypatch, "reduce_sum", OVERFLOWING_SUM)
    result = VerifyReport("numpy", "backend numpy", 0, True)
    result.capsules.append(verify_capsule(registry.lookup("reduce_sum"), NumpyBackend(), quick=True, checks=("value",)))
    record = report.verify_record(result)
    assert record["capsules"][0]["checks"][0]["out_of_model"] == 1
    table = report.render_verify(result)
    assert "OUT OF MODEL native_cuda.reduce_sum value: 1 elements never compared" in table
    assert "; 1 elements out of model;" in table


def test_fuzz_counts_out_of_model_by_the_same_rule():
    from capsule_core.fuzz.engine import Example, run_example

    capsule = registry.lookup("reduce_sum")
    example = Example(dict(OVERFLOWING_SUM.inputs), dict(OVERFLOWING_SUM.params))
    outcome = run_example(capsule, get_spec("reduce_sum"), NumpyBackend(), example, seed=0)
    assert outcome.valid and outcome.failure is None and outcome.out_of_model
    inside = Example({"x": np.float32([[1.0, 2.0]])}, {"axis": 1})
    assert not run_example(capsule, get_spec("reduce_sum"), NumpyBackend(), inside, seed=0).out_of_model
