"""pytest options of the backend's tests: --build-dir (the CMake build with bin/softrdma,
lib/libibverbs.so.1 and python/softrdma_torch; default ../../build)."""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_addoption(parser):
    parser.addoption("--build-dir", default=os.path.join(HERE, "..", "..", "build"),
                     help="softrdma build directory (default: <repo>/build)")


@pytest.fixture(scope="session")
def build_dir(request):
    d = os.path.abspath(request.config.getoption("--build-dir"))
    if not os.path.exists(os.path.join(d, "python", "softrdma_torch", "__init__.py")):
        pytest.fail(f"{d}/python/softrdma_torch is missing: build the softrdma_torch target")
    return d
