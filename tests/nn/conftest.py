"""The nn tests multiply small matrices: one BLAS thread is fastest for them, and on a machine shared by
several jobs, BLAS threads that wait for each other after every small product make them many times
slower. The limit holds while the tests in tests/nn run and is lifted afterwards."""

import pytest
from threadpoolctl import threadpool_limits


@pytest.fixture(scope="package", autouse=True)
def one_blas_thread():
    with threadpool_limits(limits=1, user_api="blas"):
        yield
