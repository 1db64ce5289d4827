"""Launch plans per kernel family: each module defines PLANS = {op: (forward_plan, backward_plan)}.

A plan function takes the validated inputs (float32 arrays, int64 index arrays; a tuple for a
variadic input) and the normalised parameters, and returns a capsule_core.kernels.launch.LaunchPlan.
Buffer names: the op's input names ("x", "xs[0]", "index"), "out" for the forward result, "g" for
the cotangent and "d<input>" for each gradient; the backward plan may read "out" (the backend
runs the forward first); workspaces and host-prepared metadata are named by what they hold.
"""
