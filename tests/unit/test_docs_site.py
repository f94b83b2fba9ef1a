"""The site's llms.txt (docs/reference_gen/llms.py): after a build, it names every page of
the nav and each has a raw Markdown copy; the reference pages are generated.

SLOW for a unit test: builds the whole site once (about 10 s) into a temporary folder, with
no database or broker. `make install` installs the docs extra.
Not strict: `make docs` is the strict build; this checks what the hook writes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ("cli", "settings", "http-api", "errors", "events", "metrics", "migrations", "python-client", "packages")



def _nav_pages(items: list[Any]) -> Iterator[str]:
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            yield from _nav_pages(value)
        else:
            yield value


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(out)],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=120,
    )
    return out


def test_llms_txt_names_every_nav_page_with_a_markdown_copy(site: Path) -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.SafeLoader)
    pages = list(_nav_pages(config["nav"]))
    llms = (site / "llms.txt").read_text()

    assert llms.startswith(f"# {config['site_name']}\n")
    for page in pages:
        assert f"]({page})" in llms, page
        assert (site / page).is_file(), page
    assert len(pages) > 30


def test_the_reference_pages_are_generated(site: Path) -> None:
    for name in REFERENCE:
        text = (site / "reference" / f"{name}.md").read_text()
        assert "_Generated from " in text.split("\n\n")[1], name
        assert "!!! warning \"Not available\"" not in text, name
    assert (site / "reference" / "openapi.json").is_file()
    assert "`AIDAWORK_LEASE_S`" in (site / "reference" / "settings.md").read_text()
    assert "`aidawork owner set`" in (site / "reference" / "cli.md").read_text()
    assert "`aidawork_rounds`" in (site / "reference" / "metrics.md").read_text()
    assert "`run_completed`" in (site / "reference" / "events.md").read_text()
    assert "`RUN_NOT_FOUND`" in (site / "reference" / "errors.md").read_text()
