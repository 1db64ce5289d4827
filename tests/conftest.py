import pytest


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where a GPU answers; elsewhere they skip with the reason."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = _gpu_unavailable()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


def _gpu_unavailable() -> str:
    try:
        import pycuda.driver as drv

        drv.init()
        if drv.Device.count() == 0:
            return "no CUDA device on this machine"
    except ImportError:
        return "pycuda is not installed (pip install '.[gpu]')"
    except Exception as exc:
        return f"no usable CUDA driver: {exc}"
    return ""


@pytest.fixture(scope="session")
def host_build_dir(tmp_path_factory):
    """Where tests/hostmath.py puts the host builds of the kernels' device math."""
    return str(tmp_path_factory.mktemp("hostmath"))


@pytest.fixture
def machine_without_gpu(monkeypatch):
    """This machine as CI's, whatever it has: PyCUDA sees no device (for the tests of what a
    machine without a GPU does; they would test something else on a GPU machine)."""
    from capsule_core.backends import cuda

    monkeypatch.setattr(cuda, "probe", lambda: cuda.CudaProbe(None, None, (), "pycuda does not import (a test)"))
