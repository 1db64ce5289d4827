"""Launch plans of the tests' tiny library: relu, and a mean squared error summed by atomicAdd."""

import numpy as np

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan, Memset, grid_1d


def size(a) -> int:
    return int(np.prod(np.shape(a), dtype=np.int64))


def relu_forward(inputs, params):
    n = size(inputs["x"])
    grid, block = grid_1d(n)
    buffers = (Buffer("x", "input", "float32", n), Buffer("out", "output", "float32", n))
    launch = Launch("tiny::relu_fwd", grid, block, ("x", "out", n))
    return LaunchPlan("relu", "forward", buffers, (launch,), output_shapes={"out": np.shape(inputs["x"])})


def relu_backward(inputs, params):
    n = size(inputs["x"])
    grid, block = grid_1d(n)
    buffers = (
        Buffer("x", "input", "float32", n),
        Buffer("g", "input", "float32", n),
        Buffer("dx", "output", "float32", n),
    )
    launch = Launch("tiny::relu_bwd", grid, block, ("x", "g", "dx", n))
    return LaunchPlan("relu", "backward", buffers, (launch,), output_shapes={"dx": np.shape(inputs["x"])})


def mse_buffers(n: int):
    return (Buffer("pred", "input", "float32", n), Buffer("target", "input", "float32", n))


def mse_forward(inputs, params):
    n = size(inputs["pred"])
    grid, block = grid_1d(n)
    buffers = mse_buffers(n) + (Buffer("sum", "workspace", "float32", 1), Buffer("out", "output", "float32", 1))
    steps = (
        Memset("sum", 0.0),
        Launch("tiny::mse_atomic", grid, block, ("pred", "target", "sum", n)),
        Launch("tiny::mse_finish", (1, 1, 1), (1, 1, 1), ("sum", "out", n)),
    )
    return LaunchPlan("mse_loss", "forward", buffers, steps, output_shapes={"out": ()})


def mse_backward(inputs, params):
    n = size(inputs["pred"])
    grid, block = grid_1d(n)
    shape = np.shape(inputs["pred"])
    buffers = mse_buffers(n) + (
        Buffer("g", "input", "float32", 1),
        Buffer("dpred", "output", "float32", n),
        Buffer("dtarget", "output", "float32", n),
    )
    launch = Launch("tiny::mse_bwd", grid, block, ("pred", "target", "g", "dpred", "dtarget", n))
    return LaunchPlan("mse_loss", "backward", buffers, (launch,), output_shapes={"dpred": shape, "dtarget": shape})


PLANS = {"relu": (relu_forward, relu_backward), "mse_loss": (mse_forward, mse_backward)}
