"""Data Docs pages rewritten to load their scripts and styles from copies inside the site."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from quality.docs_offline import GX_IMAGES, VENDOR_DIR, VENDORED, MissingAssetsError, make_offline
from quality.gate import DEFAULT_DOCS_ASSETS

UNKNOWN = "https://example.com/tracker.js"


def page_with_every_cdn_url() -> str:
    tags = [
        f'<script src="{a.url}" integrity="sha384-x" crossorigin="anonymous"></script>'
        if not a.path.endswith(".css")
        else f'<link rel="stylesheet" href="{a.url}" crossorigin="anonymous"/>'
        for a in VENDORED
    ]
    links = '<a href="https://greatexpectations.io">a link, not a load</a>'
    logo = f'<img\n src="{GX_IMAGES}logo-long.png?d=1&amp;dataContextId=abc" alt="GX"/>'
    links += logo
    return f"<html><head>{''.join(tags)}<script src='{UNKNOWN}'></script>" + (
        f'<script src="{UNKNOWN}"></script></head><body>{links}</body></html>'
    )


def loaded_urls(page: Path) -> list[str]:
    return re.findall(r"<(?:script|link|img)\b[^>]*?(?:src|href)=\"([^\"]+)\"", page.read_text())


def test_the_fetched_packages_hold_every_vendored_file() -> None:
    missing = [
        a.url
        for a in VENDORED
        if not (DEFAULT_DOCS_ASSETS / a.package / "package" / a.path).is_file()
    ]
    assert missing == [], "the Makefile's DOCS_NPM list and VENDORED disagree"


def test_pages_load_the_site_copies_and_a_second_pass_changes_nothing(tmp_path: Path) -> None:
    site = tmp_path / "local_site"
    index = site / "index.html"
    nested = site / "validations" / "suite" / "run" / "2026" / "page.html"
    for page in (index, nested):
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(page_with_every_cdn_url())
    (site / "static" / "images").mkdir(parents=True)
    (site / "static" / "images" / "logo-long.png").write_bytes(b"png")  # GX copies its images

    report = make_offline(site, DEFAULT_DOCS_ASSETS)

    assert report.pages_rewritten == 2 and report.online_urls == (UNKNOWN,)
    for page in (index, nested):
        urls = loaded_urls(page)
        assert not any(a.url in urls for a in VENDORED)
        local = [u for u in urls if not u.startswith("http")]
        assert len(local) == len(VENDORED) + 1  # and the logo
        assert "dataContextId" not in page.read_text()
        for url in local:
            assert (page.parent / url).resolve().is_file(), url
            assert (page.parent / url).resolve().is_relative_to((site / "static").resolve())
        assert "integrity=" not in page.read_text() and "crossorigin" not in page.read_text()
        assert "https://greatexpectations.io" in page.read_text()  # links are not loads
    fonts = site / VENDOR_DIR / "fontawesome-free-6.6.0" / "webfonts"
    assert any(fonts.glob("*.woff2")), "Font Awesome's CSS loads its fonts relative to itself"
    before = index.read_text()
    assert make_offline(site, DEFAULT_DOCS_ASSETS).pages_rewritten == 0
    assert index.read_text() == before


def test_only_pages_written_since_the_build_started_are_read(tmp_path: Path) -> None:
    site = tmp_path / "local_site"
    site.mkdir()
    old = site / "old.html"
    old.write_text(page_with_every_cdn_url())
    os.utime(old, (1_000_000, 1_000_000))
    new = site / "index.html"
    new.write_text(page_with_every_cdn_url())
    report = make_offline(site, DEFAULT_DOCS_ASSETS, since=new.stat().st_mtime)
    assert report.pages_rewritten == 1
    assert old.read_text() == page_with_every_cdn_url()


def test_missing_assets_name_the_set_up_step_and_leave_the_pages_alone(tmp_path: Path) -> None:
    site = tmp_path / "local_site"
    site.mkdir()
    (site / "index.html").write_text(page_with_every_cdn_url())
    with pytest.raises(MissingAssetsError, match=r"fetched by `make setup` under .*nowhere"):
        make_offline(site, tmp_path / "nowhere")
    assert (site / "index.html").read_text() == page_with_every_cdn_url()
