"""What the docs tier's fixtures (tests/docs/conftest.py) hand to its tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

from tests.support.cluster import Cluster


@dataclass
class Stack:
    db_url: str
    cluster: Cluster
    env: dict[str, str]  # what a command of an example runs with


@dataclass
class PythonPages:
    """The namespace of each page's python blocks, and the first block that failed on it."""

    namespaces: dict[str, ModuleType] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
