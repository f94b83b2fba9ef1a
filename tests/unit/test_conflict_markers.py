"""No tracked file carries a merge leftover: a README once shipped three conflict markers
that nothing checked (issue 35, point 10)."""

from __future__ import annotations

import re
import subprocess

from tests.support.env import REPO

# Built from parts so this file does not match itself.
MARKER = re.compile("^(" + "<" * 7 + " |" + "=" * 7 + "$|" + ">" * 7 + " )")


def test_no_tracked_file_has_a_conflict_marker() -> None:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True
    ).stdout.decode().split("\0")
    found = []
    for name in filter(None, names):
        path = REPO / name
        if not path.is_file():
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:  # binary (a PNG)
            continue
        found += [f"{name}:{i}: {line}" for i, line in enumerate(lines, 1) if MARKER.match(line)]
    assert names and not found, "\n".join(found)
