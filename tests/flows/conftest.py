"""One Prefect test harness (a temporary API and database) for every flow test."""

from collections.abc import Iterator

import pytest
from prefect.testing.utilities import prefect_test_harness


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=120):
        yield
