"""`capsules bench --suite`: the suites' cases are valid workloads of their ops (checked from shapes
alone, nothing of their size allocated), the engine times them forward and backward, the numpy
backend skips what its CPU cannot do in reasonable time, and the JSON, CSV and table say which
case each row is. Nothing is timed for its speed: kernels are the toy devices of test_bench."""

import csv
import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from capsule_core.bench import baselines
from capsule_core.bench import engine as bench
from capsule_core.bench import suites as bench_suites
from capsule_core.bench.suites import REFERENCE, SUITES, Suite, SuiteCase
from capsule_core.catalog.registry import lookup
from capsule_core.kernels.launch import plan_functions, plan_problems
from capsule_core.ops import get_spec
from capsule_core.ops.base import check_input_names, normalize_params, shapes_of
from capsule_core.render import report
from cli.app import app
from tests.test_bench import Stream, ToyDevice, ToyLibrary, fake_cuda, forever  # noqa: F401 (a fixture)

runner = CliRunner()
RULE = ("--max-time", "0.02", "--warmup", "1", "--min-samples", "3")


# -- the suites as data ------------------------------------------------------------------------


@pytest.mark.parametrize("case", REFERENCE.cases, ids=lambda c: c.name)
def test_reference_cases_are_valid_inputs_of_their_ops_and_legal_plans(case):
    spec = get_spec(case.op)
    sample = case.stand_in()
    floats = [
        a
        for t in spec.inputs
        if t.dtype == "float32"
        for a in (sample.inputs[t.name] if t.variadic else (sample.inputs[t.name],))
    ]
    assert all(a.strides == (0,) * a.ndim for a in floats)  # views of one zero: nothing of the case's size
    check_input_names(spec, sample.inputs)
    params = normalize_params(spec, sample.params)
    spec.shape(shapes_of(sample.inputs), params)  # the shape rule: raises an InputError on a bad case
    if spec.check_values is not None:
        spec.check_values(sample.inputs, params)
    capsule = lookup(f"native_cuda.{case.op}")
    plans = plan_functions(capsule)
    assert plans is not None, f"{case.op} has no launch plan"
    if case.direction == "bwd":
        assert spec.has_vjp and plans[1] is not None
    plan = plans[0 if case.direction == "fwd" else 1](sample.inputs, params)
    assert plan.launches and plan_problems(plan, {r.symbol: r for r in capsule.symbols}, "sm_90") == []


def test_reference_suite_holds_the_issues_shapes_once_each():
    by_name = {c.name: c for c in REFERENCE.cases}
    assert len(by_name) == len(REFERENCE.cases) and SUITES["reference"] is REFERENCE
    shapes = {(c.op, c.direction, tuple(sorted((k, v) for k, v in c.shapes.items()))) for c in REFERENCE.cases}
    for op, direction, inputs in [
        ("relu", "fwd", {"x": (2**28,)}),
        ("reduce_sum", "fwd", {"x": (2**28,)}),
        ("softmax", "fwd", {"x": (32, 65536)}),
        ("softmax", "fwd", {"x": (4096, 4096)}),
        ("layer_norm", "fwd", {"x": (4096, 8192), "gamma": (8192,), "beta": (8192,)}),
        ("layer_norm", "bwd", {"x": (4096, 8192), "gamma": (8192,), "beta": (8192,)}),
        ("matmul", "fwd", {"a": (4096, 4096), "b": (4096, 4096)}),
        ("linear", "fwd", {"x": (8, 4096), "w": (4096, 4096), "b": (4096,)}),
        ("conv", "fwd", {"x": (32, 64, 224, 224), "w": (64, 64, 3, 3), "b": (64,)}),
        ("fft_fno", "fwd", {"x": (20, 4096, 64), "w_re": (16, 64, 64), "w_im": (16, 64, 64)}),
    ]:
        assert (op, direction, tuple(sorted(inputs.items()))) in shapes, (op, direction, inputs)
    pools = {(c.direction, c.params["kernel"], c.params.get("stride")) for c in REFERENCE.cases if c.op == "max_pool"}
    assert pools == {("fwd", 2, None), ("bwd", 3, 2)}
    assert {c.op for c in REFERENCE.cases} >= {"batch_norm", "selective_scan", "permute", "concat"}
    assert by_name["softmax 32x65536 fwd"].case == "32x65536 fwd"


def test_samples_are_seeded_bounded_and_shaped_like_the_case():
    case = SuiteCase("concat", "2x 3x4", {"xs": ((3, 4), (3, 4))}, {"axis": 1})
    first, again, other = case.sample(0), case.sample(0), case.sample(1)
    assert isinstance(first.inputs["xs"], tuple) and [a.shape for a in first.inputs["xs"]] == [(3, 4), (3, 4)]
    assert all(np.array_equal(a, b) for a, b in zip(first.inputs["xs"], again.inputs["xs"]))
    assert not np.array_equal(first.inputs["xs"][0], other.inputs["xs"][0])
    values = np.concatenate([a.ravel() for a in first.inputs["xs"]])
    assert values.dtype == np.float32 and values.min() >= -1 and values.max() < 1
    assert first.case == "2x 3x4 fwd" and first.params == {"axis": 1}
    gather = SuiteCase("gather", "4x5", {"x": (4, 5), "index": (3,)}, {"axis": 0}).sample(0)
    assert gather.inputs["index"].dtype == np.int64 and not gather.inputs["index"].any()  # zeros: valid indices


def test_a_case_refuses_an_unknown_direction():
    with pytest.raises(ValueError, match="direction must be one of"):
        SuiteCase("relu", "4", {"x": (4,)}, direction="sideways")


# -- the engine ----------------------------------------------------------------------------------

SMALL = Suite(
    "small",
    (  # the reference suite's ops, directions and parameters at sizes a test can run
        SuiteCase("relu", "1000", {"x": (1000,)}),
        SuiteCase("softmax", "4x64", {"x": (4, 64)}),
        SuiteCase("layer_norm", "4x32", {"x": (4, 32), "gamma": (32,), "beta": (32,)}),
        SuiteCase("layer_norm", "4x32", {"x": (4, 32), "gamma": (32,), "beta": (32,)}, direction="bwd"),
        SuiteCase("reduce_sum", "1000", {"x": (1000,)}),
        SuiteCase("matmul", "16^3", {"a": (16, 16), "b": (16, 16)}),
        SuiteCase("linear", "2x16 w8x16", {"x": (2, 16), "w": (8, 16), "b": (8,)}),
        SuiteCase(
            "conv", "2x3x8x8 w4x3x3x3", {"x": (2, 3, 8, 8), "w": (4, 3, 3, 3), "b": (4,)}, {"stride": 1, "padding": 1}
        ),
        SuiteCase("batch_norm", "2x3x4x4", {"x": (2, 3, 4, 4), "gamma": (3,), "beta": (3,)}),
        SuiteCase("max_pool", "2x2 1x2x8x8", {"x": (1, 2, 8, 8)}, {"kernel": 2}),
        SuiteCase("max_pool", "3x3s2 1x2x9x9", {"x": (1, 2, 9, 9)}, {"kernel": 3, "stride": 2, "padding": 1}, "bwd"),
        SuiteCase("fft_fno", "B2 G16 C4 M3", {"x": (2, 16, 4), "w_re": (3, 4, 4), "w_im": (3, 4, 4)}),
        SuiteCase("selective_scan", "B2 T16 D3", {"x": (2, 16, 3), "a": (2, 16, 3), "b": (2, 16, 3), "h0": (2, 3)}),
        SuiteCase("permute", "8x6 transpose", {"x": (8, 6)}, {"perm": (1, 0)}),
        SuiteCase("concat", "2x 3x4 axis 1", {"xs": ((3, 4), (3, 4))}, {"axis": 1}),
    ),
)


class CallOnceDevice(ToyDevice):
    """The numpy device's real forward or VJP, called once per case (so each op runs at the case's
    shapes and direction), then timed as a constant: fast and deterministic."""

    def __init__(self, suite_limit=None):
        super().__init__()
        self.suite_limit = suite_limit
        self.calls = []

    def kernel_target(self, spec, arrays, params, cotangent=None, capsule=None):
        bench.NumpyDevice.kernel_target(self, spec, arrays, params, cotangent).fn()
        self.calls.append((spec.name, "fwd" if cotangent is None else "bwd"))
        return Stream(forever([1e-4]))


class GradLibrary(ToyLibrary):
    """A numpy 'library' that differentiates layer_norm (the one backward case of SMALL with a
    numpy twin) through the OpSpec's own VJP, scaled by 1 + `error`: the engine's backward baseline
    path without PyTorch."""

    differentiates = True

    def __init__(self, error=0.0):
        self.error = error

    def backward_call(self, twin, arrays, params, cotangent, names):
        from capsule_core.catalog.cpu_providers import NUMPY_F32

        def call():
            grads = NUMPY_F32.vjp("layer_norm", arrays, cotangent, **params)
            return tuple(grads[name] * (1 + self.error) for name in names)

        return call


def suite_run(suite=SMALL, device=None, library=None):
    settings = bench.Settings(
        bench.parse_size("small"), rule=bench.StoppingRule(min_samples=3, warmup_ms=0.1), baselines=("torch", "numpy")
    )
    return bench.run_suite(
        suite,
        device or CallOnceDevice(),
        settings,
        "toy backend",
        libraries={"numpy": library or ToyLibrary(), "torch": baselines.TorchLibrary("cpu")},
    )


def test_a_suite_runs_every_case_at_its_shapes_and_in_its_direction():
    device = CallOnceDevice()
    result = suite_run(device=device)
    assert result.exit_code == 0 and result.settings.suite == "small" and result.target_bytes is None
    assert [(c.op, c.case) for c in result.cases] == [(c.op, c.case) for c in SMALL.cases]
    assert device.calls == [(c.op, c.direction) for c in SMALL.cases]
    for case, timed in zip(SMALL.cases, result.cases):
        assert timed.status is bench.CaseStatus.OK, (case.name, timed.reason)
        assert timed.direction == case.direction and timed.resized == ""
        assert timed.shapes == {k: [list(s) for s in v] if k == "xs" else list(v) for k, v in case.shapes.items()}
    bwd = next(c for c in result.cases if c.op == "layer_norm" and c.direction == "bwd")
    assert (bwd.cost.bytes_read, bwd.cost.bytes_written, bwd.cost.flops) == (4 * (128 + 64 + 128), 4 * (128 + 64), 0)
    assert bwd.throughput.gflops is None and bwd.throughput.intensity is None
    assert bwd.throughput.bound == "memory" and bwd.throughput.peak_pct == pytest.approx(
        100 * bwd.cost.bytes / 1e-4 / 1e12
    )  # its traffic over the toy copy peak of 1 TB/s
    numpy = next(b for b in bwd.baselines if b.name == "numpy")
    assert numpy.status is bench.BaselineStatus.EXCLUDED and "no backward twin" in numpy.reason
    fwd = next(c for c in result.cases if c.op == "layer_norm" and c.direction == "fwd")
    assert next(b for b in fwd.baselines if b.name == "numpy").ratio == pytest.approx(2.0)


def numpy_baseline(result, op, direction):
    case = next(c for c in result.cases if c.op == op and c.direction == direction)
    return next(b for b in case.baselines if b.name == "numpy")


def test_backward_baselines_are_checked_against_the_vjp_then_timed():
    right = suite_run(library=GradLibrary())
    assert numpy_baseline(right, "layer_norm", "bwd").status is bench.BaselineStatus.OK
    assert numpy_baseline(right, "layer_norm", "bwd").ratio == pytest.approx(2.0)
    assert numpy_baseline(right, "max_pool", "bwd").reason == baselines.exclusion("max_pool", "numpy")
    wrong = numpy_baseline(suite_run(library=GradLibrary(error=0.01)), "layer_norm", "bwd")
    assert wrong.status is bench.BaselineStatus.EXCLUDED and "relative error 0.01" in wrong.reason


def test_the_numpy_backend_skips_reference_cases_beyond_its_limit_without_making_them():
    device = CallOnceDevice(suite_limit=17 << 20)  # room for softmax 32x65536 (16 MiB) alone
    result = suite_run(REFERENCE, device)
    assert device.calls == [("softmax", "fwd")]
    ok = [c for c in result.cases if c.status is bench.CaseStatus.OK]
    assert [(c.op, c.case) for c in ok] == [("softmax", "32x65536 fwd")]
    skipped = {f"{c.op} {c.case}": c.reason for c in result.cases if c.status is bench.CaseStatus.SKIPPED}
    assert len(skipped) == len(REFERENCE.cases) - 1
    assert skipped["relu 2^28 fwd"].startswith(
        "working set 2048 MiB (inputs, output) is beyond the numpy backend's 17 MiB"
    )
    assert "(inputs, output, cotangent, gradients)" in skipped["layer_norm 4096x8192 bwd"]
    assert bench.NumpyDevice.suite_limit == bench.NUMPY_SUITE_LIMIT and bench.CudaDevice.suite_limit is None


def test_a_device_without_a_backward_plan_skips_the_backward_cases():
    class ForwardOnly(CallOnceDevice):
        def unavailable(self, spec, direction="fwd", capsule=None):
            return "no backward launch plan" if direction == "bwd" else None

    result = suite_run(device=ForwardOnly())
    for c in result.cases:
        assert (c.status is bench.CaseStatus.SKIPPED) == (c.direction == "bwd")
    assert {c.reason for c in result.cases if c.direction == "bwd"} == {"no backward launch plan"}


def test_working_set_and_backward_cost():
    spec = get_spec("layer_norm")
    shapes, params = {"x": (4, 32), "gamma": (32,), "beta": (32,)}, normalize_params(get_spec("layer_norm"), {})
    assert bench.working_set(spec, shapes, params, "fwd") == 4 * (128 + 64 + 128)
    assert bench.working_set(spec, shapes, params, "bwd") == bench.backward_cost(spec, shapes, params).bytes
    concat = get_spec("concat")
    cost = bench.backward_cost(concat, {"xs": ((3, 4), (3, 2))}, {"axis": 1})
    assert (cost.bytes_read, cost.bytes_written) == (4 * (12 + 6 + 18), 4 * 18)


# -- the outputs ---------------------------------------------------------------------------------


def test_json_csv_and_table_name_the_suite_case():
    result = suite_run()
    doc = json.loads(json.dumps(report.bench_record(result, "test"), allow_nan=False))
    assert doc["settings"]["suite"] == "small" and doc["settings"]["size"] == "suite"
    assert doc["settings"]["target_bytes"] is None
    bwd = next(c for c in doc["cases"] if c["op"] == "layer_norm" and c["direction"] == "bwd")
    assert bwd["case"] == "4x32 bwd" and bwd["cost"]["flops"] is None and bwd["cost"]["intensity"] is None
    assert bwd["gflops"] is None and bwd["intensity"] is None and bwd["bound"] == "memory" and bwd["peak_pct"] > 0
    fwd = next(c for c in doc["cases"] if c["op"] == "softmax")
    assert fwd["direction"] == "fwd" and fwd["cost"]["flops"] > 0 and fwd["gflops"] > 0
    rows = list(csv.DictReader(io.StringIO(report.bench_csv(result))))
    row = next(r for r in rows if r["op"] == "layer_norm" and r["direction"] == "bwd")
    assert row["case"] == "4x32 bwd" and row["flops"] == "" and row["gflops"] == "" and float(row["gbps"]) > 0
    table = report.render_bench(result)
    assert "suite small: fixed shapes, never resized" in table
    line = next(t for t in table.splitlines() if t.startswith("layer_norm") and "4x32 bwd" in t)
    assert "x(4,32) gamma(32) beta(32)" in line and "memory" in line


def test_compare_matches_suite_cases_across_runs():
    old = json.loads(json.dumps(report.bench_record(suite_run(), "test")))
    comparison = bench.compare(old, suite_run(), 0.05, "old.json")
    assert {ch.status for ch in comparison.changes} == {bench.ChangeStatus.UNCHANGED}
    assert len(comparison.changes) == len(SMALL.cases)


# -- the command ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, code, message",
    [
        (("--suite", "reference", "relu"), 2, "--suite: cannot be combined with NAME"),
        (("--suite", "reference", "--all"), 2, "--suite: cannot be combined with --all"),
        (("--suite", "reference", "--size", "small"), 2, "--suite: cannot be combined with --size"),
        (("--suite", "reference", "relu", "--all", "--size", "auto"), 2, "cannot be combined with NAME, --all, --size"),
        (("--suite", "nope"), 2, "--suite: unknown suite 'nope' (suites: reference)"),
        (("--suite", "reference", "--backend", "emu"), 3, "--backend emu"),
    ],
)
def test_cli_suite_usage_errors(args, code, message):
    result = runner.invoke(app, ["bench", *args])
    assert result.exit_code == code and message in result.stderr, result.output
    assert "Traceback" not in result.output


def test_cli_reference_suite_on_numpy(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.NumpyDevice, "suite_limit", 17 << 20)  # softmax 32x65536 alone: a quick run
    out = tmp_path / "suite.json"
    result = runner.invoke(
        app, ["bench", "--suite", "reference", "--backend", "numpy", *RULE, "--baseline", "numpy", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(t.startswith("softmax") and "32x65536 fwd" in t and "x(32,65536)" in t for t in lines)
    assert any(t.startswith("layer_norm") and "4096x8192 bwd" in t and "SKIPPED" in t for t in lines)
    assert f"1 timed, {len(REFERENCE.cases) - 1} skipped, 0 errors" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["settings"]["suite"] == "reference"
    assert [f"{c['op']} {c['case']}" for c in doc["cases"]] == [c.name for c in REFERENCE.cases]


def test_the_help_names_every_suite():
    result = runner.invoke(app, ["bench", "--help"], terminal_width=200)
    assert "--suite" in result.stdout and all(name in result.stdout for name in bench_suites.SUITES)


# -- the cuda path against test_bench's simulated driver ---------------------------------------------


def test_cuda_backward_cases_launch_the_backward_plans(fake_cuda):  # noqa: F811 (the fixture imported above)
    drv, backend = fake_cuda
    device = bench.device_for(backend)
    assert device.suite_limit is None
    suite = Suite(
        "bwd",
        (  # backward plans, one of which reads the forward's y
            SuiteCase("layer_norm", "4x32", {"x": (4, 32), "gamma": (32,), "beta": (32,)}, direction="bwd"),
            SuiteCase(
                "selective_scan", "B2 T16 D3", {"x": (2, 16, 3), "a": (3,), "b": (3,), "h0": (2, 3)}, direction="bwd"
            ),
            SuiteCase("softmax", "4x64", {"x": (4, 64)}),
        ),
    )
    settings = bench.Settings(
        bench.parse_size("small"), rule=bench.StoppingRule(min_samples=3, warmup_ms=0.0), baselines=()
    )
    result = bench.run_suite(suite, device, settings, "fake")
    assert result.exit_code == 0, [c.reason for c in result.cases]
    assert [(c.op, c.direction, c.status) for c in result.cases] == [
        ("layer_norm", "bwd", bench.CaseStatus.OK),
        ("selective_scan", "bwd", bench.CaseStatus.OK),
        ("softmax", "fwd", bench.CaseStatus.OK),
    ]
    for case in suite.cases:
        sample = case.stand_in()
        plans = plan_functions(lookup(f"native_cuda.{case.op}"))
        plan = plans[0 if case.direction == "fwd" else 1](sample.inputs, normalize_params(get_spec(case.op), {}))
        assert {launch.symbol for launch in plan.launches} <= set(drv.launched), case.name
    # the scan's backward reads y: made on the host, never by a forward launch
    assert not any(symbol.startswith("capsule_selective_scan_fwd") for symbol in drv.launched)
    device.release()
