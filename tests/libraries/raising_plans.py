"""A plan that raises: check and verify fail its capsule's launch.plan, naming the error."""

from .tiny_plans import relu_backward


def relu_forward(inputs, params):
    raise ZeroDivisionError("float division by zero")


PLANS = {"relu": (relu_forward, relu_backward)}
