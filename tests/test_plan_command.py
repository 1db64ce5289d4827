"""`capsules plan`: the occupancy rules against hand-computed cases, the launches of the issue-15
reference shapes, the JSON document, the device it is judged on, and the usage errors."""

import json
import tracemalloc

import pytest
from typer.testing import CliRunner

from capsule_core.backends import cuda
from capsule_core.errors import EnvironmentMissing, ParamError, ShapeError
from capsule_core.explain import engine as explain
from capsule_core.kernels.occupancy import ARCHES, occupancy
from cli.app import app

runner = CliRunner()
SM80, SM90 = ARCHES["sm_80"], ARCHES["sm_90"]
NO_GPU = cuda.CudaProbe(None, None, (), "test: no GPU")


def run(*args):
    return runner.invoke(app, ["plan", *args])


@pytest.fixture
def no_gpu(monkeypatch):
    """The reference device whatever this machine has, so the figures below hold everywhere."""
    monkeypatch.setattr(cuda, "probe", lambda: NO_GPU)


# -- the occupancy calculator ------------------------------------------------------------------


def test_full_occupancy_ties_warps_and_registers():
    """sm_90, 256 threads, 32 registers, no shared memory: 32 x 32 = 1024 registers per warp,
    16384 / 1024 = 16 warps per sub-partition, 64 per SM, 64 / 8 = 8 blocks; the warp slots
    (64 / 8) allow 8 too. The calculator: 8 blocks, 100 %, limited by warps and registers."""
    occ = occupancy(SM90, 256, 32)
    assert (occ.blocks_per_sm, occ.fraction, occ.limiters) == (8, 1.0, ("warps", "registers"))
    assert occ.shared_per_block == 1024  # the reserved kilobyte alone


def test_register_bound():
    """128 registers: 4096 per warp, 4 warps per sub-partition, 16 per SM: 2 blocks of 8 warps, 25 %."""
    occ = occupancy(SM90, 256, 128)
    assert (occ.blocks_per_sm, occ.fraction, occ.limiters) == (2, 0.25, ("registers",))


def test_register_allocation_unit_rounds_each_warp_up():
    """sm_80, 256 threads, 37 registers: 37 x 32 = 1184, rounded to 1280 per warp; 16384 / 1280 =
    12 warps per sub-partition (not 13.8), 48 per SM: 6 blocks, 75 % (the calculator's figure)."""
    occ = occupancy(SM80, 256, 37)
    assert (occ.blocks_per_sm, occ.fraction, occ.limiters) == (6, 0.75, ("registers",))


def test_the_reviews_layer_norm_figure():
    """80 registers (layer_norm_bwd_x): 2560 per warp, 6 warps per sub-partition, 24 per SM: 3
    blocks of 256 threads, 768 threads per SM, 37.5 % (../shared/perf/kernel-review.md)."""
    occ = occupancy(SM90, 256, 80)
    assert (occ.blocks_per_sm, occ.active_warps, occ.fraction) == (3, 24, 0.375)


def test_shared_memory_bound():
    """256 threads, 32 registers, 48 KiB dynamic: 49152 + 1024 reserved = 50176 bytes per block
    (a multiple of 128). sm_90: 233472 / 50176 = 4 blocks, 50 %; sm_80: 167936 / 50176 = 3, 37.5 %."""
    for limits, blocks, fraction in ((SM90, 4, 0.5), (SM80, 3, 0.375)):
        occ = occupancy(limits, 256, 32, dynamic_shared=48 * 1024)
        assert (occ.blocks_per_sm, occ.fraction, occ.limiters) == (blocks, fraction, ("shared memory",))
        assert occ.shared_per_block == 50176


def test_static_and_dynamic_shared_memory_add_and_round_to_128():
    """16.5 KiB static + 100 bytes dynamic + 1 KiB: 17996, rounded to 18048; 233472 / 18048 = 12."""
    occ = occupancy(SM90, 64, 32, static_shared=16896, dynamic_shared=100)
    assert occ.shared_per_block == 18048 and occ.limits["shared memory"] == 12


def test_opt_in_shared_memory_up_to_the_per_block_maximum():
    """227 KiB dynamic + the reserved 1 KiB is exactly the SM's 228 KiB: one block. One byte more
    cannot launch; below 48 KiB no opt-in is needed."""
    assert occupancy(SM90, 128, 32, dynamic_shared=227 * 1024).blocks_per_sm == 1
    refused = occupancy(SM90, 128, 32, dynamic_shared=227 * 1024 + 1)
    assert refused.blocks_per_sm == 0 and refused.fraction == 0 and "shared memory" in refused.refusal
    assert occupancy(SM80, 128, 32, dynamic_shared=164 * 1024).blocks_per_sm == 0


def test_partial_warps_and_the_block_limit():
    """96 threads are 3 warps: 64 // 3 = 21 blocks, 63 of 64 warps. 32 threads with 16
    registers: the 32-block limit binds before the 64 warp slots."""
    assert occupancy(SM90, 96, 32).blocks_per_sm == 21
    small = occupancy(SM90, 32, 16)
    assert (small.blocks_per_sm, small.limiters, small.fraction) == (32, ("blocks",), 0.5)


def test_register_file_per_block_as_the_hardware_counts_it():
    """288 threads (9 warps) of 200 registers: 6400 per warp, 57600 per block fits 64K, but the
    hardware rounds the warps up to the 4 sub-partitions (12 x 6400 = 76800): it cannot launch,
    as cudaOccMaxActiveBlocksPerMultiprocessor says. 1024 threads of 255 registers neither."""
    for threads, regs in ((288, 200), (1024, 255)):
        occ = occupancy(SM90, threads, regs)
        assert occ.blocks_per_sm == 0 and "registers per block" in occ.refusal
    assert occupancy(SM90, 2048, 16).refusal.startswith("2048 threads per block")


# -- the reference shapes of issue 15 ------------------------------------------------------------

REFERENCE = {
    "linear": ["linear", "--input", "x=8x4096", "--input", "w=4096x4096"],
    "softmax-long-rows": ["softmax", "--input", "x=32x65536"],
    "softmax-square": ["softmax", "--input", "x=4096x4096"],
    "layer_norm-fwd": ["layer_norm", "--input", "x=4096x8192"],
    "layer_norm-bwd": ["layer_norm", "--input", "x=4096x8192", "--direction", "bwd"],
    "reduce_sum": ["reduce_sum", "--input", "x=268435456"],
    "matmul": ["matmul", "--input", "a=4096x4096", "--input", "b=4096x4096"],
    "conv": ["conv", "--input", "x=32x64x224x224", "--input", "w=64x64x3x3", "--param", "padding=1"],
    "fft_fno": ["fft_fno", "--input", "x=20x4096x64", "--input", "w_re=16x64x64"],
}


@pytest.mark.parametrize("case", list(REFERENCE))
def test_reference_shapes_plan(case, no_gpu):
    result = run(*REFERENCE[case], "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    op = REFERENCE[case][0]
    assert doc["schema"] == "capsules.plan" and doc["op"] == op and doc["problems"] == []
    assert doc["device"]["name"] == "H200 SXM" and doc["device"]["multiprocessors"] == 132
    assert doc["launches"], "the plan has launches"
    for launch in doc["launches"]:
        assert launch["symbol"].startswith(f"capsule_{op}_")
        assert launch["blocks"] == launch["grid"][0] * launch["grid"][1] * launch["grid"][2]
        assert launch["sms_used"] == min(launch["blocks"], 132)
        if launch["registers"] is None:  # no nvcc: the note says why
            assert launch["note"].startswith("not compiled")
        else:
            occ = launch["occupancy"]
            assert 0 < occ["fraction"] <= 1 and occ["blocks_per_sm"] >= 1
            assert launch["waves"] == pytest.approx(launch["blocks"] / (occ["blocks_per_sm"] * 132))
    roof = doc["roofline"]
    assert roof["floor_seconds"] == max(roof["memory_seconds"], roof["compute_seconds"] or 0) > 0


def test_linear_infers_the_bias_and_reads_the_cost_model(no_gpu):
    result = run(*REFERENCE["linear"])
    assert result.exit_code == 0
    out = result.stdout
    assert "inputs: x(8,4096) w(4096,4096) b(4096) (b inferred from w)" in out
    assert "capsule_linear_fwd" in out and "H200 SXM, sm_90, 132 SMs" in out
    assert "no GPU here (test: no GPU)" in out
    # the cost model: 4 (8*4096 + 4096*4096 + 4096) bytes read, 4*8*4096 written, 2*8*4096*4096 + 8*4096 flops
    doc = json.loads(run(*REFERENCE["linear"], "--json").stdout)
    roof = doc["roofline"]
    assert roof["bytes"] == 4 * (8 * 4096 + 4096 * 4096 + 4096) + 4 * 8 * 4096
    assert roof["flops"] == 2 * 8 * 4096 * 4096 + 8 * 4096
    assert roof["memory_seconds"] == pytest.approx(roof["bytes"] / 4.8e12)
    assert roof["compute_seconds"] == pytest.approx(roof["flops"] / (132 * 128 * 2 * 1.98e9))
    assert roof["bound"] == "memory" and "memory-bound" in out and "nominal HBM3e" in out


def test_backward_has_a_bytes_floor_from_the_plan(no_gpu):
    doc = json.loads(run(*REFERENCE["layer_norm-bwd"], "--json").stdout)
    roof = doc["roofline"]
    # reads x, gamma, g; writes dx, dgamma, dbeta (workspaces are not compulsory traffic)
    assert roof["bytes"] == 4 * (3 * 4096 * 8192 + 3 * 8192)
    assert roof["flops"] is None and roof["bound"] is None and "no backward flop model" in roof["basis"]
    assert set(doc["outputs"]) == {"dx", "dgamma", "dbeta"}


def test_json_and_text_show_the_same_launches(no_gpu):
    args = REFERENCE["fft_fno"]
    doc = json.loads(run(*args, "--json").stdout)
    text = run(*args).stdout.splitlines()
    rule = next(i for i, line in enumerate(text) if line.startswith("-  "))
    rows = [line.split() for line in text[rule + 1 : rule + 1 + len(doc["launches"])]]
    assert [(r[1], r[2], r[3]) for r in rows] == [
        (launch["symbol"], "x".join(map(str, launch["grid"])), "x".join(map(str, launch["block"])))
        for launch in doc["launches"]
    ]
    parts = [launch["arguments"].get("parts") for launch in doc["launches"]]
    assert parts == [None, 52, 52, None, None] and "parts=52)" in "\n".join(text)
    assert doc["inputs"]["w_im"] == [16, 64, 64] and doc["inferred"] == {"w_im": ["w_re", "x"]}


def test_huge_shapes_allocate_nothing_of_their_size(no_gpu):
    """x(32,64,224,224) is 411 MB and 2^28 floats 1 GiB: the plan reads shapes only."""
    tracemalloc.start()
    try:
        explain.explain("conv", {"x": (32, 64, 224, 224), "w": (64, 64, 3, 3)}, {"padding": 1})
        explain.explain("reduce_sum", {"x": (2**28,)}, {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20


def test_index_inputs_are_planned_from_real_zeros(no_gpu):
    result = explain.explain("gather", {"x": (1000, 64), "index": (4096,)}, {"axis": 0})
    assert [r.symbol for r in result.launches] == ["capsule_gather_fwd"]
    assert result.outputs == {"out": (4096, 64)}


def test_list_inputs_repeat_their_name(no_gpu):
    result = run("concat", "--input", "xs=2x3", "--input", "xs=2x5", "--param", "axis=1", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["inputs"] == {"xs": [[2, 3], [2, 5]]} and doc["outputs"] == {"out": [2, 8]}


def test_an_alias_launches_nothing(no_gpu):
    result = run("reshape", "--input", "x=4x4", "--param", "shape=16")
    assert result.exit_code == 0 and "(no launches)" in result.stdout and "out is x's memory" in result.stdout


# -- the device ---------------------------------------------------------------------------------


def test_a_local_gpu_is_used_with_its_own_figures(monkeypatch):
    """An H100 SXM as the driver describes it: 132 SMs at 1980 MHz, HBM3 at 2619 MHz on 5120 bits
    = 2 x 2.619e9 x 640 = 3.35 TB/s."""
    gpu = cuda.GpuInfo(0, "NVIDIA H100 80GB HBM3", "9.0", 79.6)
    monkeypatch.setattr(cuda, "probe", lambda: cuda.CudaProbe("2024.1", "13.0", (gpu,), None))
    monkeypatch.setattr(cuda, "gpu_properties", lambda index: cuda.GpuProperties(132, 1980.0, 2619.0, 5120))
    device = explain.choose_device()
    assert (device.name, device.arch, device.multiprocessors, device.origin) == (
        "NVIDIA H100 80GB HBM3",
        "sm_90",
        132,
        "local GPU 0",
    )
    assert device.bandwidth == pytest.approx(3.352e12, rel=1e-3)
    assert device.fma_peak == pytest.approx(132 * 128 * 2 * 1.98e9)
    other = explain.choose_device("sm_80")
    assert other.name == "A100 SXM4 80GB" and other.multiprocessors == 108
    assert "the local NVIDIA H100 80GB HBM3 is sm_90, not sm_80" in other.origin


def test_a_gpu_without_rules_or_properties_falls_back_to_the_reference(monkeypatch):
    ada = cuda.GpuInfo(0, "NVIDIA L4", "8.9", 22.0)
    monkeypatch.setattr(cuda, "probe", lambda: cuda.CudaProbe("2024.1", "13.0", (ada,), None))
    assert "no occupancy rules for the local NVIDIA L4 (sm_89)" in explain.choose_device().origin
    hopper = cuda.GpuInfo(0, "NVIDIA H200", "9.0", 140.0)
    monkeypatch.setattr(cuda, "probe", lambda: cuda.CudaProbe("2024.1", "13.0", (hopper,), None))

    def unreadable(index):
        raise EnvironmentMissing("cannot read GPU 0's properties: test")

    monkeypatch.setattr(cuda, "gpu_properties", unreadable)
    device = explain.choose_device()
    assert device.name == "H200 SXM" and "cannot read GPU 0's properties" in device.origin


def test_arch_sm_80_uses_its_rules_and_build(no_gpu):
    doc = json.loads(run(*REFERENCE["softmax-square"], "--arch", "sm_80", "--json").stdout)
    assert doc["device"]["arch"] == "sm_80" and doc["device"]["multiprocessors"] == 108
    occ = doc["launches"][0]["occupancy"]
    assert occ is None or occ["max_warps_per_sm"] == 64


def test_without_nvcc_the_note_says_so_and_the_plan_still_shows(no_gpu, monkeypatch):
    def no_nvcc(source, arch, nvcc=None, build=None):
        raise EnvironmentMissing("nvcc not found (looked in PATH): install the CUDA toolkit or set CUDA_HOME")

    monkeypatch.setattr(explain, "compile_file", no_nvcc)
    result = run(*REFERENCE["softmax-long-rows"])
    assert result.exit_code == 0
    assert "not compiled: nvcc not found" in result.stdout and "1024x1x1" in result.stdout  # the split-row grid
    assert "roofline floor" in result.stdout


def test_a_plan_that_breaks_a_launch_rule_exits_1(no_gpu, monkeypatch):
    monkeypatch.setattr(explain, "plan_problems", lambda plan, symbols, arch: ["launch 0: grid dimension 0 = 0"])
    result = run(*REFERENCE["softmax-long-rows"])
    assert result.exit_code == 1 and "PROBLEM: launch 0: grid dimension 0 = 0" in result.stdout


# -- parsing and usage errors -------------------------------------------------------------------


def test_shapes_and_parameters_are_read_by_the_schema():
    assert explain.parse_shape("8x4096") == (8, 4096) and explain.parse_shape("()") == ()
    assert explain.parse_shape("5,") == (5,) and explain.parse_shape("(2, 3)") == (2, 3)
    conv = explain.resolve_op("conv")[1]
    assert explain.parse_params(conv, ["stride=2", "padding=1x1"]) == {"stride": 2, "padding": (1, 1)}
    assert explain.parse_params(conv, ["padding=1,0"]) == {"padding": (1, 0)}
    reduce = explain.resolve_op("reduce_sum")[1]
    assert explain.parse_params(reduce, ["axis=none"]) == {"axis": None}
    assert explain.parse_params(reduce, ["axis=-1"]) == {"axis": -1}
    norm = explain.resolve_op("layer_norm")[1]
    assert explain.parse_params(norm, ["eps=1e-5"]) == {"eps": 1e-5}
    with pytest.raises(ParamError, match=r"layer_norm: eps: must be a number, got 'small'"):
        explain.parse_params(norm, ["eps=small"])


def test_only_plain_tuples_of_named_dimensions_are_inferred():
    scan = explain.resolve_op("selective_scan")[1]
    inferred = explain.infer_missing_shapes(scan, {"x": (2, 16, 8)})
    assert inferred == {"h0": ((2, 8), ("x",))}  # a and b are "(D) or (B, T, D)": never guessed
    with pytest.raises(ShapeError, match=r"a: required input is missing; the op is selective_scan\("):
        explain.explain("selective_scan", {"x": (2, 16, 8)}, {}, device=explain.reference_device("sm_90", "test"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["linear", "--input", "x=8xq", "--input", "w=4096x4096"], "--input x=8xq: '8xq' is not a shape"),
        (["linear", "--input", "x8x4096"], "--input x8x4096: write NAME=SHAPE"),
        (
            ["linear", "--input", "x=8x4096", "--input", "w=4096x4096", "--input", "q=3"],
            "linear: q: unknown input (inputs: b, w, x)",
        ),
        (["linear", "--input", "x=8x4096"], "linear: w: required input is missing"),
        (["linear", "--input", "x=8x4096", "--input", "w=4096x4095"], "linear: w:"),
        (["softmx", "--input", "x=4"], "unknown capsule 'softmx'; did you mean softmax"),
        (["softmax", "--input", "x=4", "--input", "x=5"], "--input x: given twice"),
        (
            ["conv", "--input", "x=1x2x5x5", "--input", "w=3x2x3x3", "--param", "dilation=2"],
            "conv: dilation: unknown parameter (allowed: stride, padding)",
        ),
        (
            ["conv", "--input", "x=1x2x5x5", "--input", "w=3x2x3x3", "--param", "padding=-1"],
            "conv: padding: must be >= 0",
        ),
        (
            ["rand_uniform", "--param", "shape=4x4", "--param", "seed=1", "--direction", "bwd"],
            "--direction bwd: rand_uniform has no backward",
        ),
        (["reference.relu", "--input", "x=3"], "OP: reference.relu launches no CUDA kernel"),
    ],
)
def test_usage_errors_exit_2_naming_the_argument(args, message, no_gpu):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stdout == ""
    assert isinstance(result.exception, SystemExit)  # never a traceback
