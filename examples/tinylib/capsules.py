"""tinylib: a small CUDA kernel library written the way real ones are (C++ linkage in a
namespace, size_t / uint32_t parameters, multi-launch plans), declared for capsules.

    capsules verify --library examples/tinylib --backend emu tinylib

See README.md beside this file: the max_pool forward carries one deliberate defect.
"""

from capsule_core.catalog.library import Capsule, CapsuleLibrary, Kernel

LIBRARY = CapsuleLibrary(
    name="tinylib",
    sources=("csrc/cuda",),
    include_dirs=("csrc/include",),
    defines=("TINYLIB_THREADS=256",),  # plans.THREADS: the block of every launch
    nvcc_flags=(),
    plans="plans",
    ops={"squared_relu": "ops:SQUARED_RELU"},
    capsules=(
        Capsule(
            "relu",
            kernels=(
                # a template: its parameters are written out (the loader cannot read them off T)
                Kernel(
                    "tinylib::relu_forward<float>",
                    "forward",
                    params=("const float* __restrict__ x", "float* __restrict__ y", "size_t n"),
                ),
                Kernel("tinylib::relu_backward", "backward"),
            ),
            description="relu, 256-thread grid-stride kernels; the forward a template instantiated for float.",
        ),
        Capsule(
            "softmax",
            kernels=(
                Kernel("tinylib::row_max", "forward"),
                Kernel("tinylib::row_exp", "forward"),
                Kernel("tinylib::row_sum", "forward"),
                Kernel("tinylib::row_divide", "forward"),
                Kernel("tinylib::row_dot", "backward"),
                Kernel("tinylib::softmax_backward", "backward"),
            ),
            reduction="implementation-defined",
            description="softmax over the last axis as a chain of launches: an atomicMax row maximum on "
            "ordered-int keys, block-tree row sums with one atomicAdd per row.",
        ),
        Capsule(
            "max_pool",
            kernels=(
                Kernel("tinylib::max_pool_forward", "forward"),
                Kernel("tinylib::max_pool_backward_scatter", "backward"),
                Kernel("tinylib::max_pool_backward_gather", "backward"),
            ),
            reduction="implementation-defined",
            layout="channel_first",
            description="max_pool, one launch per image with a uint32 geometry table "
            "(carries the deliberate -FLT_MAX defect, see README.md).",
        ),
        Capsule(
            "squared_relu",
            kernels=(
                Kernel("tinylib::squared_relu_forward", "forward"),
                Kernel("tinylib::squared_relu_backward", "backward"),
            ),
            description="tinylib's own op: max(x, 0)^2.",
        ),
    ),
)
