"""The project's Python packages as one zip for a cluster's executors.

On a cluster, the executors' Python workers import the functions a job sends them (the
``mapInArrow`` and ``applyInArrow`` kernels in ``joins/`` and ``warehouse/``) by
module name, so the project's packages must be on their path, and nothing installs them on
a worker. The driver zips the packages the distribution ships (``pyproject.toml``,
``[tool.setuptools] packages``) and adds the zip to the Spark context
(:func:`ship_project_code`); Spark serves it to every executor, which puts it first on
``sys.path``, ahead of anything installed there.

The archive's name carries a hash of every file in it: an unchanged checkout reuses the
archive it built before, a changed one ships a new one, and a worker never runs a stale
copy. Local masters (``local``, ``local[N]``) share the driver's files and get nothing.
"""

from __future__ import annotations

import hashlib
import logging
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError

logger = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Byte-for-byte the same zip for the same files: fixed timestamps, sorted entries.
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class CodeArchive:
    """A zip of the project's packages and what went into it."""

    path: Path
    packages: tuple[str, ...]
    files: int


def shipped_packages(root: Path = PROJECT_ROOT) -> tuple[str, ...]:
    """The top-level packages the distribution ships, from ``pyproject.toml``."""
    pyproject = root / "pyproject.toml"
    try:
        settings = tomllib.loads(pyproject.read_text())
        patterns = settings["tool"]["setuptools"]["packages"]["find"]["include"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(
            f"cannot tell which packages to ship to the executors: expected "
            f"[tool.setuptools] packages.find.include in {pyproject}: {e}"
        ) from e
    names = sorted({str(p).rstrip("*").rstrip(".") for p in patterns})
    missing = [n for n in names if not (root / n / "__init__.py").is_file()]
    if missing:
        raise ConfigError(f"packages named in {pyproject} are not in {root}: {missing}")
    return tuple(names)


def build_archive(target_dir: Path, root: Path = PROJECT_ROOT) -> CodeArchive:
    """Zip the shipped packages' Python files (and templates) into ``target_dir``, or
    reuse the zip of the same content."""
    packages = shipped_packages(root)
    files = sorted(
        path
        for package in packages
        for path in (root / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".j2")
    )
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    target = target_dir / f"enrich-code-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        target_dir.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{digest.hexdigest()[16:24]}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in files:
                entry = zipfile.ZipInfo(str(path.relative_to(root)), _EPOCH)
                entry.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(entry, path.read_bytes())
        partial.replace(target)  # atomic: a concurrent builder writes the same bytes
        logger.info("built %s: %d file(s) of %s", target, len(files), ", ".join(packages))
    return CodeArchive(target, packages, len(files))


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-")


def ship_project_code(spark_context: Any, target_dir: Path) -> CodeArchive | None:
    """Add the project's zip to ``spark_context`` unless its master is local."""
    master = str(spark_context.master)
    if is_local_master(master):
        return None
    archive = build_archive(target_dir)
    spark_context.addPyFile(str(archive.path))
    logger.info("shipping %s to the executors of %s", archive.path.name, master)
    return archive
