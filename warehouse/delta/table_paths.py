"""Where a Delta table's files are: its root, and the data file a log entry names.

Both engines key their tables by the root and hand Spark the locations of data files, so
the two conventions live here once: a local path is made absolute (a relative path would
change meaning with the working directory; a URI is taken as given), and a file's location
is decoded from the log the way the Delta protocol encodes it.
"""

from __future__ import annotations

import os
from urllib.parse import unquote


def table_root(path: str) -> str:
    """The table's root: a URI as given, a local path made absolute."""
    return path if "://" in path else os.path.abspath(path)


def data_file_location(root: str, log_path: str) -> str:
    """The location of a data file the log names by ``log_path``."""
    # The log stores RFC 2396-encoded paths, relative to the root unless absolute.
    decoded = unquote(log_path)
    if "://" in decoded or decoded.startswith("/"):
        return decoded
    return f"{root.rstrip('/')}/{decoded}"
