"""`capsules bench`: statistics, stopping rule, cost models, resizing, baselines table, comparison,
output formats, out-of-memory handling, the cuda timing path (against a simulated driver) and the
CLI. No test times anything for its own sake: speed figures come only from the bench command."""

import csv
import io
import json
import math
import types

import numpy as np
import pytest
from typer.testing import CliRunner

from capsule_core.backends.device import DeviceBackend
from capsule_core.bench import baselines
from capsule_core.bench import engine as bench
from capsule_core.catalog import registry
from capsule_core.errors import EnvironmentMissing
from capsule_core.kernels.c_types import C_TYPES
from capsule_core.kernels.launch import parse_param
from capsule_core.ops import all_specs, get_spec
from capsule_core.ops.base import Cost, normalize_params, seeded_rng, shapes_of, validate
from capsule_core.render import report
from cli.app import app

runner = CliRunner()
FAST = ("--size", "small", "--max-time", "0.02", "--warmup", "1", "--min-samples", "3")


# -- statistics ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [[5.0], [3.0, 1.0], [1.0, 2.0, 3.0, 4.0], list(np.random.default_rng(1).random(101))]
)
def test_summary_matches_numpys_linear_percentiles(values):
    s = bench.summarize(values)
    assert s.n == len(values)
    assert s.median == pytest.approx(np.percentile(values, 50))
    assert s.q1 == pytest.approx(np.percentile(values, 25))
    assert s.q3 == pytest.approx(np.percentile(values, 75))
    assert (s.min, s.max) == (min(values), max(values))
    assert s.iqr == pytest.approx(s.q3 - s.q1) and s.rel_iqr == pytest.approx(s.iqr / s.median)


def test_summary_by_hand():
    s = bench.summarize([10.0, 12.0, 11.0, 13.0, 30.0])
    assert (s.median, s.q1, s.q3, s.iqr) == (12.0, 11.0, 13.0, 2.0)
    assert s.rel_iqr == pytest.approx(2 / 12)
    assert bench.summarize([]).n == 0 and math.isnan(bench.summarize([]).median)
    assert bench.summarize([0.0, 0.0]).rel_iqr == 0.0


class Stream:
    """A synthetic timed target: yields the given per-call times and advances a fake clock by them."""

    max_batch = 8
    timer_name = "synthetic"

    def __init__(self, times, overhead=0.0):
        self.times = iter(times)
        self.now = 0.0
        self.overhead = overhead
        self.calls = 0

    def clock(self):
        return self.now

    def run(self, n, cold):
        out = [next(self.times) for _ in range(n)]
        self.now += sum(out) + n * self.overhead
        self.calls += n
        return out


def forever(pattern):
    while True:
        yield from pattern


def test_stopping_rule_stops_on_a_quiet_stream_after_min_samples():
    rule = bench.StoppingRule(noise=0.02, min_samples=10, max_time_s=10, warmup_ms=1, batch_ms=1)
    target = Stream(forever([1e-3]))
    m = bench.measure(target, rule, cold=False, clock=target.clock)
    assert m.stop == "noise" and m.converged
    assert m.summary.n >= 10 and m.summary.median == 1e-3 and m.summary.rel_iqr == 0
    assert m.warmup_calls >= 1 and m.batches >= 1 and m.batch_size >= 1
    assert len(m.samples) == m.summary.n == target.calls - m.warmup_calls


def test_stopping_rule_gives_up_at_the_time_cap_on_a_noisy_stream():
    rule = bench.StoppingRule(noise=0.02, min_samples=5, max_time_s=0.5, warmup_ms=1, batch_ms=1)
    target = Stream(forever([1e-3, 2e-3]))
    m = bench.measure(target, rule, cold=False, clock=target.clock)
    assert m.stop == "time cap" and not m.converged
    assert m.summary.rel_iqr > 0.02
    assert 0.5 <= sum(m.samples) <= 0.5 + 8 * 2e-3  # at most one batch past the cap


def test_stopping_rule_converges_once_the_noise_settles():
    noisy = [1e-3, 3e-3] * 10
    rule = bench.StoppingRule(noise=0.02, min_samples=5, max_time_s=100, warmup_ms=0, batch_ms=1)
    target = Stream(noisy + [1e-3] * 10_000)
    m = bench.measure(target, rule, cold=False, clock=target.clock)
    assert m.stop == "noise"
    assert bench.summarize(m.samples).q3 == 1e-3  # the quiet tail outnumbers the noise by now


def test_stopping_rule_decides_in_order():
    rule = bench.StoppingRule(noise=0.05, min_samples=4, max_time_s=1.0, max_samples=6)
    assert rule.decide([1.0, 1.0, 1.0], 0.0) is None  # too few samples for the noise test
    assert rule.decide([1.0, 1.0, 1.0, 1.01], 0.0) == "noise"
    assert rule.decide([1.0, 2.0, 3.0, 4.0], 0.5) is None
    assert rule.decide([1.0, 2.0, 3.0, 4.0], 1.0) == "time cap"
    assert rule.decide([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0.0) == "sample cap"
    assert rule.decide([], 5.0) is None


def test_warm_up_samples_are_discarded_and_batches_sized_from_it():
    # the first calls are slow (module load, first touch): they must not reach the samples
    rule = bench.StoppingRule(noise=0.02, min_samples=3, max_time_s=10, warmup_ms=50, batch_ms=4)
    target = Stream([40e-3] + [1e-3] * 10_000)
    m = bench.measure(target, rule, cold=False, clock=target.clock)
    assert 40e-3 not in m.samples
    assert m.warmup_s >= 0.05 and m.batch_size == 4
    assert m.summary.median == 1e-3


# -- cost models, checked by hand --------------------------------------------------------------


def cost_of(op, shapes, **params):
    spec = get_spec(op)
    return spec.cost(shapes, normalize_params(spec, params))


def test_matmul_cost_by_hand():
    # (2, 3, 4) x (2, 4, 5): reads 24 + 40 floats, writes 2*3*5 = 30, 2*3*5 dot products of 4 terms
    c = cost_of("matmul", {"a": (2, 3, 4), "b": (2, 4, 5)})
    assert (c.bytes_read, c.bytes_written, c.flops) == (4 * 64, 4 * 30, 2 * 30 * 4)
    assert c.intensity == pytest.approx(240 / 376)


def test_conv_cost_by_hand():
    # x (2, 3, 8, 8), w (4, 3, 3, 3), b (4), stride 1, no padding: y (2, 4, 6, 6) = 288 outputs,
    # each 3*3*3 = 27 multiply-adds plus the bias
    c = cost_of("conv", {"x": (2, 3, 8, 8), "w": (4, 3, 3, 3), "b": (4,)})
    assert c.bytes_read == 4 * (384 + 108 + 4)
    assert c.bytes_written == 4 * 288
    assert c.flops == 2 * 288 * 27 + 288


def test_softmax_cost_by_hand():
    # 4 rows of 10: read 40 floats, write 40; max, subtract, exp, add, divide per element
    c = cost_of("softmax", {"x": (4, 10)})
    assert (c.bytes_read, c.bytes_written, c.flops) == (160, 160, 5 * 40)


def test_layer_norm_cost_by_hand():
    # x (6, 8), gamma and beta (8): 7 flops per element, 4 per row statistic
    c = cost_of("layer_norm", {"x": (6, 8), "gamma": (8,), "beta": (8,)})
    assert (c.bytes_read, c.bytes_written, c.flops) == (4 * (48 + 16), 4 * 48, 7 * 48 + 4 * 6)


def test_pointwise_cost_by_hand():
    # add on (3, 5): two inputs read, one output written, one addition per element
    c = cost_of("add", {"x": (3, 5), "y": (3, 5)})
    assert (c.bytes_read, c.bytes_written, c.flops) == (120, 60, 15)
    r = cost_of("relu", {"x": (1000,)})
    assert (r.bytes, r.flops) == (8000, 1000)


def peaks(bandwidth=1e12, compute=1e13):
    return bench.Peaks(
        bench.Peak("bandwidth", bandwidth, 0, "test", None), bench.Peak("compute", compute, 0, "test", None)
    )


def test_throughput_takes_the_roof_that_bounds_the_intensity():
    p = peaks()  # ridge at 10 flop/byte
    assert p.ridge == 10
    memory = bench.throughput(Cost(600, 400, 1000), 1e-9, p)  # 1 flop/byte, 1 kB in 1 ns
    assert memory.bound == "memory" and memory.gbps == pytest.approx(1000) and memory.peak_pct == pytest.approx(100)
    compute = bench.throughput(Cost(50, 50, 5000), 1e-9, p)  # 50 flop/byte
    assert (
        compute.bound == "compute" and compute.gflops == pytest.approx(5000) and compute.peak_pct == pytest.approx(50)
    )
    copy = bench.throughput(Cost(4, 4, 0), 1e-9, p)
    assert copy.bound == "memory" and copy.intensity == 0
    unknown = bench.throughput(Cost(4, 4, 4), 1e-9, bench.Peaks(None, None, ("no GPU",)))
    assert unknown.bound is None and unknown.peak_pct is None and unknown.gbps == pytest.approx(8)


# -- sizes and resizing --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("small", ("small", None)),
        ("LARGE", ("large", None)),
        ("1GiB", ("large", 2**30)),
        ("256MB", ("large", 256 * 10**6)),
        ("1e9", ("large", 10**9)),
        ("64kib", ("large", 65536)),
        ("auto", ("large", None)),
    ],
)
def test_parse_size(text, expected):
    size = bench.parse_size(text)
    assert (size.samples, size.target_bytes) == expected
    assert size.grow_only == (text == "auto")


@pytest.mark.parametrize("text", ["huge", "12 parsecs", "-5", "0", ""])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError):
        bench.parse_size(text)


def resized_cost(op, target, case=0):
    spec = get_spec(op)
    sample = spec.samples("large", seeded_rng(op, "test"))[case]
    new, note = bench.resize(spec, sample, target)
    arrays, params, _ = validate(spec, new.inputs, new.params, np.float32)  # still an input the op accepts
    return new, spec.cost(shapes_of(arrays), params), note


@pytest.mark.parametrize(
    "op",
    [
        "relu",
        "add",
        "softmax",
        "layer_norm",
        "matmul",
        "conv",
        "gather",
        "slice",
        "broadcast",
        "concat",
        "rand_uniform",
        "selective_scan",
        "reduce_sum",
    ],
)
def test_resize_reaches_the_target_and_keeps_the_input_valid(op):
    new, cost, note = resized_cost(op, 64 << 20)
    assert cost.bytes == pytest.approx(64 << 20, rel=0.02), note
    assert note.startswith("resized")


def test_resize_stretches_the_shared_axis_only():
    new, _, _ = resized_cost("matmul", 50 << 20)
    assert (
        new.inputs["b"].shape == (1024, 1024) and new.inputs["a"].shape[1] == 1024 and new.inputs["a"].shape[0] > 1024
    )
    new, _, _ = resized_cost("layer_norm", 50 << 20)
    assert new.inputs["gamma"].shape == (1024,) and new.inputs["x"].shape[1] == 1024
    new, _, _ = resized_cost("softmax", 50 << 20)
    assert new.inputs["x"].shape[1] == 1000
    # values are tiled: the grown input repeats the sample's own values
    spec = get_spec("relu")
    sample = spec.samples("large", seeded_rng("relu", "test"))[0]
    grown, _ = bench.resize(spec, sample, 3 * spec.cost(shapes_of(sample.inputs), {}).bytes)
    assert np.array_equal(grown.inputs["x"][:1024], sample.inputs["x"])


def test_resize_shrinks_unless_grow_only_and_says_when_it_cannot():
    spec = get_spec("relu")
    sample = spec.samples("large", seeded_rng("relu", "test"))[0]
    small, note = bench.resize(spec, sample, 1 << 20)
    assert spec.cost(shapes_of(small.inputs), {}).bytes == pytest.approx(1 << 20, rel=0.02)
    same, note = bench.resize(spec, sample, 1 << 20, grow_only=True)
    assert same is sample and note == ""
    reshape = get_spec("reshape")
    sample = reshape.samples("large", seeded_rng("reshape", "test"))[0]
    kept, note = bench.resize(reshape, sample, 1 << 20)
    assert kept is sample and note.startswith("kept at 0 bytes")


def test_resize_refuses_what_would_not_fit_in_memory():
    spec = get_spec("relu")
    sample = spec.samples("large", seeded_rng("relu", "test"))[0]
    with pytest.raises(MemoryError, match="host memory"):
        bench.resize(spec, sample, 10**12, memory_limit=10**9)


# -- baselines -----------------------------------------------------------------------------------


def test_every_op_has_twins_or_a_declared_reason():
    for name in all_specs():
        assert (name in baselines.TWINS) != (name in baselines.NO_TWIN), name
        for library in baselines.BASELINES:
            twin = baselines.TWINS.get(name)
            assert (baselines.exclusion(name, library) is None) == (
                twin is not None and twin.for_library(library) is not None
            )
    assert baselines.exclusion("safe_log", "torch") is None  # composed from library calls
    assert "no library twin" in baselines.exclusion("smooth_max_pool", "torch")
    assert "generator" in baselines.exclusion("rand_uniform", "numpy")
    assert "numpy has no convolution" in baselines.exclusion("conv", "numpy")


@pytest.mark.parametrize("op", [n for n in all_specs() if baselines.exclusion(n, "numpy") is None])
def test_numpy_twins_compute_what_the_op_computes(op):
    check = bench.TwinCheck()
    lib = baselines.NumpyLibrary()
    assert check.problem(get_spec(op), lib, baselines.TWINS[op].for_library("numpy")) is None


def test_a_twin_that_computes_something_else_is_excluded_with_its_error():
    check = bench.TwinCheck()
    wrong = lambda xp, a, p: xp.maximum(a["x"], 0) * 1.01  # noqa: E731
    problem = check.problem(get_spec("relu"), baselines.NumpyLibrary(), wrong)
    assert "does not compute the same thing" in problem and "relative error 0.01" in problem
    crash = check.problem(get_spec("sin"), baselines.NumpyLibrary(), lambda xp, a, p: xp.nope(a["x"]))
    assert "failed" in crash and "AttributeError" in crash


def test_relative_error_requires_the_same_nonfinite_pattern():
    assert baselines.relative_error([1.0, np.nan, np.inf], [1.0, np.nan, np.inf]) == 0
    assert baselines.relative_error([1.0, 0.0], [1.0, np.nan]) == math.inf
    assert baselines.relative_error([np.inf], [-np.inf]) == math.inf
    assert baselines.relative_error([1.0], [1.0, 2.0]) == math.inf
    assert baselines.relative_error([3.0, 4.0], [3.0, 4.5]) == pytest.approx(0.5 / math.hypot(3, 4.5))


# -- the engine with simulated devices -----------------------------------------------------------


class ToyDevice(bench.NumpyDevice):
    """The numpy device with instant, constant-time 'kernels' and peaks: fast and deterministic."""

    def __init__(self, oom_ops=(), missing=()):
        super().__init__()
        self.oom_ops, self.missing = oom_ops, missing

    def unavailable(self, spec, direction="fwd", capsule=None):
        return "no launch plan: its kernels are not written yet" if spec.name in self.missing else None

    def kernel_target(self, spec, arrays, params, cotangent=None, capsule=None):
        if spec.name in self.oom_ops:
            raise MemoryError("needs 10 GB of GPU memory for its buffers, 1 GB free")
        return Stream(forever([1e-4]))

    def copy_peak(self):
        return Stream(forever([1e-3])), 10**9, "toy copy"

    def compute_peak(self):
        return Stream(forever([1e-3])), 10**10, "toy fma"


Stream.close = lambda self: None


class ToyLibrary(baselines.NumpyLibrary):
    """numpy twins, timed as a constant twice the toy kernel's time."""

    def target(self, fn, cold_flush_bytes):
        fn()
        return Stream(forever([2e-4]))


def toy_run(names=("relu", "softmax", "matmul"), size="small", **device):
    settings = bench.Settings(
        bench.parse_size(size), rule=bench.StoppingRule(min_samples=3, warmup_ms=0.1), baselines=("torch", "numpy")
    )
    capsules = [registry.lookup(n) for n in names]
    return bench.run(
        capsules,
        ToyDevice(**device),
        settings,
        "toy backend",
        libraries={"numpy": ToyLibrary(), "torch": baselines.TorchLibrary("cpu")},
    )


def test_engine_times_each_sample_with_throughput_and_baselines():
    result = toy_run()
    assert result.exit_code == 0 and result.peaks.ridge == pytest.approx(10)
    assert {c.op for c in result.cases} == {"relu", "softmax", "matmul"}
    for c in result.cases:
        assert c.status is bench.CaseStatus.OK and c.measurement.summary.median == 1e-4
        assert c.throughput.gbps == pytest.approx(c.cost.bytes / 1e-4 / 1e9)
        numpy = next(b for b in c.baselines if b.name == "numpy")
        assert numpy.status is bench.BaselineStatus.OK and numpy.ratio == pytest.approx(2.0)
        assert [b.name for b in c.baselines] == ["torch", "numpy"]


def test_out_of_memory_and_missing_kernels_are_skipped_with_the_reason():
    result = toy_run(oom_ops=("softmax",), missing=("matmul",))
    by_op = {c.op: c for c in result.cases}
    assert by_op["softmax"].status is bench.CaseStatus.SKIPPED
    assert by_op["softmax"].reason.startswith("out of memory: needs 10 GB")
    assert by_op["matmul"].status is bench.CaseStatus.SKIPPED and "no launch plan" in by_op["matmul"].reason
    assert by_op["relu"].status is bench.CaseStatus.OK
    assert result.exit_code == 0  # a skip is not a failure


def test_out_of_memory_while_resizing_is_a_skip(monkeypatch):
    monkeypatch.setattr(bench, "host_available_bytes", lambda: 10**6)
    result = toy_run(names=("relu",), size="1GB")
    (case,) = result.cases
    assert case.status is bench.CaseStatus.SKIPPED and "out of memory" in case.reason and "host memory" in case.reason


def test_a_failing_kernel_is_an_error_and_exit_1():
    class Broken(ToyDevice):
        def kernel_target(self, spec, arrays, params, cotangent=None, capsule=None):
            raise RuntimeError("illegal address")

    settings = bench.Settings(
        bench.parse_size("small"), rule=bench.StoppingRule(min_samples=3, warmup_ms=0.1), baselines=()
    )
    result = bench.run([registry.lookup("relu")], Broken(), settings)
    assert result.cases[0].status is bench.CaseStatus.ERROR and "illegal address" in result.cases[0].reason
    assert result.exit_code == 1


def test_zero_cost_ops_are_skipped_not_timed():
    result = toy_run(names=("reshape",))
    assert all(c.status is bench.CaseStatus.SKIPPED and "moves no bytes" in c.reason for c in result.cases)


# -- comparison ----------------------------------------------------------------------------------


def t(median, spread=0.01):
    return {"median": median, "q1": median * (1 - spread), "q3": median * (1 + spread)}


def test_compare_is_noise_aware():
    assert bench.classify(t(1.0), t(1.2), 0.05)[0] is bench.ChangeStatus.REGRESSED  # clear: +20% on 1% noise
    assert bench.classify(t(1.0), t(0.8), 0.05)[0] is bench.ChangeStatus.IMPROVED
    assert bench.classify(t(1.0), t(1.03), 0.05)[0] is bench.ChangeStatus.UNCHANGED  # under the threshold
    assert bench.classify(t(1.0, 0.2), t(1.2, 0.2), 0.05)[0] is bench.ChangeStatus.NOISY  # +20% inside 20% noise
    assert bench.classify(t(1.0, 0.02), t(1.06, 0.02), 0.05)[0] is bench.ChangeStatus.NOISY  # +6%, quartiles overlap
    status, change, low, high = bench.classify(t(1.0), t(1.2), 0.05)
    assert change == pytest.approx(0.2) and low == pytest.approx(1.188 / 1.01 - 1) and high > change > low


def doc_of(result):
    return json.loads(json.dumps(report.bench_record(result, "test")))


def test_compare_matches_cases_and_marks_regressions_new_and_gone():
    old = doc_of(toy_run())
    for c in old["cases"]:
        if c["op"] == "relu":
            c["time"].update(median_s=5e-5, q1_s=4.9e-5, q3_s=5.1e-5)  # the old run was twice as fast
    old["cases"].append({**old["cases"][0], "case": "gone-0"})
    old["backend"] = "cuda"
    current = toy_run()
    comparison = bench.compare(old, current, 0.05, "old.json")
    statuses = {(ch.op, ch.case): ch.status for ch in comparison.changes}
    assert statuses[("relu", "small-0")] is bench.ChangeStatus.REGRESSED
    assert statuses[("softmax", "small-0")] is bench.ChangeStatus.UNCHANGED
    assert statuses[(old["cases"][0]["op"], "gone-0")] is bench.ChangeStatus.GONE
    assert any("backend" in n for n in comparison.notes)
    current.comparison = comparison
    assert current.exit_code == 1
    assert "REGRESSED relu small-0" in report.render_bench(current)
    same = toy_run()
    same.comparison = bench.compare(doc_of(same), same, 0.05, "same.json")
    assert same.exit_code == 0 and not same.comparison.regressions


def test_load_previous_refuses_what_is_not_a_bench_document(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "capsules.verify", "cases": []}')
    with pytest.raises(bench.CompareError, match="not a `capsules bench --json` document"):
        bench.load_previous(bad)
    (tmp_path / "junk.json").write_text("{")
    with pytest.raises(bench.CompareError, match="not JSON"):
        bench.load_previous(tmp_path / "junk.json")
    with pytest.raises(bench.CompareError, match="cannot read"):
        bench.load_previous(tmp_path / "missing.json")


def test_parse_percent():
    assert bench.parse_percent("5%", "--threshold") == pytest.approx(0.05)
    assert bench.parse_percent("2.5", "--noise") == pytest.approx(0.025)
    with pytest.raises(ValueError, match="--threshold"):
        bench.parse_percent("five", "--threshold")


# -- output formats --------------------------------------------------------------------------------

SCHEMA_KEYS = {
    "schema",
    "schema_version",
    "tool_version",
    "created",
    "backend",
    "backend_note",
    "device",
    "host",
    "settings",
    "compile_flags",
    "libraries",
    "peaks",
    "cases",
    "excluded",
    "comparison",
    "errors",
    "interrupted",
    "seconds",
    "exit_code",
}
CASE_KEYS = {
    "op",
    "capsule",
    "case",
    "direction",
    "shape",
    "shapes",
    "params",
    "status",
    "reason",
    "resized",
    "cost",
    "time",
    "gbps",
    "gflops",
    "intensity",
    "bound",
    "peak_pct",
    "baselines",
}
TIME_KEYS = {
    "timer",
    "median_s",
    "q1_s",
    "q3_s",
    "iqr_s",
    "rel_iqr",
    "min_s",
    "max_s",
    "mean_s",
    "samples",
    "stop",
    "converged",
    "warmup_calls",
    "warmup_s",
    "batches",
    "batch_size",
    "cold",
    "guarded",
    "raw_s",
}


def test_json_document_has_the_documented_fields():
    result = toy_run(oom_ops=("softmax",))
    doc = json.loads(json.dumps(report.bench_record(result, "9.9"), allow_nan=False))
    assert set(doc) == SCHEMA_KEYS and doc["schema"] == "capsules.bench" and doc["schema_version"] == 1
    assert set(doc["peaks"]) == {"bandwidth", "compute", "ridge_flop_per_byte", "problems"}
    assert doc["peaks"]["bandwidth"]["gbps"] == pytest.approx(1000) and doc["peaks"]["compute"][
        "gflops"
    ] == pytest.approx(10_000)
    ok = next(c for c in doc["cases"] if c["status"] == "OK")
    assert set(ok) == CASE_KEYS and set(ok["time"]) == TIME_KEYS
    assert set(ok["cost"]) == {"bytes_read", "bytes_written", "bytes", "flops", "intensity"}
    assert ok["time"]["samples"] == len(ok["time"]["raw_s"]) and ok["time"]["median_s"] == 1e-4
    assert {b["name"] for b in ok["baselines"]} == {"torch", "numpy"}
    skipped = next(c for c in doc["cases"] if c["status"] == "SKIPPED")
    assert skipped["time"] is None and skipped["reason"].startswith("out of memory")
    documented = open(report.__file__.replace("capsule_core/render/report.py", "docs/bench-schema.md")).read()
    for key in SCHEMA_KEYS | CASE_KEYS | TIME_KEYS:
        assert f'"{key}"' in documented, key


def test_csv_has_one_row_per_case():
    result = toy_run()
    rows = list(csv.DictReader(io.StringIO(report.bench_csv(result))))
    assert len(rows) == len(result.cases)
    first = rows[0]
    assert first["status"] == "OK" and float(first["median_s"]) == 1e-4 and float(first["numpy_ratio"]) == 2.0
    assert first["torch_status"] in ("OK", "UNAVAILABLE")


def test_tables_plain_and_markdown():
    result = toy_run()
    plain = report.render_bench(result)
    assert (
        "measured peaks: copy 1000 GB/s (toy copy); compute 10000 GFLOP/s (toy fma); ridge 10 FLOP/B" in plain
        and "vs numpy" in plain
        and "2.00x" in plain
    )
    assert "100 µs" in plain and "3 timed" not in plain
    md = report.render_bench(result, markdown=True)
    assert "| op " in md and "|---" in md.replace(":", "-")


def test_roofline_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the optional `plot` extra)")
    path = tmp_path / "roof.png"
    report.write_roofline(toy_run(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the cuda path against a simulated driver ------------------------------------------------------


class FakeGpu(DeviceBackend):
    """The device calls bench makes on a GPU, simulated: a clock that kernels, memsets and copies
    advance, events that read it, allocations that count, and launches whose arguments are
    checked against the declared C parameters (the types CudaBackend prepares)."""

    name, arch, description = "cuda", "sm_90", "Simulated H200 (sm_90)"

    def __init__(self, free=80 << 30):
        super().__init__()
        self.now, self.free_memory, self.allocated, self.next_address = 0.0, free, {}, 1 << 32
        self.launched, self.memsets, self.popped = [], 0, 0

    def allocate(self, nbytes):
        if nbytes > self.free_bytes():
            raise EnvironmentMissing("out of GPU memory (allocating): cuMemAlloc failed: out of memory")
        address, self.next_address = self.next_address, self.next_address + nbytes + 256
        self.allocated[address] = nbytes
        return address

    def free(self, address):
        self.allocated.pop(address, None)

    def upload(self, address, data):
        assert address in self.allocated or any(a <= address < a + n for a, n in self.allocated.items())

    def download(self, data, address):
        data[...] = 0

    def launch(self, ref, grid, block, shared_bytes, args):
        params = [parse_param(p) for p in ref.params]
        assert len(args) == len(params), (ref.symbol, args)
        for param, arg in zip(params, args):
            assert type(arg) is (np.uintp if param.pointer else C_TYPES[param.ctype].numpy), (ref.symbol, param, arg)
        self.launched.append(ref.symbol)
        self.now += {"capsule_peak_fma": 1.0, "capsule_bench_spin": 0.0}.get(ref.symbol, 0.1)  # ms

    def synchronize(self):
        pass

    def memset32(self, address, word, words):
        self.memsets += 1
        self.now += 0.01

    def copy(self, destination, source, nbytes):
        assert nbytes % 16 == 0
        self.now += nbytes / 1e9  # 1 GB per ms

    def record_event(self, event=None):
        event = event or types.SimpleNamespace()
        event.t = self.now
        return event

    def event_seconds(self, start, end):
        return (end.t - start.t) * 1e-3

    def free_bytes(self):
        return self.free_memory - sum(self.allocated.values())

    def facts(self):
        return {"l2_bytes": 50 << 20, "multiprocessors": 132, "total_bytes": 141 << 30}

    def release_context(self):
        self.popped += 1


@pytest.fixture
def fake_cuda():
    gpu = FakeGpu()
    return gpu, gpu


def test_cuda_path_times_event_pairs_and_measures_both_peaks(fake_cuda):
    drv, backend = fake_cuda
    device = bench.device_for(backend)
    assert device.kind == "cuda" and device.cache_bytes == 50 << 20
    settings = bench.Settings(
        bench.parse_size("small"), cold=True, rule=bench.StoppingRule(min_samples=3, warmup_ms=0.0), baselines=()
    )
    result = bench.run([registry.lookup("relu")], device, settings, "fake")
    assert result.exit_code == 0, [c.reason for c in result.cases]
    bw, fma = result.peaks.bandwidth, result.peaks.compute
    assert bw.value == pytest.approx(2e12)  # 2 * nbytes moved in nbytes / 1e9 ms: 2 TB/s
    assert fma.work == 2 * 8 * 16384 * (132 * 8) * 256 and fma.value == pytest.approx(fma.work / 1e-3)
    for case in result.cases:
        assert case.measurement.summary.median == pytest.approx(1e-4) and case.measurement.timer == "cuda events"
        assert case.measurement.guarded is True and case.measurement.cold
    assert "capsule_relu_fwd" in drv.launched and "capsule_bench_spin" in drv.launched
    timed = sum(c.measurement.summary.n + c.measurement.warmup_calls for c in result.cases)
    # one flush per call, outside its event pair (the pair reads 0.1 ms, not 0.11), and the copy
    # peak's source filled with 1.0f once
    assert drv.memsets == timed + 1
    assert sum(drv.allocated.values()) == (100 << 20)  # only the flush buffer (2 x L2) is still held
    assert result.compile_flags and result.device["multiprocessors"] == 132
    device.release()
    assert drv.popped == 1 and not drv.allocated


def test_cuda_path_skips_what_does_not_fit_on_the_device(fake_cuda):
    drv, backend = fake_cuda
    drv.free_memory = 120 << 20  # room for the peaks' small share, not for 200 MB per call
    device = bench.device_for(backend)
    settings = bench.Settings(
        bench.parse_size("200MB"), rule=bench.StoppingRule(min_samples=3, warmup_ms=0.0), baselines=()
    )
    result = bench.run([registry.lookup("relu")], device, settings, "fake")
    case = result.cases[0]
    assert case.status is bench.CaseStatus.SKIPPED and case.reason.startswith("out of memory: needs")
    assert result.exit_code == 0


def test_cuda_path_lost_context_stops_the_run(fake_cuda):
    drv, backend = fake_cuda
    device = bench.device_for(backend)
    from capsule_core.backends.cuda import LaunchFailed

    class Crashing:
        max_batch, timer_name = 8, "cuda events"

        def run(self, n, cold):
            raise LaunchFailed("timed launch failed: an illegal memory access was encountered")

        def close(self):
            pass

    device.gpu.plan_target = lambda capsule, plan, host: Crashing()
    settings = bench.Settings(
        bench.parse_size("small"), rule=bench.StoppingRule(min_samples=3, warmup_ms=0.0), baselines=()
    )
    result = bench.run([registry.lookup("relu"), registry.lookup("sin")], device, settings, "fake")
    assert result.exit_code == 1 and result.peaks.compute is not None
    first, *rest = result.cases
    assert first.status is bench.CaseStatus.ERROR and "illegal memory access" in first.reason
    assert rest and all(c.status is bench.CaseStatus.SKIPPED and "context was lost" in c.reason for c in rest)

    def broken(*args, **kwargs):
        raise LaunchFailed("timed launch failed: unspecified launch failure")

    device.gpu.time_calls = broken
    result = bench.run([registry.lookup("relu")], device, settings, "fake")
    assert result.exit_code == 1 and result.peaks.poisoned and result.errors
    assert all(c.status is bench.CaseStatus.SKIPPED and "context was lost" in c.reason for c in result.cases)


# -- the command -------------------------------------------------------------------------------------


def run_cli(*args):
    return runner.invoke(app, ["bench", *args])


def test_cli_bench_writes_every_format(tmp_path):
    out_json, out_csv = tmp_path / "out.json", tmp_path / "out.csv"
    result = run_cli(
        "relu", "softmax", "--backend", "numpy", *FAST, "--json", str(out_json), "--csv", str(out_csv), "--markdown"
    )
    assert result.exit_code == 0, result.output
    assert "backend numpy" in result.stderr
    assert "| op " in result.stdout and "relu" in result.stdout
    doc = json.loads(out_json.read_text())
    assert doc["backend"] == "numpy" and {c["op"] for c in doc["cases"]} == {"relu", "softmax"}
    assert doc["settings"]["size"] == "small" and doc["exit_code"] == 0
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert len(rows) == len(doc["cases"])

    again = run_cli("relu", "softmax", "--backend", "numpy", *FAST, "--compare", str(out_json), "--threshold", "1000%")
    assert again.exit_code == 0, again.output
    assert "compared with" in again.stdout and "verdict" in again.stdout

    doc["cases"] = [
        {
            **c,
            "time": {
                **c["time"],
                "median_s": c["time"]["median_s"] / 1000,
                "q1_s": c["time"]["q1_s"] / 1000,
                "q3_s": c["time"]["q3_s"] / 1000,
            },
        }
        for c in doc["cases"]
    ]
    faster = tmp_path / "faster.json"
    faster.write_text(json.dumps(doc))
    regressed = run_cli("relu", "softmax", "--backend", "numpy", *FAST, "--compare", str(faster))
    assert regressed.exit_code == 1 and "REGRESSED relu" in regressed.stdout


@pytest.mark.parametrize(
    "args, code, message",
    [
        ((), 2, "give capsule names, --all or --suite reference"),
        (("nosuchop",), 2, "unknown"),
        (("reference.relu",), 2, "launch no CUDA kernel"),
        (("relu", "--size", "enormous"), 2, "--size"),
        (("relu", "--threshold", "lots"), 2, "--threshold"),
        (("relu", "--noise", "x"), 2, "--noise"),
        (("relu", "--baseline", "none", "--baseline", "numpy"), 2, "none cannot be combined"),
        (("relu", "--compare", "/nonexistent/old.json"), 2, "cannot read"),
    ],
)
def test_cli_usage_errors(args, code, message):
    result = run_cli(*args, "--backend", "numpy")
    assert result.exit_code == code and message in result.stderr, result.output


def test_cli_environment_errors(tmp_path):
    import importlib.util

    from capsule_core.backends.cuda import probe

    if probe().problem:
        no_gpu = run_cli("relu", "--backend", "cuda")
        assert no_gpu.exit_code == 3 and "needs a GPU" in no_gpu.stderr
    cupy = run_cli("relu", "--backend", "numpy", "--baseline", "cupy")
    assert cupy.exit_code == 3
    plot = run_cli("relu", "--backend", "numpy", *FAST, "--plot", str(tmp_path / "roof.png"), "--baseline", "none")
    if importlib.util.find_spec("matplotlib") is not None:
        assert plot.exit_code == 0 and (tmp_path / "roof.png").exists()
    else:
        assert plot.exit_code == 3 and "pip install 'capsules[plot]'" in plot.stderr


def test_cli_baseline_none_shows_no_ratio_columns():
    result = run_cli("relu", "--backend", "numpy", *FAST, "--baseline", "none")
    assert result.exit_code == 0 and "vs " not in result.stdout


# -- on a GPU ------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_bench_on_the_gpu_measures_peaks_and_times_relu():
    from capsule_core.backends.cuda import CudaBackend

    device = bench.device_for(CudaBackend(0))
    settings = bench.Settings(bench.parse_size("16MB"), rule=bench.StoppingRule(min_samples=5), baselines=())
    result = bench.run([registry.lookup("relu")], device, settings, "gpu test")
    assert result.exit_code == 0, [c.reason for c in result.cases] + result.errors
    assert result.peaks.bandwidth.value > 1e11 and result.peaks.compute.value > 1e12, result.peaks
    (case,) = result.cases
    assert case.status is bench.CaseStatus.OK and case.measurement.summary.median > 0
    assert 0 < case.throughput.peak_pct < 200


def test_docstring_examples_run():
    import doctest

    assert doctest.testmod(bench, raise_on_error=True).attempted >= 6


def test_report_column_order_is_the_baselines_order():
    assert report.BENCH_BASELINES == baselines.BASELINES
