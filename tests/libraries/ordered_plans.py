"""The same mean squared error as tiny_plans, summed by one block in a fixed order."""

from capsule_core.kernels.launch import Buffer, Launch, LaunchPlan

from .tiny_plans import mse_backward, mse_buffers, size


def mse_forward(inputs, params):
    n = size(inputs["pred"])
    buffers = mse_buffers(n) + (Buffer("out", "output", "float32", 1),)
    launch = Launch("tiny::mse_ordered", (1, 1, 1), (256, 1, 1), ("pred", "target", "out", n))
    return LaunchPlan("mse_loss", "forward", buffers, (launch,), output_shapes={"out": ()})


PLANS = {"mse_loss": (mse_forward, mse_backward)}
