"""Which landing zone a stream's landing location is, and what of it is still there.

A location with the ``s3`` or ``s3a`` scheme is a prefix in an object store
(:class:`~warehouse.landing_s3.ObjectStoreZone`), any other a local directory
(:class:`~warehouse.landing_local.LocalZone`). Here, apart from both, so that ``enrich
status`` can ask a zone without importing Spark (or either kind importing the other).
"""

from __future__ import annotations

from pathlib import Path

from warehouse.landing_local import LocalZone
from warehouse.landing_s3 import ObjectStoreZone
from warehouse.landing_zone import LandingZone
from warehouse.object_store import SCHEMES, ObjectStore, is_object_store
from warehouse.state_store import StateStore
from warehouse.state_tables import REJECTED, LandingFile


def zone_for(
    location: str | Path, file_format: str, store: ObjectStore | None = None
) -> LandingZone:
    """The zone at a stream's landing ``location`` (``store``: the object store to reach an
    ``s3://`` location through; by default the environment's).

    A :class:`~pathlib.Path` made of an object-store location (``Path("s3://b/p")``, as
    :func:`pipeline.runner.stream_source` builds ``StreamSource.landing_dir``) has lost a
    slash, ``s3:/b/p``; it is read as the location it came from. A local landing directory
    is absolute once the config's paths are resolved, so it never starts with ``s3:``.
    """
    text = unfolded(location)
    if is_object_store(text):
        return ObjectStoreZone(text, file_format, store)
    return LocalZone(Path(location), file_format)


def unfolded(location: str | Path) -> str:
    """``location`` as text; an object-store location that ``Path`` folded gets its ``//``
    back."""
    text = str(location)
    scheme, colon_slash, rest = text.partition(":/")
    if colon_slash and scheme.lower() in SCHEMES and not rest.startswith("/"):
        return f"{scheme}://{rest}"
    return text


def rejected_in_place(store: StateStore, stream: str, zone: LandingZone) -> list[LandingFile]:
    """Rejected files of a stream that are still in its landing zone."""
    return [row for row in store.landing_files(stream, REJECTED) if zone.holds(row.path)]
