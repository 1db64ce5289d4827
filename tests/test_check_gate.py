"""`capsules check` is a gate: a kernel over its family's KernelBudget (registers, spills, an
undeclared stack frame, an nvcc warning) fails it with exit 1, naming the budget and the figure;
`show` prints the same budget; the family tests read it."""

import dataclasses
import importlib
import json
import shutil

import family_checks as fc
import pytest
from typer.testing import CliRunner

from capsule_core.catalog import native_cuda
from capsule_core.check import engine as check_engine
from capsule_core.kernels import nvcc as kernels
from capsule_core.kernels.nvcc import KernelBudget, KernelResources, register_budget
from cli.app import app

runner = CliRunner()
FAMILIES = sorted({c.family for c in native_cuda.CAPSULES if c.symbols})


def check_json(*args):
    result = runner.invoke(app, ["check", *args, "--arch", "sm_90", "--format", "json"])
    return result, json.loads(result.stdout) if result.stdout.strip() else None


def budget_item(doc):
    return next(i for i in doc["capsules"][0]["checks"] if i["id"] == "kernel.budget")


def lower_budget(monkeypatch, family: str, **changes) -> KernelBudget:
    plans = importlib.import_module(f"capsule_core.kernels.plans.{family}")
    budget = dataclasses.replace(plans.BUDGET, **changes)
    monkeypatch.setattr(plans, "BUDGET", budget)
    return budget


# -- the budget ------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_with_kernels_declares_a_budget_beside_its_plans(family):
    budget = fc.family_budget(family)
    assert isinstance(budget, KernelBudget) and 0 < budget.max_registers <= kernels.MAX_REGISTERS_PER_THREAD
    symbols = {r.symbol for c in native_cuda.CAPSULES if c.family == family for r in c.symbols}
    assert set(budget.registers) <= symbols and set(budget.stack_frames) <= symbols


LAUNCH_BOUNDS = {"pointwise": False, "norm": True, "scan": True, "spectral": True}
"""Families whose kernels all declare __launch_bounds__ (True) or none does (False); the others either."""


@pytest.mark.parametrize("arch", kernels.ARCHES)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_builds_without_warnings_or_spills_with_the_declared_entries(family, arch):
    assert fc.build_problems(family, arch) == []


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_spells_out_each_declared_signature(family):
    assert fc.family_ops(family) == {op for op, f in native_cuda.FAMILIES.items() if f == family}
    assert fc.signature_problems(family, launch_bounds=LAUNCH_BOUNDS.get(family)) == []


def test_register_budget_is_the_launch_bounds_arithmetic():
    assert register_budget(256, 8) == 32 and register_budget(128, 6) == 85 and register_budget(1024) == 64
    assert register_budget(256) == 255  # capped at what a thread can address


def test_budget_names_the_figure_and_the_budget():
    budget = KernelBudget(max_registers=32, registers={"k_gemm": 128}, stack_frames={"k_sin": "libm's slow path"})
    within = KernelResources(registers=32, spill_stores=0, spill_loads=0, stack_bytes=0, shared_bytes=0)
    assert budget.problems("k", within) == []
    assert budget.problems("k", dataclasses.replace(within, registers=40)) == ["k: 40 registers, over its budget of 32"]
    assert budget.problems("k_gemm", dataclasses.replace(within, registers=100)) == []
    assert budget.problems("k", dataclasses.replace(within, spill_stores=8, spill_loads=4)) == [
        "k: spills 8 bytes stored and 4 loaded, over its budget of 0"
    ]
    stack = dataclasses.replace(within, stack_bytes=32)
    assert budget.problems("k_sin", stack) == []
    assert budget.problems("k", stack) == ["k: a 32-byte stack frame, over its budget of 0 (no slow path declared)"]


# -- check fails on what the family tests reject -----------------------------------------------------


def test_check_passes_within_the_budget_and_reports_it():
    result, doc = check_json("relu")
    assert result.exit_code == 0, result.stdout
    item = budget_item(doc)
    assert item["status"] == "PASSED" and "at most 32 registers" in item["messages"][0]
    assert {k["max_registers"] for k in doc["capsules"][0]["kernels"]} == {32}


def test_a_register_budget_exceeded_fails_check_with_exit_1(monkeypatch):
    lower_budget(monkeypatch, "pointwise", max_registers=8)
    result = runner.invoke(app, ["check", "relu", "--arch", "sm_90"])
    assert result.exit_code == 1
    assert "kernel.budget FAILED: sm_90: capsule_relu_fwd:" in result.stdout
    assert "registers, over its budget of 8" in result.stdout


def test_an_undeclared_stack_frame_fails_check(monkeypatch):
    lower_budget(monkeypatch, "pointwise", stack_frames={})
    result, doc = check_json("sin")
    assert result.exit_code == 1 and doc["exit_code"] == 1
    assert any(
        "capsule_sin_bwd: a 32-byte stack frame, over its budget of 0" in m for m in budget_item(doc)["messages"]
    )


def test_a_planted_unused_variable_fails_check_naming_the_warning(monkeypatch, tmp_path):
    """A copy of the CUDA sources with an unused variable in one kernel (cuda/ itself untouched)."""
    sources = tmp_path / "cuda"
    shutil.copytree(kernels.cuda_source_dir(), sources)
    path = sources / "random.cu"
    text = path.read_text()
    body = text.index("{", text.index("capsule_rand_uniform_fwd("))
    path.write_text(text[: body + 1] + "\n    int planted_unused = 0;" + text[body + 1 :])
    monkeypatch.setattr(kernels, "cuda_source_dir", lambda: sources)
    monkeypatch.setenv("CAPSULES_CACHE", str(tmp_path / "cache"))
    result, doc = check_json("rand_uniform")
    assert result.exit_code == 1 and doc["capsules"][0]["status"] == "FAILED"
    message = budget_item(doc)["messages"][0]
    assert message.startswith("sm_90: nvcc warning (budget: 0 warnings): ")
    assert 'variable "planted_unused" was declared but never referenced' in message
    shown = json.loads(runner.invoke(app, ["show", "rand_uniform", "--format", "json"]).stdout)
    assert (
        "; OVER BUDGET: 1 nvcc warnings in cuda/random.cu (at most "
        in shown["kernel_resources"]["capsule_rand_uniform_fwd"]
    )


def test_the_family_tests_read_the_same_budget(monkeypatch):
    from family_checks import build_problems

    assert build_problems("pointwise", "sm_90") == []
    lower_budget(monkeypatch, "pointwise", max_registers=8)
    assert any("over its budget of 8" in p for p in build_problems("pointwise", "sm_90"))


def test_show_prints_each_kernel_beside_its_budget(monkeypatch):
    shown = runner.invoke(app, ["show", "sin"]).stdout
    assert "within budget (at most 32 registers, no spills, no stack frame, no nvcc warning)" in shown
    assert "within budget (at most 32 registers, no spills, a stack frame for libm cosf" in shown
    lower_budget(monkeypatch, "pointwise", max_registers=8)
    record = json.loads(runner.invoke(app, ["show", "sin", "--format", "json"]).stdout)
    assert "OVER BUDGET: capsule_sin_fwd:" in record["kernel_resources"]["capsule_sin_fwd"]


def test_a_plan_function_that_crashes_fails_launch_plan_and_verify_keeps_its_report(monkeypatch):
    """A crashing plan is a FAILED launch.plan in check and verify, and an ERROR of the dynamic
    checks on a device backend: never a traceback, never a lost report."""
    from capsule_core.kernels.plans import pointwise

    def crashing(arrays, params):
        raise ZeroDivisionError("float division by zero")

    forward, backward = pointwise.PLANS["relu"]
    monkeypatch.setitem(pointwise.PLANS, "relu", (crashing, backward))
    result, doc = check_json("relu")
    assert result.exit_code == 1
    item = next(i for i in doc["capsules"][0]["checks"] if i["id"] == "launch.plan")
    assert item["status"] == "FAILED"
    assert "the plan function raised ZeroDivisionError: float division by zero" in item["messages"][0]
    verified = runner.invoke(
        app,
        ["verify", "relu", "--backend", "emu", "--quick", "--no-isolate", "--check", "launch.plan", "--check", "value"],
    )  # in-process: the workers would not see the patch
    assert verified.exit_code == 1 and "Traceback" not in verified.stdout + verified.stderr
    assert (
        "FAILED native_cuda.relu launch.plan" in verified.stdout and "ERROR native_cuda.relu value" in verified.stdout
    )


# -- what the gate holds plans and sources to (what the family tests used to hold alone) ------------


def test_a_launch_that_does_not_fit_its_kernel_fails_the_gate():
    from capsule_core.kernels.launch import Launch

    heavy = KernelResources(registers=128, spill_stores=0, spill_loads=0, stack_bytes=0, shared_bytes=40 * 1024)
    launch = Launch("k", (1, 1, 1), (1024, 1, 1), ())
    assert check_engine.fit_problems(launch, {"k": heavy}, "sm_90") == [
        "k: 1024 threads × 128 registers exceed a multiprocessor's 65536"
    ]
    wide = Launch("k", (1, 1, 1), (256, 1, 1), (), shared_bytes=200 * 1024)
    assert check_engine.fit_problems(wide, {"k": heavy}, "sm_80") == ["k: 40960 + 204800 bytes of shared memory"]
    assert check_engine.fit_problems(Launch("k", (1, 1, 1), (256, 1, 1), ()), {"k": heavy}, "sm_90") == []


def test_a_plan_that_reads_what_the_op_does_not_give_fails_the_gate():
    import numpy as np

    from capsule_core.kernels.launch import Buffer, LaunchPlan
    from capsule_core.ops import get_spec

    spec = get_spec("relu")
    arrays = {"x": np.zeros(4, np.float32)}

    def plan(*names):
        return LaunchPlan("relu", "fwd", tuple(Buffer(n, "input", "float32", 4) for n in names), ())

    assert check_engine.read_problems(spec, arrays, plan("x"), plan("x", "g", "out")) == []
    assert check_engine.read_problems(spec, arrays, plan("x", "stale"), plan("x", "g", "y")) == [
        "forward: input buffers ['stale'] are not inputs of the op",
        "backward: input buffers ['y'] are not the op's, out or g",
    ]


def test_check_holds_the_source_to_the_declared_parameter_list():
    ref = native_cuda.CAPSULES[3].symbols[0]  # relu's forward
    text = kernels.source_path(ref.path).read_text()
    assert check_engine.source_declaration(ref, text) is not None
    renamed = dataclasses.replace(ref, params=(*ref.params[:-1], "int64_t count"))
    assert check_engine.source_declaration(renamed, text) is None
    problems = check_engine._symbol_problems((renamed,), {})
    assert problems == [
        f'{ref.symbol}: no extern "C" __global__ definition with the declared parameters '
        f"({', '.join(renamed.params)}) in {ref.path}"
    ]
