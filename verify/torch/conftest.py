"""pytest configuration of the orthros.torch tests: the `gpu` marker, and skip reasons when torch,
a GPU or orthros._cuda is missing. Run with PYTHONPATH=<build>/python (the built package)."""
import pytest

try:
    import torch
except ImportError:  # the ctest entry skips before pytest runs; this keeps a bare `pytest` clean
    torch = None

collect_ignore_glob = [] if torch is not None else ["test_*.py"]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU and orthros._cuda (a CUDA build)")
    config.addinivalue_line("markers", "slow: minutes on a 2-core machine (torch.compile with inductor); not in ctest")


def gpu_skip_reason():
    """None when the GPU tests can run, else why not."""
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    try:
        import orthros._cuda  # noqa: F401
    except ImportError as e:
        return f"orthros._cuda is not built (a CPU-only build: {e})"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_skip_reason()
    if reason:
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
