"""``make demo`` runs ``examples/demo.py``, which no other test runs: at least everything it
imports must be where it imports it from (a module split once moved ``format_event``
from under it). Loaded in a process of its own, without running it: the demo sets
environment variables for its workers at import."""

from __future__ import annotations

import subprocess
import sys

from tests.support.env import REPO

LOAD = "import runpy; names = runpy.run_path('examples/demo.py', run_name='loaded'); print(callable(names['main']))"


def test_the_demo_loads_with_everything_it_imports() -> None:
    loaded = subprocess.run([sys.executable, "-c", LOAD], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "True"
