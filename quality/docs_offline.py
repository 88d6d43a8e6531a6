"""Data Docs that render without the internet: the site's CDN assets, shipped with the site.

Great Expectations' page templates load jQuery, Bootstrap, bootstrap-table, Font Awesome and
Vega from CDNs (``great_expectations/render/view/templates/*.j2``); offline, the index is an
empty table. Its template loader puts the package's own templates before custom views, so
the templates cannot be overridden. Instead, after each build, every page written by it is
rewritten to load the same releases from ``static/vendor/`` inside the site, copied there
from the npm packages that ``make setup`` fetches (``var/docs-assets``).

Invariant: after :func:`make_offline`, no page it rewrote references a URL of
:data:`VENDORED`, and every file such a page references exists under the site. Subresource
integrity and ``crossorigin`` attributes are dropped with the URL they belonged to (a
``file://`` page cannot make CORS requests). GX's logo, loaded from its web-assets bucket with
the data context's id in the query, is pointed at the copy GX already puts in the site's
``static/images``. Other URLs are left as they are and reported.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

VENDOR_DIR = "static/vendor"


@dataclass(frozen=True)
class VendoredAsset:
    """One CDN URL and the file of the same release in the fetched npm packages."""

    url: str
    package: str  # folder under the assets directory (npm pack's name, unpacked)
    path: str  # file inside the package folder
    also: tuple[str, ...] = ()  # folders the file loads relative to itself (fonts)


VENDORED: tuple[VendoredAsset, ...] = (
    VendoredAsset(
        "https://code.jquery.com/jquery-3.7.1.min.js", "jquery-3.7.1", "dist/jquery.min.js"
    ),
    VendoredAsset(
        "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js",
        "popper.js-1.12.9",
        "dist/umd/popper.min.js",
    ),
    VendoredAsset(
        "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js",
        "bootstrap-4.3.1",
        "dist/js/bootstrap.min.js",
    ),
    VendoredAsset(
        "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css",
        "bootstrap-4.3.1",
        "dist/css/bootstrap.min.css",
    ),
    VendoredAsset(
        "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js",
        "bootstrap-table-1.19.1",
        "dist/bootstrap-table.min.js",
    ),
    VendoredAsset(
        "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css",
        "bootstrap-table-1.19.1",
        "dist/bootstrap-table.min.css",
    ),
    VendoredAsset(
        "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/"
        "bootstrap-table-filter-control.min.js",
        "bootstrap-table-1.19.1",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    ),
    # The templates load the filter-control styles of 1.19.0 beside the 1.19.1 script; the
    # 1.19.1 styles go with that script.
    VendoredAsset(
        "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
        "bootstrap-table-filter-control.css",
        "bootstrap-table-1.19.1",
        "dist/extensions/filter-control/bootstrap-table-filter-control.css",
    ),
    VendoredAsset(
        "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
        "bootstrap-table-filter-control.min.css",
        "bootstrap-table-1.19.1",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    ),
    VendoredAsset(
        "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/"
        "bootstrap-datepicker.min.js",
        "bootstrap-datepicker-1.9.0",
        "dist/js/bootstrap-datepicker.min.js",
    ),
    VendoredAsset(
        "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/"
        "bootstrap-datepicker.min.css",
        "bootstrap-datepicker-1.9.0",
        "dist/css/bootstrap-datepicker.min.css",
    ),
    VendoredAsset(
        "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css",
        "fontawesome-free-6.6.0",
        "css/all.min.css",
        also=("webfonts",),
    ),
    VendoredAsset(
        "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/"
        "bootstrap-prefers-dark.css",
        "forevolve-bootstrap-dark-1.1.0",
        "dist/css/bootstrap-prefers-dark.css",
    ),
    VendoredAsset("https://cdn.jsdelivr.net/npm/vega@5", "vega-5.33.1", "build/vega.min.js"),
    VendoredAsset(
        "https://cdn.jsdelivr.net/npm/vega-lite@5", "vega-lite-5.23.0", "build/vega-lite.min.js"
    ),
    VendoredAsset(
        "https://cdn.jsdelivr.net/npm/vega-embed@6", "vega-embed-6.29.0", "build/vega-embed.min.js"
    ),
)

_BY_URL = {asset.url: asset for asset in VENDORED}

# GX's navbar loads its logo from here, with the data context's id in the query string;
# the same images are in the site's own static/images (GX copies them there).
GX_IMAGES = "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/"
SITE_IMAGES = "static/images"

# src="..." or href="..." of a <script>, <link> or <img> tag, with the whole tag.
_TAG = re.compile(
    r"<(script|link|img)\b[^>]*?\b(?:src|href)=\"(https?://[^\"]+)\"[^>]*>", re.I | re.S
)
_DROPPED_ATTRIBUTES = re.compile(r"\s+(?:integrity|crossorigin)=\"[^\"]*\"", re.I)


@dataclass(frozen=True)
class OfflineReport:
    """What one :func:`make_offline` call did."""

    pages_rewritten: int
    online_urls: tuple[str, ...]  # script/style URLs left pointing at the internet


class MissingAssetsError(FileNotFoundError):
    """The fetched npm packages are not where the site's assets are copied from."""


def vendor_assets(site: Path, assets: Path) -> None:
    """Copy every :data:`VENDORED` file (and the folders it loads) into the site, once."""
    missing = [
        str(assets / a.package / "package" / a.path)
        for a in VENDORED
        if not (assets / a.package / "package" / a.path).is_file()
    ]
    if missing:
        raise MissingAssetsError(
            f"expected the Data Docs assets fetched by `make setup` under {assets}; "
            f"missing {len(missing)} file(s), e.g. {missing[0]}"
        )
    for asset in VENDORED:
        source = assets / asset.package / "package"
        target = site / VENDOR_DIR / asset.package
        if not (target / asset.path).is_file():
            (target / asset.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / asset.path, target / asset.path)
        for folder in asset.also:
            if not (target / folder).is_dir():
                shutil.copytree(source / folder, target / folder)


def rewrite_page(page: Path, site: Path) -> tuple[bool, list[str]]:
    """Point ``page``'s vendored script and style URLs at the site's copies.

    Returns whether the page changed and the URLs it still loads from the internet.
    """
    text = page.read_text(encoding="utf-8")
    online: list[str] = []

    def local(match: re.Match[str]) -> str:
        tag, url = match.group(0), match.group(2)
        asset = _BY_URL.get(url)
        if asset is not None:
            target = site / VENDOR_DIR / asset.package / asset.path
        elif url.startswith(GX_IMAGES) and (site / SITE_IMAGES / _file_name(url)).is_file():
            target = site / SITE_IMAGES / _file_name(url)  # the query (context id) goes too
        else:
            online.append(url)
            return tag
        relative = Path(os.path.relpath(target, page.parent)).as_posix()
        return _DROPPED_ATTRIBUTES.sub("", tag.replace(url, relative))

    rewritten = _TAG.sub(local, text)
    if rewritten != text:
        page.write_text(rewritten, encoding="utf-8")
    return rewritten != text, online


def _file_name(url: str) -> str:
    return url[len(GX_IMAGES) :].split("?", 1)[0]


def make_offline(site: Path, assets: Path, since: float | None = None) -> OfflineReport:
    """Vendor the assets into ``site`` and rewrite its pages written at or after ``since``.

    ``since`` is a ``time.time()`` taken before the build (None: every page). Pages already
    rewritten are unchanged by a second call.
    """
    started = time.monotonic()
    vendor_assets(site, assets)
    rewritten = 0
    online: set[str] = set()
    for page in site.rglob("*.html"):
        if since is not None and page.stat().st_mtime < since - 1:  # coarse file clocks
            continue
        changed, left = rewrite_page(page, site)
        rewritten += changed
        online.update(left)
    if online:
        logger.warning(
            "Data Docs pages still load %d URL(s) from the internet: %s",
            len(online),
            ", ".join(sorted(online)),
        )
    logger.info(
        "Data Docs: %d page(s) now load their scripts from %s (%.1fs)",
        rewritten,
        site / VENDOR_DIR,
        time.monotonic() - started,
    )
    return OfflineReport(rewritten, tuple(sorted(online)))
