"""A plugin that emits a Python warning when imported: the process's log must show it as
a JSON line (``py.warnings``), like every other line (``AIDAWORK_PLUGINS=warning_plugin``)."""

from __future__ import annotations

import warnings

from runtime.plugins import Plugins

warnings.warn("warning_plugin: this backend is deprecated", UserWarning, stacklevel=1)


def register(plugins: Plugins) -> None:
    return None
