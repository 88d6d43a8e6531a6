"""Where a Delta table's files are: its root, a version's commit file, and the data file a
log entry names.

Both engines key their tables by the root, read commit files and hand Spark the locations
of data files, so these conventions live here once: a local path is made absolute (a
relative path would change meaning with the working directory; a URI is taken as given), a
commit file is named by its zero-padded version, and a file's location is decoded from the
log the way the Delta protocol encodes it.
"""

from __future__ import annotations

import os
from urllib.parse import unquote


def table_root(path: str) -> str:
    """The table's root: a URI as given, a local path made absolute."""
    return path if "://" in path else os.path.abspath(path)


def commit_file_location(root: str, version: int) -> str:
    """The location of ``version``'s commit file (Delta protocol, "Delta Log Entries")."""
    return f"{root.rstrip('/')}/_delta_log/{version:020d}.json"


def data_file_location(root: str, log_path: str) -> str:
    """The location of a data file the log names by ``log_path``."""
    # The log stores RFC 2396-encoded paths, relative to the root unless absolute.
    decoded = unquote(log_path)
    if "://" in decoded or decoded.startswith("/"):
        return decoded
    return f"{root.rstrip('/')}/{decoded}"
