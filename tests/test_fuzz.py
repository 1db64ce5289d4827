"""`capsules fuzz` on the numpy provider: planted mutants found and shrunk, invalid inputs judged,
replay files round-tripping bit for bit, the shared time budget, the command's exit codes."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from mutants import LEGIT, MUTANTS
from typer.testing import CliRunner

from capsule_core.backends.execution import BackendRun
from capsule_core.backends.numpy_f32 import NumpyBackend
from capsule_core.catalog import registry
from capsule_core.errors import ShapeError
from capsule_core.fuzz import engine
from cli.app import app

runner = CliRunner()
BY_ID = {m.id: m for m in MUTANTS}
SMALL = 64
"""A shrunk example this small (input elements in all) is one a person can read."""

FOUND = [
    # (mutant, the checks that may catch it for the right reason)
    ("relu-nan-propagates", {"value.special"}),
    ("relu-in-place", {"inputs.intact"}),
    ("sub-vjp-sign", {"vjp"}),
    ("softmax-wrong-axis", {"value"}),
    ("add-writes-past-end", {"bounds"}),
    ("exp-nondeterministic", {"determinism"}),
    ("max-pool-grad-split-ties", {"selection.ties"}),
    ("conv-launches-before-validating", {"shape.guard"}),
    ("matmul-wrong-error-type", {"shape.guard"}),
    ("slice-no-range-check", {"shape.guard"}),
    ("rand-uniform-stream-off-by-one", {"value"}),
    ("bernoulli-u-le-p", {"value"}),  # a gap of verify --quick: its samples never draw u == p
]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test's example database in its own folder."""
    monkeypatch.setenv("CAPSULES_CACHE", str(tmp_path / "cache"))


def fuzz_one(op, backend, examples=300, seed=0, **kwargs):
    return engine.fuzz_capsule(registry.lookup(op), backend, max_examples=examples, seed=seed, **kwargs)


@pytest.mark.parametrize("mutant_id, checks", FOUND, ids=[m for m, _ in FOUND])
def test_fuzz_finds_each_planted_mutant_and_shrinks_it(mutant_id, checks):
    mutant = BY_ID[mutant_id]
    result = fuzz_one(mutant.op, mutant.backend())
    failure = result.failure
    assert failure is not None, f"{mutant_id} survived {result.examples} examples"
    assert result.examples + result.refused <= 300
    assert failure.check in checks, (failure.check, failure.detail)
    assert failure.example.elements() <= SMALL, failure.example.summary()
    assert result.shrink_steps > 0 and result.status in ("FAILED", "ERROR")


def test_the_honest_provider_raises_no_alarm_and_exercises_invalid_inputs():
    seen = {"empty": 0, "nan": 0, "refused": 0}

    class Watching(NumpyBackend):
        def forward(self, spec, inputs, params, out):
            x = inputs.get("x")
            if isinstance(x, np.ndarray):
                seen["empty"] += x.size == 0
                seen["nan"] += x.dtype.kind == "f" and bool(np.isnan(x).any())
            try:
                return super().forward(spec, inputs, params, out)
            except ShapeError:
                seen["refused"] += 1
                raise

    for op in ("relu", "softmax", "reduce_sum"):
        result = fuzz_one(op, Watching(), examples=150, seed=3)
        assert result.failure is None and result.status == "PASSED", result.failure
        assert result.examples > 50 and result.refused > 5
    assert seen["empty"] and seen["nan"] and seen["refused"]


@pytest.mark.parametrize(
    "legit_id", ["reduce-sum-left-fold", "softmax-times-reciprocal", "max-pool-last-maximum", "layer-norm-welford"]
)
def test_other_sane_implementations_raise_no_alarm(legit_id):
    """Another summation order, another tie winner, Welford's variance: the error model's domain
    (overflow, order-dependent infinities) keeps fuzzing fair to them."""
    legit = next(m for m in LEGIT if m.id == legit_id)
    result = fuzz_one(legit.op, legit.backend(), examples=100, seed=0)
    assert result.failure is None, (result.failure.detail, result.failure.example.summary())


class Unguarded(NumpyBackend):
    """Skips the runtime guard: computes whatever it is given (or crashes inside numpy)."""

    name = "unguarded"

    def forward(self, spec, inputs, params, out):
        from capsule_core.ops.base import working_params

        arrays = {
            k: (tuple(np.asarray(v, np.float32) for v in a) if isinstance(a, (tuple, list)) else np.asarray(a))
            for k, a in inputs.items()
        }
        y = spec.forward(arrays, working_params(dict(params), np.float32))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex inputs: numpy warns, the kernel just runs
            out.view.reshape(-1)[: np.size(y)] = np.asarray(y).reshape(-1)[: out.size]
        return BackendRun(inputs, 1)


def test_an_input_the_guard_refuses_must_be_refused_by_the_backend():
    result = fuzz_one("add", Unguarded(), examples=300, seed=1)
    assert result.failure is not None and result.failure.check == "shape.guard"
    assert re.search(r"forward: (accepted an input the guard refuses|crashed with)", result.failure.detail)
    assert re.search(r"expected (ShapeError|ParamError) naming '\w+'", result.failure.detail)


def test_save_and_replay_round_trip_bit_for_bit(tmp_path):
    mutant = BY_ID["clamp-grad-at-bounds"]
    result = fuzz_one(mutant.op, mutant.backend())
    failure = result.failure
    path = engine.write_replay(failure, tmp_path / "replays")
    assert path.suffix == ".json" and path.with_suffix(".npz").exists()
    document = json.loads(path.read_text())
    assert document["schema"] == "capsules.fuzz-replay" and document["check"] == failure.check
    recorded = engine.read_replay(path)
    assert recorded.example.params == failure.example.params and recorded.seed == failure.seed
    for name, value in failure.example.inputs.items():
        again = recorded.example.inputs[name]
        assert again.dtype == value.dtype and again.shape == value.shape and again.tobytes() == value.tobytes()
    rerun = engine.replay(recorded, mutant.backend())
    assert rerun.reproduced and rerun.exit_code == 1
    assert rerun.outcome.failure == (failure.check, failure.status, failure.detail)
    assert engine.replay(recorded, NumpyBackend()).outcome.failure is None


def test_replay_encodes_every_parameter_exactly(tmp_path):
    params = {
        "a": math.nan,
        "b": -math.inf,
        "c": (1, -1, 0),
        "d": [1, "x"],
        "e": None,
        "f": True,
        "g": 2**64 - 1,
        "h": 0.1,
        "i": -0.0,
        "j": "two",
    }
    x = np.array([np.nan, -0.0, 1e-45], np.float32)
    x.view(np.uint32)[0] = 0x7FC12345  # a NaN payload
    example = engine.Example({"xs": (x, np.zeros((0, 2), np.complex64)), "index": np.arange(3)}, params, "test")
    failure = engine.Failure("native_cuda.concat", "concat", "value", "FAILED", "detail", example, 7, "numpy")
    recorded = engine.read_replay(engine.write_replay(failure, tmp_path))
    back = recorded.example.params
    assert math.isnan(back["a"]) and back["b"] == -math.inf and back["c"] == (1, -1, 0) and back["d"] == [1, "x"]
    assert back["e"] is None and back["f"] is True and back["g"] == 2**64 - 1 and back["h"] == 0.1
    assert math.copysign(1.0, back["i"]) < 0 and back["j"] == "two"
    xs = recorded.example.inputs["xs"]
    assert xs[0].tobytes() == x.tobytes() and xs[1].dtype == np.complex64 and xs[1].shape == (0, 2)


def test_a_changed_replay_file_is_refused(tmp_path):
    mutant = BY_ID["relu-in-place"]
    path = engine.write_replay(fuzz_one(mutant.op, mutant.backend()).failure, tmp_path)
    with np.load(path.with_suffix(".npz")) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["x"] = arrays["x"] + 1
    np.savez(path.with_suffix(".npz"), **arrays)
    with pytest.raises(engine.ReplayFileError, match="missing or changed"):
        engine.read_replay(path)


class Ticks:
    """A clock that advances by `step` on every reading: the time budget, deterministically."""

    def __init__(self, step=0.01):
        self.now, self.step = 0.0, step

    def __call__(self):
        self.now += self.step
        return self.now


def test_the_time_budget_is_shared_across_capsules():
    clock = Ticks()
    capsules = [registry.lookup(op) for op in ("relu", "abs", "sqrt")]
    results = list(engine.fuzz(capsules, NumpyBackend(), time_budget=1.2, seed=0, clock=clock))
    assert [r.stopped for r in results] == ["time"] * 3
    assert all(r.examples > 5 for r in results)
    assert clock.now <= 1.2 + 0.1
    assert all(0.3 <= r.seconds <= 0.5 for r in results), [r.seconds for r in results]


def test_a_quick_capsule_leaves_its_time_to_the_others():
    clock = Ticks()
    capsules = [registry.lookup(op) for op in ("relu", "abs")]
    results = list(engine.fuzz(capsules, NumpyBackend(), time_budget=2.0, max_examples=10, seed=0, clock=clock))
    assert results[0].stopped == "examples" and results[0].seconds < 0.5
    assert results[1].stopped == "examples"


# -- the command --------------------------------------------------------------------------


def invoke(*args):
    return runner.invoke(app, ["fuzz", *args])


def test_docstring_example_runs():
    from cli.fuzz_command import fuzz

    line = next(line for line in fuzz.__doc__.splitlines() if line.strip().startswith("Example: capsules fuzz"))
    result = invoke(*line.split("capsules fuzz", 1)[1].split())
    assert result.exit_code == 0, result.output
    assert "softmax" in result.stdout and "PASSED" in result.stdout and "seed 1" in result.stdout
    assert "backend numpy" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "NAME: give capsule names, --all or --replay FILE"),
        (("relu", "--time", "0"), "--time: must be a positive number"),
        (("relu", "--examples", "0"), "--examples: must be at least 1"),
        (("rellu",), "did you mean relu"),
        (("relu", "--replay", "x.json"), "--replay: reruns the capsule its file names"),
        (("--replay", "missing.json"), "--replay: cannot read missing.json"),
    ],
)
def test_usage_errors_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_cuda_without_a_gpu_exits_3(monkeypatch):
    from capsule_core.backends import cuda

    monkeypatch.setattr(cuda, "probe", lambda: cuda.CudaProbe(None, None, (), "pycuda does not import"))
    result = invoke("relu", "--backend", "cuda")
    assert result.exit_code == 3 and "--backend cuda needs a GPU" in result.stderr


def test_a_failure_exits_1_is_saved_and_replays(monkeypatch, tmp_path):
    from capsule_core.backends import select

    mutant = BY_ID["sub-vjp-sign"]
    monkeypatch.setattr(select, "resolve", lambda name, device=0, **_: (mutant.backend(), "backend mutant"))
    result = invoke("sub", "relu", "--examples", "200", "--seed", "0", "--save", str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "FAILED native_cuda.sub vjp:" in result.stdout
    saved = sorted(tmp_path.glob("sub-vjp-*.json"))
    assert len(saved) == 1 and f"replay: capsules fuzz --replay {saved[0]}" in result.stdout
    again = invoke("--replay", str(saved[0]))
    assert again.exit_code == 1 and "the same failure, bit for bit" in again.stdout
    monkeypatch.setattr(select, "resolve", lambda name, device=0, **_: (NumpyBackend(), "backend numpy"))
    fixed = invoke("--replay", str(saved[0]))
    assert fixed.exit_code == 0 and "passes" in fixed.stdout


def test_json_and_junit_reports_for_ci(monkeypatch, tmp_path):
    from xml.etree import ElementTree

    from capsule_core.backends import select

    mutant = BY_ID["sub-vjp-sign"]
    monkeypatch.setattr(select, "resolve", lambda name, device=0, **_: (mutant.backend(), "backend mutant"))
    json_file, junit_file = tmp_path / "fuzz.json", tmp_path / "fuzz.xml"
    result = invoke(
        "sub",
        "--examples",
        "50",
        "--seed",
        "0",
        "--save",
        str(tmp_path / "saved"),
        "--json",
        str(json_file),
        "--junit",
        str(junit_file),
    )
    assert result.exit_code == 1, result.output
    document = json.loads(json_file.read_text())
    assert document["schema"] == "capsules.fuzz" and document["exit_code"] == 1 and document["seed"] == 0
    sub = document["capsules"][0]
    assert sub["status"] == "FAILED" and sub["failure"]["check"] == "vjp"
    assert Path(sub["failure"]["replay"]).parent == tmp_path / "saved"
    suite = ElementTree.parse(junit_file).getroot().find("testsuite")
    assert (suite.get("name"), suite.get("failures"), suite.get("errors")) == ("native_cuda.sub", "1", "0")
    failure = suite.find("testcase/failure")
    assert failure.get("message").startswith("vjp: ") and "replay: capsules fuzz --replay" in failure.text
    monkeypatch.undo()
    passed = invoke(
        "relu",
        "--backend",
        "numpy",
        "--examples",
        "10",
        "--seed",
        "0",
        "--json",
        str(json_file),
        "--junit",
        str(junit_file),
    )
    assert passed.exit_code == 0, passed.output
    relu = json.loads(json_file.read_text())["capsules"][0]
    assert relu["status"] == "PASSED" and relu["examples"] > 0 and relu["failure"] is None
    suite = ElementTree.parse(junit_file).getroot().find("testsuite")
    assert (suite.get("failures"), suite.get("errors"), suite.find("testcase/failure")) == ("0", "0", None)


def test_an_unwritable_report_is_refused_before_any_work(tmp_path):
    result = invoke("relu", "--backend", "numpy", "--json", str(tmp_path / "missing" / "r.json"))
    assert result.exit_code == 2 and "--json: cannot write" in result.stderr
    replayed = invoke("--replay", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"))
    assert replayed.exit_code == 2 and "give no --json or --junit" in replayed.stderr


def test_the_time_option_bounds_the_run():
    import time

    start = time.perf_counter()
    result = invoke("relu", "abs", "--backend", "numpy", "--time", "1.5", "--seed", "2")
    assert result.exit_code == 0, result.output
    assert time.perf_counter() - start < 1.5 + 2.0
    assert "time budget 1.5 s" in result.stdout


class Poisoning(NumpyBackend):
    """Every launch faults and kills the context, as a CUDA illegal address does."""

    name = "poisoning"

    def forward(self, spec, inputs, params, out):
        from capsule_core.backends.cuda import LaunchFailed
        from capsule_core.ops.base import validate

        validate(spec, inputs, params, np.float32)
        raise LaunchFailed(f"{spec.name} forward: an illegal memory access was encountered")


def test_a_poisoned_context_stops_the_run_with_an_error():
    capsules = [registry.lookup(op) for op in ("relu", "abs")]
    results = list(engine.fuzz(capsules, Poisoning(), max_examples=50, seed=0))
    assert len(results) == 1 and results[0].poisoned
    failure = results[0].failure
    assert failure.status == "ERROR" and "poisoned" in failure.detail and "illegal memory access" in failure.detail
    report = engine.FuzzReport("poisoning", "", 0, None, 50, results, poisoned=True)
    assert report.exit_code == 1


def test_the_replay_format_is_documented(tmp_path):
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "fuzz-replay.md").read_text()
    mutant = BY_ID["sub-vjp-sign"]
    document = json.loads(engine.write_replay(fuzz_one(mutant.op, mutant.backend()).failure, tmp_path).read_text())
    for key in document:
        assert f'"{key}"' in page, key
    assert f'"schema_version": {engine.REPLAY_SCHEMA_VERSION}' in page
