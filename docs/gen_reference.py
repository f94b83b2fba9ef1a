"""Generates the reference pages at build time (mkdocs-gen-files): never written by hand.

Each page is rendered by a module of ``docs/reference_gen`` from the code it documents;
no database, broker or network is needed."""

import json
import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_gen import cli, errors, events, http_api, metrics, migrations, packages, python_client, settings

openapi = http_api.document()
PAGES = {
    "cli": cli.page,
    "settings": settings.page,
    "http-api": lambda: http_api.page(openapi),
    "errors": errors.page,
    "events": events.page,
    "metrics": metrics.page,
    "migrations": migrations.page,
    "python-client": python_client.page,
    "packages": packages.page,
}

for name, render in PAGES.items():
    with mkdocs_gen_files.open(f"reference/{name}.md", "w") as page:
        page.write(render())
with mkdocs_gen_files.open("reference/openapi.json", "w") as raw:
    json.dump(openapi, raw, indent=2, sort_keys=False)
    raw.write("\n")
