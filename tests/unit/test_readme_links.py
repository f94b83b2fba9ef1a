"""The Markdown files outside the site link only to files that exist: `make docs` checks
the site's own links strictly, nothing else checks README.md and CHANGELOG.md."""

from __future__ import annotations

import re

import pytest

from tests.support.env import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_every_relative_link_names_a_file_that_exists(name: str) -> None:
    targets = LINK.findall((REPO / name).read_text())
    relative = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    missing = [t for t in relative if t and not (REPO / t).exists()]
    assert missing == []


def test_the_check_sees_a_dead_link() -> None:
    assert LINK.findall("see [the guide](docs/no-such-page.md) and [x](https://example.org)") == [
        "docs/no-such-page.md", "https://example.org"
    ]
