"""On a GPU: every native capsule verified on the cuda backend (skipped with the reason elsewhere)."""

import pytest

from capsule_core.catalog import native_cuda
from capsule_core.verify import engine

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda_backend():
    from capsule_core.backends.cuda import CudaBackend

    return CudaBackend(0)


@pytest.mark.parametrize("capsule", native_cuda.CAPSULES, ids=[c.op.value for c in native_cuda.CAPSULES])
def test_capsule_verifies_on_the_gpu(capsule, cuda_backend):
    report = engine.verify_capsule(capsule, cuda_backend, quick=False, seed=0)
    bad = [
        f"{r.check} {r.status.value}: {r.reason} | {r.repro}"
        for r in report.results
        if r.status in (engine.Status.FAILED, engine.Status.ERROR, engine.Status.MISTRUSTED)
    ]
    assert bad == []


def test_a_failed_launch_is_reported_not_fatal(cuda_backend):
    """A launch the driver refuses (a block of 2048 threads, past the hardware's 1024; plan
    validation is bypassed on purpose) is a LaunchFailed naming the kernel, not a crash."""
    from dataclasses import replace

    import numpy as np

    from capsule_core.backends.cuda import LaunchFailed
    from capsule_core.backends.execution import GuardedOutput
    from capsule_core.catalog import registry
    from capsule_core.kernels.launch import plan_functions

    capsule = registry.lookup("relu")
    forward, _ = plan_functions(capsule)
    x = np.ones(8, np.float32)
    plan = forward({"x": x}, {})
    plan = replace(plan, launches=tuple(replace(launch, block=(2048, 1, 1)) for launch in plan.launches))
    with pytest.raises(LaunchFailed, match="launch of capsule_relu_fwd"):
        cuda_backend.execute(capsule, plan, {"x": x}, {"out": GuardedOutput((8,))})
