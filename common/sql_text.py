"""Spark SQL text: identifiers and string literals quoted for an expression string."""

from __future__ import annotations


def quoted_identifier(name: str) -> str:
    """A column or path name as a backquoted SQL identifier (a backquote doubled)."""
    return "`" + name.replace("`", "``") + "`"


def string_literal(text: str) -> str:
    """A string as a single-quoted SQL literal (backslash and quote escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
