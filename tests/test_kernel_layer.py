"""The nvcc layer and `capsules check` without a GPU: discovery, the content-hash cache (hits,
damaged entries, concurrent builds), compile errors, PTX signatures, resources, planted faults."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from capsule_core.check import engine as check_engine
from capsule_core.errors import EnvironmentMissing
from capsule_core.kernels import nvcc as kernels
from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, plan_problems
from capsule_core.model import NativeSymbolRef
from cli.app import app

ROOT = Path(__file__).resolve().parent.parent

KERNEL = r"""
#include <cstdint>
#include "tiny.cuh"
extern "C" __global__ void capsule_tiny_fwd(const float* __restrict__ x, float* __restrict__ y, float c, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = tiny_scale(x[i], c);
}
"""
HEADER = "#pragma once\n__host__ __device__ inline float tiny_scale(float v, float c) { return v * c; }\n"
DECLARED = NativeSymbolRef(
    "cuda/tiny.cu", "capsule_tiny_fwd", ("const float* __restrict__ x", "float* __restrict__ y", "float c", "int64_t n")
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSULES_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "cuda"
    folder.mkdir()
    (folder / "tiny.cuh").write_text(HEADER)
    path = folder / "tiny.cu"
    path.write_text(KERNEL)
    return path


def test_nvcc_is_found_through_cuda_home(monkeypatch, tmp_path):
    fake = tmp_path / "toolkit" / "bin"
    fake.mkdir(parents=True)
    real = kernels.find_nvcc().path
    (fake / "nvcc").symlink_to(real)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "toolkit"))
    found = kernels.find_nvcc()
    assert found.found_by == "CUDA_HOME" and found.path == fake / "nvcc"
    assert found.version.startswith("13.")


def test_missing_nvcc_is_a_clear_error(monkeypatch, tmp_path):
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(kernels, "DEFAULT_CUDA", tmp_path / "nothing")
    with pytest.raises(EnvironmentMissing, match="nvcc not found .*CUDA_HOME"):
        kernels.find_nvcc()
    result = CliRunner().invoke(app, ["check", "relu"])
    assert result.exit_code == 3 and "nvcc not found" in result.stderr


def test_compile_caches_and_reads_ptx_and_resources(cache, source):
    first = kernels.compile_file(source, "sm_90")
    assert not first.cached and first.cubin[:4] == b"\x7fELF"
    assert [p.ptx_type for p in first.entries["capsule_tiny_fwd"]] == ["u64", "u64", "f32", "u64"]
    r = first.resources["capsule_tiny_fwd"]
    assert r.registers > 0 and r.spill_stores == r.spill_loads == 0
    second = kernels.compile_file(source, "sm_90")
    assert second.cached and second.cubin == first.cubin


def test_cache_key_covers_headers_flags_and_arch(cache, source):
    nvcc = kernels.find_nvcc()
    key = kernels.cache_key(source, "sm_90", nvcc)
    assert kernels.cache_key(source, "sm_80", nvcc) != key
    (source.parent / "tiny.cuh").write_text(HEADER.replace("v * c", "c * v"))
    assert kernels.cache_key(source, "sm_90", nvcc) != key


@pytest.mark.parametrize("damage", ["truncate cubin", "flip ptx", "drop manifest"])
def test_damaged_entry_is_rebuilt(cache, source, damage):
    kernels.compile_file(source, "sm_90")
    entry = next((cache / "kernels").glob("tiny-sm_90-*"))
    if damage == "truncate cubin":
        (entry / "kernel.cubin").write_bytes((entry / "kernel.cubin").read_bytes()[:100])
    elif damage == "flip ptx":
        (entry / "kernel.ptx").write_text((entry / "kernel.ptx").read_text().replace(".entry", ".entri", 1))
    else:
        (entry / "manifest.json").unlink()
    rebuilt = kernels.compile_file(source, "sm_90")
    assert not rebuilt.cached and "capsule_tiny_fwd" in rebuilt.entries
    assert kernels.compile_file(source, "sm_90").cached


def test_four_processes_compiling_at_once_share_one_entry(cache, source):
    code = (
        "import sys; from pathlib import Path; from capsule_core.kernels import nvcc as kernels; "
        "r = kernels.compile_file(Path(sys.argv[1]), 'sm_90'); print(len(r.cubin))"
    )
    env = {**os.environ, "CAPSULES_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(source)], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    sizes = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(sizes) == 1
    entries = [p for p in (cache / "kernels").iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and not list((cache / "kernels").glob(".build-*"))


def test_compile_error_shows_nvccs_message_and_the_line(cache, source):
    source.write_text(KERNEL.replace("tiny_scale(x[i], c)", "tiny_scale(x[i], undefined_name)"))
    with pytest.raises(kernels.CompileError) as info:
        kernels.compile_file(source, "sm_90")
    text = str(info.value)
    assert "undefined_name" in text and "tiny.cu:6" in text and ">    6 |" in text


def test_symbol_check_catches_renamed_symbols_and_wrong_widths(cache, source, monkeypatch):
    monkeypatch.setattr(kernels, "cuda_source_dir", lambda: source.parent)
    compiled = {DECLARED.path: {"sm_90": kernels.compile_file(source, "sm_90")}}
    assert check_engine._symbol_problems([DECLARED], compiled) == []
    renamed = NativeSymbolRef(DECLARED.path, "capsule_tiny_forward", DECLARED.params)
    problems = check_engine._symbol_problems([renamed], compiled)
    assert any("no extern" in p for p in problems) and any("no PTX .entry" in p for p in problems)
    narrow = NativeSymbolRef(DECLARED.path, DECLARED.symbol, DECLARED.params[:3] + ("int32_t n",))
    assert check_engine._symbol_problems([narrow], compiled) == [  # the source's list and the PTX both disagree
        'capsule_tiny_fwd: no extern "C" __global__ definition with the declared parameters '
        "(const float* __restrict__ x, float* __restrict__ y, float c, int32_t n) in cuda/tiny.cu",
        "capsule_tiny_fwd (sm_90): parameter 3 `int32_t n` should be .u32 in PTX, is .u64",
    ]
    shorter = NativeSymbolRef(DECLARED.path, DECLARED.symbol, DECLARED.params[:3])
    assert "capsule_tiny_fwd (sm_90): PTX has 4 parameters, the registry declares 3" in check_engine._symbol_problems(
        [shorter], compiled
    )


def _plan(block=(256, 1, 1), args=("x", "out", 2.0, 10), shared=0):
    return LaunchPlan(
        "tiny",
        "fwd",
        (Buffer("x", "input", "float32", 10), Buffer("out", "output", "float32", 10)),
        (Launch("capsule_tiny_fwd", (1, 1, 1), block, args, shared),),
        output_shapes={"out": (10,)},
    )


def test_buffers_hold_the_kernels_pointer_types_and_size_themselves():
    assert [Buffer("b", "workspace", t, 5).nbytes for t in ("float32", "int32", "int64")] == [20, 20, 40]
    assert Buffer("empty", "workspace", "int64", 0).nbytes == 0
    with pytest.raises(ValueError, match="buffer b: dtype must be one of float32, int32, uint32, int64, uint64"):
        Buffer("b", "workspace", "float64", 5)


def test_plan_problems_catch_planted_faults():
    symbols = {DECLARED.symbol: DECLARED}
    assert plan_problems(_plan(), symbols) == []
    assert any("2048 threads" in p for p in plan_problems(_plan(block=(2048, 1, 1)), symbols))
    assert any("3 arguments for 4" in p for p in plan_problems(_plan(args=("x", "out", 2.0)), symbols))
    assert any("writable but buffer x" in p for p in plan_problems(_plan(args=("out", "x", 2.0, 10)), symbols))
    assert any("n = 1.5 does not fit int64_t" in p for p in plan_problems(_plan(args=("x", "out", 2.0, 1.5)), symbols))
    assert any("c needs a number of type float" in p for p in plan_problems(_plan(args=("x", "out", "x", 10)), symbols))
    assert any("x needs a buffer" in p for p in plan_problems(_plan(args=(3, "out", 2.0, 10)), symbols))
    assert any("dynamic shared memory" in p for p in plan_problems(_plan(shared=200 * 1024), symbols, "sm_80"))
    assert plan_problems(_plan(shared=200 * 1024), symbols, "sm_90") == []


def test_check_json_for_one_capsule():
    result = CliRunner().invoke(app, ["check", "relu", "--arch", "sm_90", "--format", "json"])
    doc = json.loads(result.stdout)
    assert doc["schema"] == "capsules.check" and doc["arches"] == ["sm_90"]
    assert [c["name"] for c in doc["capsules"]] == ["native_cuda.relu"]
    assert {c["id"] for c in doc["capsules"][0]["checks"]} >= {"contract.aligned", "ffi.symbols"}
    assert result.exit_code == doc["exit_code"]


def test_check_refuses_reference_capsules_and_unknown_names():
    assert CliRunner().invoke(app, ["check", "reference.relu"]).exit_code == 2
    assert CliRunner().invoke(app, ["check", "relux"]).exit_code == 2


TINY_PARAMS = "(const float* __restrict__ x,\n    float* __restrict__ y, float c, int64_t n)"


@pytest.mark.parametrize(
    "text",
    [
        'extern "C" __global__ void capsule_tiny_fwd' + TINY_PARAMS,
        'extern "C" __global__ __launch_bounds__(256, 2) void capsule_tiny_fwd' + TINY_PARAMS,
        'extern "C" __global__ void __launch_bounds__(512, 1)\ncapsule_tiny_fwd' + TINY_PARAMS,
    ],
)
def test_source_declarations_with_launch_bounds_are_found(text):
    """With or without __launch_bounds__, across lines; the name and the parameter list as declared."""
    assert check_engine._source_declares(DECLARED, text)
    assert not check_engine._source_declares(DECLARED, text.replace("capsule_tiny_fwd", "capsule_tiny_fwd2"))
    assert not check_engine._source_declares(DECLARED, text.replace("int64_t n", "int64_t count"))


EVERY_TYPE = r"""
#include <cstddef>
#include <cstdint>
extern "C" __global__ void capsule_types_fwd(const float* __restrict__ x, const uint32_t* __restrict__ shape,
                                             unsigned int* __restrict__ out, float c, int32_t a, int b, uint32_t d,
                                             unsigned int e, int64_t f, uint64_t g, size_t n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = shape[0] + shape[1];
        out[1] = static_cast<unsigned int>(x[0] * c);
        out[2] = static_cast<unsigned int>(a + b) + d + e;
        out[3] = static_cast<unsigned int>(f >> 32) ^ static_cast<unsigned int>(g >> 32) ^ static_cast<unsigned int>(n);
    }
}
"""
EVERY_REF = NativeSymbolRef(
    "cuda/types.cu",
    "capsule_types_fwd",
    (
        "const float* __restrict__ x",
        "const uint32_t* __restrict__ shape",
        "unsigned int* __restrict__ out",
        "float c",
        "int32_t a",
        "int b",
        "uint32_t d",
        "unsigned int e",
        "int64_t f",
        "uint64_t g",
        "size_t n",
    ),
)


def test_every_c_type_of_the_table_is_what_nvcc_declares(cache, tmp_path):
    """The table's PTX column is nvcc's own: a kernel taking every type, compiled, against it."""
    from capsule_core.check.engine import expected_ptx_type
    from capsule_core.kernels.c_types import C_TYPES
    from capsule_core.kernels.launch import parse_param

    source = tmp_path / "types.cu"
    source.write_text(EVERY_TYPE)
    compiled = kernels.compile_file(source, "sm_90")
    found = [p.ptx_type for p in compiled.entries["capsule_types_fwd"]]
    assert found == [expected_ptx_type(p) for p in EVERY_REF.params]
    assert {parse_param(p).ctype for p in EVERY_REF.params} == set(C_TYPES), "a row of the table is not tried"


def test_the_emulator_passes_every_c_type_and_plan_buffers_of_uint32(tmp_path):
    from capsule_core.backends.emu import EmuBackend
    from capsule_core.kernels.launch import parse_param

    (tmp_path / "types.cu").write_text(EVERY_TYPE)
    assert [parse_param(p).ctype for p in EVERY_REF.params[3:]] == [
        "float",
        "int32_t",
        "int",
        "uint32_t",
        "unsigned int",
        "int64_t",
        "uint64_t",
        "size_t",
    ]
    backend = EmuBackend(family_dir=tmp_path, refs=(EVERY_REF,))
    plan = LaunchPlan(
        "types",
        "fwd",
        (
            Buffer("x", "input", "float32", 1),
            Buffer("shape", "meta", "uint32", 2),
            Buffer("out", "output", "uint32", 4),
        ),
        (
            Launch(
                "capsule_types_fwd",
                (1, 1, 1),
                (32, 1, 1),
                ("x", "shape", "out", 3.0, -5, 7, 2**32 - 1, 11, 5 << 32, 9 << 32, 2**33 + 13),
            ),
        ),
        host_data={"shape": np.array([4, 6], np.uint32)},
        output_shapes={"out": (4,)},
    )
    assert plan_problems(plan, {EVERY_REF.symbol: EVERY_REF}) == []
    assert any(
        "does not fit uint32_t" in p
        for p in plan_problems(
            LaunchPlan(
                plan.op,
                plan.direction,
                plan.buffers,
                (
                    Launch(
                        "capsule_types_fwd", (1, 1, 1), (32, 1, 1), ("x", "shape", "out", 3.0, -5, 7, -1, 11, 0, 0, 0)
                    ),
                ),
                plan.host_data,
                plan.output_shapes,
            ),
            {EVERY_REF.symbol: EVERY_REF},
        )
    )
    from capsule_core.backends.execution import GuardedOutput

    out = GuardedOutput((4,))  # four-byte elements: its bits read back as uint32
    capsule = type("Capsule", (), {"symbols": (EVERY_REF,)})()
    backend.execute(capsule, plan, {"x": np.array([2.5], np.float32)}, {"out": out})
    assert out.view.view(np.uint32).tolist() == [10, 7, (2 + 2**32 - 1 + 11) % 2**32, 5 ^ 9 ^ 13]


STEPS = r"""
#include <cstddef>
// One image of a batch (a view of x and y): y = 2x, and the image's sum added atomically to total.
extern "C" __global__ void capsule_steps_fwd(const float* __restrict__ x, float* __restrict__ y,
                                             float* __restrict__ total, size_t n) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        y[i] = 2.0f * x[i];
        atomicAdd(total, x[i]);
    }
}
"""
STEPS_REF = NativeSymbolRef(
    "cuda/steps.cu",
    "capsule_steps_fwd",
    ("const float* __restrict__ x", "float* __restrict__ y", "float* __restrict__ total", "size_t n"),
)


def _steps_plan(images: int = 3, width: int = 8, steps=None) -> LaunchPlan:
    """A memset, one launch per image through buffer views, and a copy out of the workspace."""
    from capsule_core.kernels.launch import Copy, Memset, View

    n = images * width
    launches = tuple(
        Launch("capsule_steps_fwd", (1, 1, 1), (32, 1, 1), (View("x", i * width), View("y", i * width), "total", width))
        for i in range(images)
    )
    return LaunchPlan(
        "steps",
        "fwd",
        (
            Buffer("x", "input", "float32", n),
            Buffer("y", "output", "float32", n),
            Buffer("total", "workspace", "float32", 1),
            Buffer("sum", "output", "float32", 1),
        ),
        steps or (Memset("total", 0.0), *launches, Copy("total", "sum", 1)),
        output_shapes={"y": (n,), "sum": (1,)},
    )


def test_plan_steps_memset_copy_and_buffer_views_run_on_the_emulator(tmp_path):
    from capsule_core.backends.emu import EmuBackend
    from capsule_core.backends.execution import GuardedOutput

    (tmp_path / "steps.cu").write_text(STEPS)
    plan = _steps_plan()
    assert plan_problems(plan, {STEPS_REF.symbol: STEPS_REF}) == []
    assert [launch.symbol for launch in plan.kernel_launches] == ["capsule_steps_fwd"] * 3
    capsule = type("Capsule", (), {"symbols": (STEPS_REF,)})()
    x = np.arange(24, dtype=np.float32)
    outputs = {"y": GuardedOutput((24,)), "sum": GuardedOutput((1,))}
    executed = EmuBackend(family_dir=tmp_path, refs=(STEPS_REF,)).execute(capsule, plan, {"x": x}, outputs)
    assert outputs["y"].view.tolist() == (2 * x).tolist() and outputs["sum"].view.tolist() == [float(x.sum())]
    assert executed.overruns == {} and outputs["y"].guard_damage() == 0


def test_plan_steps_that_break_their_rules_are_named():
    from capsule_core.kernels.launch import Copy, Memset, View

    symbols = {STEPS_REF.symbol: STEPS_REF}
    launch = Launch("capsule_steps_fwd", (1, 1, 1), (32, 1, 1), (View("x", 0), "y", "total", 8))

    def problems(*steps):
        return plan_problems(_steps_plan(steps=steps), symbols)

    assert problems(Memset("x", 0.0), launch) == ["step 0: memset of x, a read-only input"]
    assert problems(Memset("nowhere"), launch) == ["step 0: memset of an unknown buffer 'nowhere'"]
    assert problems(launch, Copy("total", "sum", 2)) == ["step 1: copy of 2 elements runs past total or sum"]
    assert problems(launch, Copy("total", "x", 1)) == ["step 1: copy into x, a read-only input"]
    past = Launch("capsule_steps_fwd", (1, 1, 1), (32, 1, 1), (View("x", 25), "y", "total", 8))
    assert problems(past) == ["launch 0 (capsule_steps_fwd): x views x at element 25, past its 24"]


def test_plan_steps_run_under_a_sanitizer_too(tmp_path):
    from capsule_core.backends.execution import GuardedOutput
    from capsule_core.sanitize import engine as sanitize

    why = sanitize.unavailable("memcheck")
    if why:
        pytest.skip(why)
    (tmp_path / "steps.cu").write_text(STEPS)
    capsule = type("Capsule", (), {"symbols": (STEPS_REF,)})()
    x = np.arange(24, dtype=np.float32)
    outputs = {"y": GuardedOutput((24,)), "sum": GuardedOutput((1,))}
    sanitize.backend_for("memcheck", tmp_path, (STEPS_REF,)).execute(capsule, _steps_plan(), {"x": x}, outputs)
    assert outputs["y"].view.tolist() == (2 * x).tolist() and outputs["sum"].view.tolist() == [float(x.sum())]


CXX_LINKAGE = r"""
#include <cstddef>
#include <cstdint>
namespace lib {
template <class T>
__global__ void scale(const T* __restrict__ x, T* __restrict__ y, T c, size_t n) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = c * x[i];
}
template __global__ void scale<float>(const float* __restrict__, float* __restrict__, float, size_t);

__global__ void count_positive(const float* __restrict__ x, unsigned int* __restrict__ count, uint32_t n) {
    if (blockDim.x != 256) return;  // written for 256 threads, as such libraries are
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (x[i] > 0.0f) atomicAdd(count, 1u);
}
}  // namespace lib
"""
CXX_REFS = (
    NativeSymbolRef(
        "cuda/cxx.cu",
        "lib::scale<float>",
        ("const float* __restrict__ x", "float* __restrict__ y", "float c", "size_t n"),
        "C++",
    ),
    NativeSymbolRef(
        "cuda/cxx.cu",
        "lib::count_positive",
        ("const float* __restrict__ x", "unsigned int* __restrict__ count", "uint32_t n"),
        "C++",
    ),
)


def test_kernels_with_cpp_linkage_are_found_by_their_demangled_names(cache, tmp_path, monkeypatch):
    folder = tmp_path / "cxx"
    folder.mkdir()
    (folder / "cxx.cu").write_text(CXX_LINKAGE)
    compiled = kernels.compile_file(folder / "cxx.cu", "sm_90")
    names = [compiled.entry_name(ref) for ref in CXX_REFS]
    assert all(n and n.startswith("_Z") for n in names), names  # mangled .entry names
    assert [kernels.demangled_names(tuple(names))[n] for n in names] == [
        "void lib::scale<float>(float const*, float*, float, unsigned long)",
        "lib::count_positive(float const*, unsigned int*, unsigned int)",
    ]
    monkeypatch.setenv("CAPSULES_CUDA_DIR", str(folder))
    assert check_engine._symbol_problems(CXX_REFS, {"cuda/cxx.cu": {"sm_90": compiled}}) == []
    wrong = NativeSymbolRef(
        "cuda/cxx.cu", "lib::count_positive", ("const float* x", "unsigned int* count", "uint64_t n"), "C++"
    )
    assert check_engine._symbol_problems((wrong,), {"cuda/cxx.cu": {"sm_90": compiled}}) == [
        "lib::count_positive (sm_90): parameter 2 `uint64_t n` should be .u64 in PTX, is .u32"
    ]
    as_c = NativeSymbolRef("cuda/cxx.cu", "lib::count_positive", CXX_REFS[1].params)
    assert check_engine._symbol_problems((as_c,), {"cuda/cxx.cu": {"sm_90": compiled}})[0].startswith(
        'lib::count_positive: no extern "C" __global__ definition'
    )


def test_the_emulator_runs_kernels_with_cpp_linkage(tmp_path):
    from capsule_core.backends.emu import EmuBackend
    from capsule_core.backends.execution import GuardedOutput
    from capsule_core.kernels.launch import Memset

    (tmp_path / "cxx.cu").write_text(CXX_LINKAGE)
    x = np.float32([1, -2, 3, -4, 5, 0, 7])
    buffers = (
        Buffer("x", "input", "float32", 7),
        Buffer("y", "output", "float32", 7),
        Buffer("count", "output", "uint32", 1),
    )
    steps = (
        Launch("lib::scale<float>", (1, 1, 1), (256, 1, 1), ("x", "y", 0.5, 7)),
        Memset("count", 0),
        Launch("lib::count_positive", (1, 1, 1), (256, 1, 1), ("x", "count", 7)),
    )
    plan = LaunchPlan("cxx", "fwd", buffers, steps, output_shapes={"y": (7,), "count": (1,)})
    assert plan_problems(plan, {r.symbol: r for r in CXX_REFS}) == []
    outputs = {"y": GuardedOutput((7,)), "count": GuardedOutput((1,))}
    capsule = type("Capsule", (), {"symbols": CXX_REFS})()
    EmuBackend(family_dir=tmp_path, refs=CXX_REFS).execute(capsule, plan, {"x": x}, outputs)
    assert outputs["y"].view.tolist() == (0.5 * x).tolist() and outputs["count"].view.view(np.uint32).tolist() == [4]
