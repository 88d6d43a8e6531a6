"""The commit a benchmark or soak result was measured at, for the header of its table."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def short_commit(repo: Path) -> str:
    """``HEAD``'s short hash; empty outside a git checkout."""
    return _git(repo, "rev-parse", "--short", "HEAD")


def has_uncommitted_changes(repo: Path) -> bool:
    """Whether tracked files differ from ``HEAD`` (the result is not the commit's alone)."""
    return bool(_git(repo, "status", "--porcelain", "--untracked-files=no"))
