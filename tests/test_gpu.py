"""On a GPU: every native capsule verified on the cuda backend (skipped with the reason elsewhere)."""

import pytest

from capsule_core import native_cuda
from capsule_core import verify as engine

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda_backend():
    from capsule_core.backends.cuda import CudaBackend
    return CudaBackend(0)


@pytest.mark.parametrize("capsule", native_cuda.CAPSULES, ids=[c.op.value for c in native_cuda.CAPSULES])
def test_capsule_verifies_on_the_gpu(capsule, cuda_backend):
    report = engine.verify_capsule(capsule, cuda_backend, quick=False, seed=0)
    bad = [f"{r.check} {r.status.value}: {r.reason} | {r.repro}" for r in report.results
           if r.status in (engine.Status.FAILED, engine.Status.ERROR, engine.Status.MISTRUSTED)]
    assert bad == []


def test_a_failed_launch_is_reported_not_fatal(cuda_backend):
    """An input the plan cannot launch (no plan for an unknown op) is a clear error, not a crash."""
    from capsule_core.errors import CapsuleError
    from capsule_core.execution import GuardedOutput
    from capsule_core.ops import get_spec
    with pytest.raises(CapsuleError):
        cuda_backend.forward(get_spec("relu"), {"x": [[1.0]] * 3}, {"bogus": 1}, GuardedOutput((3, 1)))
