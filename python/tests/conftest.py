"""Where the tests save: a temporary directory, and each object store `scripts/servers.sh`
started (moto S3, the GCS fixture, Azurite), named by its `WEIGHTBAY_*_URL` variable.

A store whose variable is unset is skipped, saying why, unless `WEIGHTBAY_REQUIRE_SERVERS=1`
(CI), where it fails.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

STORES = {
    "s3": "WEIGHTBAY_S3_URL",
    "gcs": "WEIGHTBAY_GCS_URL",
    "azure": "WEIGHTBAY_AZURE_URL",
}


def store_root(kind: str, tmp_path: Path) -> str:
    """A prefix no other test uses, in the store `kind` names (`local` or a key of STORES)."""
    if kind == "local":
        return str(tmp_path)
    variable = STORES[kind]
    url = os.environ.get(variable)
    if not url:
        why = f"{variable} is unset: start the server with scripts/servers.sh start {kind}"
        if os.environ.get("WEIGHTBAY_REQUIRE_SERVERS") == "1":
            pytest.fail(f"{why} (WEIGHTBAY_REQUIRE_SERVERS=1)")
        pytest.skip(why)
    return f"{url}/python-{uuid.uuid4().hex}"


@pytest.fixture(params=["local", *STORES])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh prefix in each store: the test runs once per store."""
    return store_root(str(request.param), tmp_path)


@pytest.fixture
def cli() -> str:
    """The `weightbay` command cargo built, which scripts/test.sh names in `WEIGHTBAY_CLI`:
    without it the test is skipped, or fails under `WEIGHTBAY_REQUIRE_SERVERS=1`."""
    binary = os.environ.get("WEIGHTBAY_CLI")
    if not binary:
        why = "WEIGHTBAY_CLI is unset (scripts/test.sh points it at the built `weightbay`)"
        if os.environ.get("WEIGHTBAY_REQUIRE_SERVERS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return binary
