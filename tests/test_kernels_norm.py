"""cuda/norm.cu without a GPU: it compiles cleanly for sm_80 and sm_90 with the registry's entry
points and fits its launches; the kernels' per-element math (cuda/norm.cuh), run on the host in
the kernels' reduction order (member partials, warp butterflies, warps and parts in order), meets
each op's error model against the float64 reference; norm.cu itself runs the plans on a CPU
emulator (EMULATOR_H below, shared with the spectral and scan tests) bitwise like that host model,
within bounds and writing every output; the launch plans are legal for every sample."""

import ctypes
import dataclasses
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from capsule_core import registry
from capsule_core.backends.cpu import REFERENCE
from capsule_core.kernels import cuda_source_dir, find_nvcc
from capsule_core.launch import parse_param, plan_functions, plan_problems
from capsule_core.numerics import compare
from capsule_core.ops import get_spec
from capsule_core.ops.base import seeded_rng, shapes_of, validate
from capsule_core.plans import norm as plans
from hostmath import load

OPS = ("layer_norm", "batch_norm")
ARCHS = ("sm_80", "sm_90")
FLAGS = ("-std=c++17", "-O3", "-prec-div=true", "-prec-sqrt=true", "-ftz=false", "-fmad=true")
SOURCE = cuda_source_dir() / "norm.cu"
PTX_TYPES = {"float": "f32", "int64_t": "u64", "uint64_t": "u64", "int32_t": "u32"}
REGISTERS_PER_SM = 65536


def symbols(op):
    return {ref.symbol: ref for ref in registry.lookup(op).symbols}


ALL_SYMBOLS = {name: ref for op in OPS for name, ref in symbols(op).items()}


# -- the build ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """norm.cu compiled once per arch (in parallel), warnings as errors: (result, PTX, resources)."""
    def compile_for(arch):
        out = tmp_path_factory.mktemp(f"norm_{arch}")
        cmd = [str(find_nvcc().path), *FLAGS, f"-arch={arch}", "-Xptxas", "-v", "-Werror", "all-warnings",
               "-I", str(cuda_source_dir()), "-cubin", "-keep", "-keep-dir", str(out), "-o", str(out / "norm.cubin"),
               str(SOURCE)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        ptx = out / "norm.ptx"
        return arch, (result, ptx.read_text() if ptx.exists() else "", ptxas_report(result.stderr))
    with ThreadPoolExecutor(len(ARCHS)) as pool:
        return dict(pool.map(compile_for, ARCHS))


def ptxas_report(stderr: str) -> dict:
    """{kernel: (registers, stack frame bytes, spill store bytes, spill load bytes, static smem bytes)}."""
    report = {}
    for block in re.split(r"Compiling entry function ", stderr)[1:]:
        name = re.match(r"'(\w+)'", block)[1]
        frame, stores, loads = map(int, re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                                  block).groups())
        smem = re.search(r"(\d+) bytes smem", block)
        report[name] = (int(re.search(r"Used (\d+) registers", block)[1]), frame, stores, loads, int(smem[1]) if smem else 0)
    return report


def ptx_entries(ptx: str) -> dict:
    return {m[1]: re.findall(r"\.param \.(\w+) ", m[2]) for m in re.finditer(r"\.entry (\w+)\(([^)]*)\)", ptx)}


@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_without_warnings_or_spills(build, arch):
    result, _, report = build[arch]
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    assert set(report) == set(ALL_SYMBOLS), "every kernel of the file is a registered entry point"
    for name, (registers, frame, stores, loads, _) in report.items():
        assert stores == loads == frame == 0, f"{name} spills on {arch}"
        assert registers * plans.BLOCK <= REGISTERS_PER_SM, f"{name}: {registers} registers cannot run {plans.BLOCK} threads"


@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_entries_have_the_declared_parameter_lists(build, arch):
    entries = ptx_entries(build[arch][1])
    for name, ref in ALL_SYMBOLS.items():
        assert name in entries, f"no .entry {name} in the {arch} PTX"
        expected = ["u64" if p.pointer else PTX_TYPES[p.ctype] for p in map(parse_param, ref.params)]
        assert entries[name] == expected, f"{name}: PTX {entries[name]} for the declared {ref.params}"


def test_source_spells_out_each_declared_signature():
    source = re.sub(r"\s+", " ", re.sub(r"\(\s+", "(", SOURCE.read_text()))
    for name, ref in ALL_SYMBOLS.items():
        assert ref.path == "cuda/norm.cu"
        declaration = rf'extern "C" __global__ __launch_bounds__\([^)]*\) void {name}\({re.escape(", ".join(ref.params))}\)'
        assert re.search(declaration, source), f"{name}: the source does not declare {ref.params}"


def test_plan_constants_match_the_kernels():
    text = SOURCE.read_text()
    assert int(re.search(r"kWarpRowMax = (\d+);", text)[1]) == plans.WARP_ROW_MAX
    assert int(re.search(r"kMaxThreads = (\d+);", text)[1]) >= plans.BLOCK
    assert plans.BLOCK % 32 == 0 and plans.COLUMN_TILE * plans.ROW_LANES <= plans.BLOCK


# -- the per-element math and reduction order, on the host ----------------------------------------

F32P = ctypes.POINTER(ctypes.c_float)
I64P = ctypes.POINTER(ctypes.c_int64)
I64 = ctypes.c_int64


@pytest.fixture(scope="module")
def lib(host_build_dir):
    lib = load("norm_host", host_build_dir)
    sig = {
        "host_layer_norm_fwd": [F32P] * 6 + [I64, I64, ctypes.c_float, I64],
        "host_layer_norm_bwd": [F32P] * 6 + [I64, I64, ctypes.c_float, I64, I64, I64],
        "host_batch_norm_fwd": [F32P] * 6 + [I64, I64, I64, ctypes.c_float, I64, I64],
        "host_batch_norm_bwd": [F32P] * 6 + [I64, I64, I64, ctypes.c_float, I64, I64],
        "host_welford": [F32P, I64, F32P],
        "host_welford_split": [F32P, I64, I64, F32P],
        "host_norm_rows": [F32P] * 6 + [I64],
        "host_norm_dx": [F32P] * 6 + [I64],
        "host_channel_walk": [I64] * 5 + [I64P, I64P],
        "host_channel_next": [I64] * 5 + [I64P, I64P],
        "host_plane_walk": [I64] * 6 + [I64P],
        "host_part_range": [I64] * 3 + [I64P, I64P],
    }
    for name, argtypes in sig.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    return lib


def f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def ptr(a: np.ndarray):
    return a.ctypes.data_as(F32P if a.dtype == np.float32 else I64P)


def host_forward(lib, op, arrays, p, block=plans.BLOCK, parts=None):
    x, gamma, beta = (f32(arrays[k]) for k in ("x", "gamma", "beta"))
    y = np.full(x.shape, np.nan, np.float32)
    if op == "layer_norm":
        rows, cols = int(np.prod(x.shape[:-1])), x.shape[-1]
        mean, rstd = np.empty(rows, np.float32), np.empty(rows, np.float32)
        lib.host_layer_norm_fwd(ptr(x), ptr(gamma), ptr(beta), ptr(y), ptr(mean), ptr(rstd), rows, cols, p["eps"], block)
    else:
        n, c, s = x.shape[0], x.shape[1], int(np.prod(x.shape[2:]))
        parts = parts or plans.channel_parts(n * s, c)
        mean, rstd = np.empty(c, np.float32), np.empty(c, np.float32)
        lib.host_batch_norm_fwd(ptr(x), ptr(gamma), ptr(beta), ptr(y), ptr(mean), ptr(rstd), n, c, s, p["eps"], block, parts)
    return y


def host_vjp(lib, op, arrays, p, g, block=plans.BLOCK, parts=None):
    x, gamma, g = f32(arrays["x"]), f32(arrays["gamma"]), f32(g)
    channels = gamma.size
    dx = np.full(x.shape, np.nan, np.float32)
    dgamma, dbeta = np.full(channels, np.nan, np.float32), np.full(channels, np.nan, np.float32)
    if op == "layer_norm":
        rows, cols = int(np.prod(x.shape[:-1])), x.shape[-1]
        parts = parts or plans.column_parts(rows, cols)
        lib.host_layer_norm_bwd(ptr(x), ptr(gamma), ptr(g), ptr(dx), ptr(dgamma), ptr(dbeta), rows, cols, p["eps"], block,
                                parts, plans.ROW_LANES)
    else:
        n, s = x.shape[0], int(np.prod(x.shape[2:]))
        parts = parts or plans.channel_parts(n * s, channels)
        lib.host_batch_norm_bwd(ptr(x), ptr(gamma), ptr(g), ptr(dx), ptr(dgamma), ptr(dbeta), n, channels, s, p["eps"],
                                block, parts)
    return {"x": dx, "gamma": dgamma, "beta": dbeta}


def cases(spec, sizes=("small", "medium", "large")):
    out = []
    for size in sizes:
        out += spec.samples(size, seeded_rng(spec.name, size))
    return out + spec.edges()


def check_forward(lib, spec, sample, **launch):
    arrays, p, _ = validate(spec, sample.inputs, sample.params, np.float32)
    y = host_forward(lib, spec.name, arrays, p, **launch)
    r = REFERENCE.forward(spec, sample.inputs, **sample.params)
    m = REFERENCE.magnitude(spec, sample.inputs, **sample.params)
    n = spec.error.length(shapes_of(arrays), p)
    result = compare(y, r, m, spec.error, n, sample.worst_case)
    assert result.passed, f"{spec.name} forward {sample.summary()} {launch}: {result.reason} (worst {result.worst:.3g})"
    return result.worst


def check_vjp(lib, spec, sample, **launch):
    arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    g = seeded_rng(spec.name, f"g/{sample.case}").standard_normal(out_shape).astype(np.float32)
    got = host_vjp(lib, spec.name, arrays, p, g, **launch)
    r = REFERENCE.vjp(spec, sample.inputs, g, **sample.params)
    m = REFERENCE.vjp_magnitude(spec, sample.inputs, g, **sample.params)
    worst = 0.0
    for name in spec.differentiable:
        model = spec.vjp_error_for(name)
        result = compare(got[name], r[name], m[name], model, model.length(shapes_of(arrays), p), sample.worst_case)
        assert result.passed, f"{spec.name} d{name} {sample.summary()} {launch}: {result.reason} (worst {result.worst:.3g})"
        worst = max(worst, result.worst)
    return worst


@pytest.mark.parametrize("op", OPS)
def test_host_forward_meets_the_contract(lib, op):
    """Every sample (small to large) and edge, with the plan's block and parts."""
    spec = get_spec(op)
    worst = max(check_forward(lib, spec, s) for s in cases(spec))
    assert worst <= 0.5, f"{op}: the worst error uses {worst:.2f} of the bound"


@pytest.mark.parametrize("op", OPS)
def test_host_vjp_meets_the_contract(lib, op):
    spec = get_spec(op)
    worst = max(check_vjp(lib, spec, s) for s in cases(spec))
    assert worst <= 0.5, f"{op}: the worst error uses {worst:.2f} of the bound"


@pytest.mark.parametrize("op", OPS)
def test_host_math_under_other_launch_shapes(lib, op):
    """Smaller blocks and other part counts: the row kernels' streamed (Welford) path for rows
    past 8·64 columns, and the statistics merged across uneven parts."""
    spec = get_spec(op)
    for sample in cases(spec, ("small", "medium")):
        for block, parts in ((64, 3), (32, 1), (128, 7)):
            check_forward(lib, spec, sample, block=block, parts=parts)
            check_vjp(lib, spec, sample, block=block, parts=parts)


def test_host_layer_norm_row_paths_are_all_exercised():
    """The samples reach the warp path (vector and scalar), the cached block path and the
    streamed path under the plan's block."""
    spec = get_spec("layer_norm")
    widths = {s.inputs["x"].shape[-1] for s in cases(spec)}
    assert any(w <= plans.WARP_ROW_MAX and w % 4 == 0 for w in widths)
    assert any(w <= plans.WARP_ROW_MAX and w % 4 for w in widths)
    assert any(plans.WARP_ROW_MAX < w <= 8 * plans.BLOCK for w in widths)
    assert any(w > 8 * plans.BLOCK for w in widths)


def test_constant_rows_have_exact_statistics(lib):
    """Welford on equal values keeps the mean exact and M2 zero, split or not."""
    out = np.empty(2, np.float32)
    for c in (0.1, -3.7, 1e4, 1e-40, 0.0):
        v = np.full(37, c, np.float32)
        lib.host_welford(ptr(v), v.size, ptr(out))
        assert out[0] == np.float32(c) and out[1] == 0.0
        lib.host_welford_split(ptr(v), v.size, 11, ptr(out))
        assert out[0] == np.float32(c) and out[1] == 0.0


def test_welford_merge_matches_float64_statistics(lib):
    rng = seeded_rng("norm", "welford")
    out = np.empty(2, np.float32)
    for n, offset in ((1, 0.0), (2, 0.0), (100, 0.0), (1000, 1e4), (4099, -3.0)):
        v = f32(offset + rng.standard_normal(n))
        v64 = v.astype(np.float64)
        mean, m2 = v64.mean(), ((v64 - v64.mean()) ** 2).sum()
        for split in (0, 1, n // 3, n):
            lib.host_welford_split(ptr(v), n, split, ptr(out))
            # Welford's error model (ops/norm.py): the mean within c·u·mean|x|, M2 within c·u·(M2 + n·A·s).
            c = 10 + 10 * np.sqrt(n)
            scale = np.abs(v64).mean()
            assert abs(out[0] - mean) <= c * 2**-24 * scale + 1e-45
            assert abs(out[1] - m2) <= c * 2**-24 * (m2 + n * scale * np.sqrt(m2 / n)) + 1e-45


def test_normalise_affine_and_backward_formulas(lib):
    """y = x̂·gamma + beta and dx = (ĝ − m1 − x̂·m2)·rstd elementwise: within 3 roundings."""
    rng = seeded_rng("norm", "formulas")
    n = 4096
    x, mean, rstd, gamma, beta = (f32(rng.standard_normal(n) * s) for s in (3.0, 1.0, 2.0, 1.5, 0.5))
    rstd = np.abs(rstd) + np.float32(0.1)
    y = np.empty(n, np.float32)
    lib.host_norm_rows(ptr(x), ptr(mean), ptr(rstd), ptr(gamma), ptr(beta), ptr(y), n)
    x64, xhat = x.astype(np.float64), (x.astype(np.float64) - mean) * rstd
    ref = xhat * gamma + beta
    mag = (np.abs(x64) + np.abs(mean)) * rstd * np.abs(gamma) + np.abs(beta)
    assert np.all(np.abs(y - ref) <= 3 * 2**-24 * mag)
    ghat, m1, m2 = (f32(rng.standard_normal(n)) for _ in range(3))
    xh = f32(xhat)
    dx = np.empty(n, np.float32)
    lib.host_norm_dx(ptr(xh), ptr(ghat), ptr(rstd), ptr(m1), ptr(m2), ptr(dx), n)
    ref = (ghat.astype(np.float64) - m1 - xh.astype(np.float64) * m2) * rstd
    mag = (np.abs(ghat) + np.abs(m1) + np.abs(xh.astype(np.float64) * m2)) * rstd
    assert np.all(np.abs(dx - ref) <= 3 * 2**-24 * mag)


@pytest.mark.parametrize("C,S", [(1, 1), (3, 1), (1, 5), (4, 7), (64, 1), (5, 1024)])
def test_index_walkers_agree_with_division(lib, C, S):
    total = 3 * C * S + 5
    count = 40
    c, s = np.empty(count, np.int64), np.empty(count, np.int64)
    for first in (0, 1, S, C * S - 1, 2 * C * S + 3):
        for step in (1, 3, S, C * S, 4 * 256, 7 * C * S + 2):
            lib.host_channel_walk(first, step, C, S, count, ptr(c), ptr(s))
            i = first + step * np.arange(count)
            assert (c == (i // S) % C).all() and (s == i % S).all(), (first, step)
            for ch in (0, C - 1):
                offsets = np.empty(count, np.int64)
                lib.host_plane_walk(first, step, ch, C, S, count, ptr(offsets))
                assert (offsets == ((i // S) * C + ch) * S + i % S).all(), (first, step, ch)
        lib.host_channel_next(first % S, (first // S) % C, C, S, count, ptr(c), ptr(s))
        i = first + np.arange(count)
        assert (c == (i // S) % C).all() and (s == i % S).all()
    assert total > 0


def test_parts_cover_each_range_once_in_order(lib):
    lo, hi = np.empty(1, np.int64), np.empty(1, np.int64)
    for total, parts in ((0, 1), (1, 1), (10, 3), (10, 10), (10, 17), (4096, 7)):
        covered = []
        for p in range(parts):
            lib.host_part_range(total, parts, p, ptr(lo), ptr(hi))
            assert 0 <= lo[0] <= hi[0] <= total
            covered += range(lo[0], hi[0])
        assert covered == list(range(total))


# -- the kernels themselves, on a CPU emulator ---------------------------------------------------------

EMULATOR_H = r"""
// A CPU emulator of the CUDA features the norm, spectral and scan kernels use, so that their .cu
// files run unchanged on a machine without a GPU (g++ -include this header): every thread of a
// block is a fiber (ucontext) run round-robin; __syncthreads is a barrier of the block's fibers,
// __shfl_xor_sync one of the warp's 32 (lanes by linear thread index); blocks run one after
// another over 2-D grids and blocks; __shared__ is static (one block at a time); dynamic shared
// memory through spectral.cu's CAPSULE_EMU_DYNAMIC_SHARED_* hook. A barrier or shuffle reached
// divergently deadlocks, which the scheduler reports. Logic only: host libm, no timing, no races.
#pragma once
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
template <class T>
inline T __ldg(const T* p) { return *p; }
inline void sincospi(double a, double* s, double* c) { *s = std::sin(M_PI * a); *c = std::cos(M_PI * a); }
inline void sincospif(float a, float* s, float* c) {
    *s = static_cast<float>(std::sin(M_PI * static_cast<double>(a)));
    *c = static_cast<float>(std::cos(M_PI * static_cast<double>(a)));
}

namespace emu {
struct Barrier {
    unsigned size = 0, arrived = 0;
    unsigned long generation = 0;
};
struct Fiber {
    ucontext_t context;
    dim3 thread;
    unsigned linear = 0;
    bool done = false;
};
struct Warp {
    Barrier barrier;
    uint64_t exchange[32];
};
constexpr size_t kStack = 64 * 1024;
inline ucontext_t scheduler;
inline std::vector<std::vector<char>> stacks;
inline Fiber* current = nullptr;
inline Barrier block_barrier;
inline std::vector<Warp> warps;
inline bool progress = false, deadlocked = false;
inline dim3 block_index, block_dim, grid_dim;
inline std::vector<unsigned char> dynamic_shared;
inline unsigned dynamic_bytes = 0;

inline void yield() { swapcontext(&current->context, &scheduler); }

inline void wait(Barrier& b) {
    const unsigned long generation = b.generation;
    progress = true;
    if (++b.arrived == b.size) {
        b.arrived = 0;
        ++b.generation;
        return;
    }
    while (b.generation == generation) yield();
}

inline uint64_t shfl_xor(uint64_t v, int offset) {
    const unsigned lane = current->linear & 31u;
    Warp& w = warps[current->linear >> 5];
    wait(w.barrier);
    w.exchange[lane] = v;
    wait(w.barrier);
    return w.exchange[lane ^ static_cast<unsigned>(offset)];
}

template <class F>
struct Entry {
    static inline F* body = nullptr;
    static void run() {
        (*body)();
        current->done = true;
        progress = true;
        swapcontext(&current->context, &scheduler);
    }
};

template <class... P, class... A>
bool launch(dim3 grid, dim3 block, unsigned shared, void (*kernel)(P...), A... args) {
    deadlocked = false;
    grid_dim = grid;
    block_dim = block;
    dynamic_bytes = shared;
    dynamic_shared.assign(shared + 16, 0);
    auto body = [&]() { kernel(args...); };
    using Body = decltype(body);
    Entry<Body>::body = &body;
    const unsigned n = block.x * block.y;
    for (unsigned by = 0; by < grid.y && !deadlocked; ++by) {
        for (unsigned bx = 0; bx < grid.x && !deadlocked; ++bx) {
            block_index = dim3{bx, by, 1};
            std::vector<Fiber> threads(n);
            if (stacks.size() < n) stacks.resize(n);
            block_barrier = Barrier{n, 0, 0};
            warps.assign((n + 31) / 32, Warp{});
            for (unsigned w = 0; w < warps.size(); ++w) warps[w].barrier.size = (w + 1) * 32 <= n ? 32 : n - w * 32;
            for (unsigned t = 0; t < n; ++t) {
                Fiber& f = threads[t];
                f.thread = dim3{t % block.x, t / block.x, 1};
                f.linear = t;
                stacks[t].resize(kStack);
                getcontext(&f.context);
                f.context.uc_stack.ss_sp = stacks[t].data();
                f.context.uc_stack.ss_size = kStack;
                f.context.uc_link = &scheduler;
                makecontext(&f.context, &Entry<Body>::run, 0);
            }
            unsigned live = n;
            while (live > 0) {
                progress = false;
                live = 0;
                for (Fiber& f : threads) {
                    if (f.done) continue;
                    current = &f;
                    swapcontext(&scheduler, &f.context);
                    if (!f.done) ++live;
                }
                if (live > 0 && !progress) {
                    deadlocked = true;
                    break;
                }
            }
        }
    }
    return !deadlocked;
}
}  // namespace emu

#define threadIdx (emu::current->thread)
#define blockIdx (emu::block_index)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
#define CAPSULE_EMU_DYNAMIC_SHARED_BYTES (emu::dynamic_bytes)
#define CAPSULE_EMU_DYNAMIC_SHARED_PTR (emu::dynamic_shared.data())

inline void __syncthreads() { emu::wait(emu::block_barrier); }

inline float __shfl_xor_sync(unsigned, float v, int offset) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    bits = emu::shfl_xor(bits, offset);
    float r;
    std::memcpy(&r, &bits, sizeof r);
    return r;
}

inline long long __shfl_xor_sync(unsigned, long long v, int offset) {
    return static_cast<long long>(emu::shfl_xor(static_cast<uint64_t>(v), offset));
}
"""

GUARD = 16
GUARD_BITS = np.uint32(0x7F8BEEF0)
FILL_BITS = np.uint32(0x7FC0DEAD)
EMU_CTYPES = {"float": ctypes.c_float, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "int32_t": ctypes.c_int32}


class Emulator:
    """cuda/<family>.cu built with g++ against EMULATOR_H; runs LaunchPlans the way the cuda backend
    will: guard-banded buffers, outputs and workspaces pre-filled with a NaN sentinel, inputs
    checked bitwise intact afterwards. Grids are capped at `max_grid` (x, y) blocks, which also
    exercises the kernels' grid-stride loops."""

    def __init__(self, family: str, build_dir, max_grid=(3, 2)):
        self.max_grid = max_grid
        build_dir = Path(build_dir)
        refs = {r.symbol: r for c in registry.CATALOG if c.family == family for r in c.symbols}
        (build_dir / "capsule_emulator.h").write_text(EMULATOR_H)
        lines = [f'#include "{family}.cu"']
        for symbol, ref in sorted(refs.items()):
            names = ", ".join(parse_param(p).name for p in ref.params)
            lines.append(f'extern "C" int emu_{symbol}(unsigned gx, unsigned gy, unsigned bx, unsigned by, unsigned shared, '
                         f'{", ".join(ref.params)}) {{\n    return emu::launch(dim3{{gx, gy, 1}}, dim3{{bx, by, 1}}, shared, '
                         f'&{symbol}, {names}) ? 1 : 0;\n}}')
        driver = build_dir / f"{family}_emu.cpp"
        driver.write_text("\n".join(lines) + "\n")
        target = build_dir / f"lib{family}_emu.so"
        cmd = [shutil.which("g++") or "c++", "-std=c++20", "-O2", "-shared", "-fPIC", "-include",
               str(build_dir / "capsule_emulator.h"), "-I", str(cuda_source_dir()), "-o", str(target), str(driver)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, f"emulator build of {family} failed:\n{result.stderr}"
        self.lib = ctypes.CDLL(str(target))
        for symbol, ref in refs.items():
            fn = getattr(self.lib, f"emu_{symbol}")
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_uint] * 5 + [ctypes.c_void_p if p.pointer else EMU_CTYPES[p.ctype]
                                                 for p in map(parse_param, ref.params)]

    @staticmethod
    def _slot(dtype, count: int, misalign: int):
        """(storage, start): `count` elements starting `misalign` elements past a 64-byte boundary,
        guard bands of at least GUARD elements on each side."""
        itemsize = np.dtype(dtype).itemsize
        storage = np.empty(count + 2 * GUARD + 64, dtype=dtype)
        storage.view(np.uint32)[:] = GUARD_BITS
        first = storage.ctypes.data + GUARD * itemsize
        return storage, GUARD + ((misalign * itemsize - first) % 64) // itemsize

    def run(self, plan, arrays: dict, misalign: dict | None = None) -> dict:
        misalign = misalign or {}
        slots = {}
        for b in plan.buffers:
            dtype = np.float32 if b.dtype == "float32" else np.int64
            storage, start = self._slot(dtype, b.elements, misalign.get(b.name, 0))
            view = storage[start:start + b.elements]
            if b.role == "meta":
                view[:] = np.asarray(plan.host_data[b.name], dtype=dtype).reshape(-1)
            elif b.role == "input":
                view[:] = np.asarray(arrays[b.name], dtype=dtype).reshape(-1)
            else:
                view.view(np.uint32)[:] = FILL_BITS
            slots[b.name] = (storage, start, b.elements)
        before = {b.name: slots[b.name][0].copy() for b in plan.buffers if b.role in ("input", "meta")}
        for launch in plan.launches:
            storage_args = [slots[a][0].ctypes.data + slots[a][0].itemsize * slots[a][1] if isinstance(a, str) else a
                            for a in launch.args]
            grid = (min(launch.grid[0], self.max_grid[0]), min(launch.grid[1], self.max_grid[1]))
            ok = getattr(self.lib, f"emu_{launch.symbol}")(*grid, launch.block[0], launch.block[1], launch.shared_bytes,
                                                            *storage_args)
            assert ok, f"{launch.symbol}: threads deadlocked at a barrier or a shuffle"
        for name, (storage, start, count) in slots.items():
            bits = storage.view(np.uint32)
            width = storage.itemsize // 4
            assert (bits[:start * width] == GUARD_BITS).all() and (bits[(start + count) * width:] == GUARD_BITS).all(), \
                f"{plan.op} {plan.direction}: a write outside buffer {name}"
        for name, value in before.items():
            assert np.array_equal(value.view(np.uint8), slots[name][0].view(np.uint8)), f"{plan.op}: input {name} changed"
        return {name: slots[name][0][slots[name][1]:slots[name][1] + slots[name][2]].copy().reshape(shape)
                for name, shape in plan.output_shapes.items()}


@dataclasses.dataclass
class Emulated:
    """One case run on the emulator: the forward plan, then the backward fed its result."""

    arrays: dict
    params: dict
    y: np.ndarray
    g: np.ndarray
    grads: dict


def emulate(emulator, op: str, sample, misalign: dict | None = None) -> Emulated:
    spec = get_spec(op)
    forward, backward = plan_functions(registry.lookup(op))
    arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
    y = emulator.run(forward(arrays, p), arrays, misalign)["out"]
    g = seeded_rng(op, f"g/{sample.case}").standard_normal(out_shape).astype(np.float32)
    grads = emulator.run(backward(arrays, p), {**arrays, "out": y, "g": g}, misalign)
    return Emulated(arrays, p, y, g, grads)


def contract_problems(op: str, sample, run: Emulated) -> list[str]:
    """Every output element written, and within the op's error model of the reference."""
    spec = get_spec(op)
    shapes = shapes_of(run.arrays)
    r_grads = REFERENCE.vjp(spec, sample.inputs, run.g, **sample.params)
    m_grads = REFERENCE.vjp_magnitude(spec, sample.inputs, run.g, **sample.params)
    results = [("y", run.y, REFERENCE.forward(spec, sample.inputs, **sample.params),
                REFERENCE.magnitude(spec, sample.inputs, **sample.params), spec.error)]
    results += [(f"d{k}", run.grads[f"d{k}"], r_grads[k], m_grads[k], spec.vjp_error_for(k)) for k in spec.differentiable]
    problems = []
    for name, got, ref, mag, model in results:
        unwritten = np.asarray(got, np.float32).view(np.uint32) == FILL_BITS
        if unwritten.any():
            problems.append(f"{sample.case}: {name} left {int(unwritten.sum())} elements unwritten")
            continue
        result = compare(got, ref, mag, model, model.length(shapes, run.params), sample.worst_case)
        if not result.passed:
            problems.append(f"{sample.case}: {name} {result.reason}")
    return problems


def emulated_problems(emulator, op: str, sample, misalign: dict | None = None) -> list[str]:
    return contract_problems(op, sample, emulate(emulator, op, sample, misalign))


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++ for the CPU emulator")
    return Emulator("norm", tmp_path_factory.mktemp("norm_emu"))


def emulated_cases(spec):
    """Small samples, the medium ones that reach other row paths, and every edge."""
    medium = [s for s in spec.samples("medium", seeded_rng(spec.name, "medium")) if s.inputs["x"].size <= 80_000]
    return spec.samples("small", seeded_rng(spec.name, "small")) + medium + spec.edges()


@pytest.mark.parametrize("op", OPS)
def test_kernels_on_the_emulator(emulator, lib, op):
    """norm.cu itself, as launched by the plans: every output written, nothing outside, inputs
    intact, values within the error model, with aligned buffers (the float4 paths) and misaligned
    ones. Aligned, the results are bitwise those of the host harness's model, so the host tests
    above test the kernels' own rounding."""
    spec = get_spec(op)
    problems = []
    for sample in emulated_cases(spec):
        run = emulate(emulator, op, sample)
        problems += contract_problems(op, sample, run)
        assert bits(run.y) == bits(host_forward(lib, op, run.arrays, run.params)), f"{op} {sample.case}"
        model = host_vjp(lib, op, run.arrays, run.params, run.g)
        for name in spec.differentiable:
            assert bits(run.grads[f"d{name}"]) == bits(model[name]), f"{op} d{name} {sample.case}"
        problems += emulated_problems(emulator, op, sample, {"x": 1, "out": 3, "dx": 1})
    assert problems == []


def bits(a) -> list:
    return np.ascontiguousarray(a, np.float32).view(np.uint32).ravel().tolist()


# -- launch plans -----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_plans_are_legal_for_every_sample(op, build):
    spec = get_spec(op)
    capsule = registry.lookup(op)
    forward_plan, backward_plan = plan_functions(capsule)
    assert plans.PLANS[op] == (forward_plan, backward_plan)
    syms = symbols(op)
    resources = {arch: build[arch][2] for arch in ARCHS}
    for sample in cases(spec):
        arrays, p, out_shape = validate(spec, sample.inputs, sample.params, np.float32)
        g = np.zeros(out_shape, np.float32)
        grads = {f"d{k}": v.shape for k, v in REFERENCE.vjp(spec, sample.inputs, g, **sample.params).items()}
        fwd, bwd = forward_plan(arrays, p), backward_plan(arrays, p)
        for arch in ARCHS:
            for plan in (fwd, bwd):
                assert plan_problems(plan, syms, arch) == [], f"{op} {plan.direction} {sample.summary()}"
                for launch in plan.launches:
                    threads = int(np.prod(launch.block))
                    registers, _, _, _, smem = resources[arch][launch.symbol]
                    assert threads % 32 == 0 and registers * threads <= REGISTERS_PER_SM, launch
                    assert smem + launch.shared_bytes <= 48 * 1024, launch
        assert dict(fwd.output_shapes) == {"out": REFERENCE.forward(spec, sample.inputs, **sample.params).shape}
        assert dict(bwd.output_shapes) == grads
        assert {b.name for b in fwd.buffers if b.role == "input"} == {t.name for t in spec.inputs}
        assert {b.name for b in bwd.buffers if b.role == "input"} <= {t.name for t in spec.inputs} | {"g"}


def test_plans_shape_the_launches_as_the_kernels_expect():
    spec = get_spec("layer_norm")
    for shape, per_block in (((4096, 64), 8), ((10, 256), 8), ((10, 257), 1), ((3, 100_000), 1)):
        arrays, p, _ = validate(spec, {"x": np.zeros(shape, np.float32), "gamma": np.ones(shape[-1], np.float32),
                                       "beta": np.zeros(shape[-1], np.float32)}, {}, np.float32)
        (launch,) = plans.layer_norm_forward(arrays, p).launches
        assert launch.block == (plans.BLOCK, 1, 1)
        assert launch.grid[0] == min(plans.MAX_GRID_BLOCKS, -(-shape[0] // per_block))
        bwd = plans.layer_norm_backward(arrays, p)
        assert [launch.symbol for launch in bwd.launches] == [
            "capsule_layer_norm_bwd_x", "capsule_layer_norm_bwd_partials", "capsule_layer_norm_bwd_params"]
        parts = bwd.launches[1].args[-1]
        assert bwd.buffer("partial").elements == 2 * parts * shape[-1] and bwd.launches[1].grid[1] == parts
    spec = get_spec("batch_norm")
    arrays, p, _ = validate(spec, {"x": np.zeros((16, 64, 32, 32), np.float32), "gamma": np.ones(64, np.float32),
                                   "beta": np.zeros(64, np.float32)}, {}, np.float32)
    fwd = plans.batch_norm_forward(arrays, p)
    assert [launch.args[-1] for launch in fwd.launches] == [0, 1, 2]
    assert fwd.launches[0].grid[:2] == (64, fwd.launches[0].args[-3])
    assert fwd.buffer("partial").elements == 2 * 64 * fwd.launches[0].args[-3]


def test_planted_launch_faults_are_caught():
    spec = get_spec("batch_norm")
    arrays, p, _ = validate(spec, {"x": np.zeros((2, 3, 4), np.float32), "gamma": np.ones(3, np.float32),
                                   "beta": np.zeros(3, np.float32)}, {}, np.float32)
    plan = plans.batch_norm_forward(arrays, p)
    syms = symbols("batch_norm")
    launch = plan.launches[0]

    def problems(**changes):
        return plan_problems(dataclasses.replace(plan, launches=(dataclasses.replace(launch, **changes),)), syms)

    assert plan_problems(plan, syms) == []
    assert any("2048 threads" in m for m in problems(block=(2048, 1, 1)))
    assert any("12 arguments for 13" in m for m in problems(args=launch.args[:-1]))
    assert any("writable" in m for m in problems(args=("x", "gamma", "beta", "x", *launch.args[4:])))
    assert any("stage" in m for m in problems(args=(*launch.args[:-1], 0.5)))
    assert any("not declared" in m for m in problems(symbol="capsule_layer_norm_fwd"))
    assert any("grid dimension 1" in m for m in problems(grid=(3, 70_000, 1)))
