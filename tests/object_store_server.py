"""The tests' S3 server: :mod:`warehouse.object_store_server`, failing (never skipping)
when it cannot start, with its reason."""

from __future__ import annotations

import pytest

from warehouse.object_store_server import S3Server, S3ServerError
from warehouse.object_store_server import started_s3_server as _started

__all__ = ["S3Server", "started_s3_server"]


def started_s3_server() -> S3Server:
    try:
        return _started()
    except S3ServerError as e:
        pytest.fail(str(e), pytrace=False)
