"""MkDocs hook (``hooks:`` in mkdocs.yml): writes ``llms.txt`` at the site's root, an
index of every page in nav order, each linked to a raw Markdown copy of the page's
source written next to its HTML (``concepts/durability.md`` beside
``concepts/durability/``), generated reference pages included.

A hook rather than the mkdocs-llmstxt plugin: that plugin requires ``site_url`` (the
site has no fixed address; relative links work wherever it is served) and converts the
rendered HTML back to Markdown, where this copies the source as written.
Snippet lines (``--8<-- "FILE"``, pymdownx.snippets) are expanded, so a copy stands
alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.nav import Navigation, Section
from mkdocs.structure.pages import Page

SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$', re.MULTILINE)
# One build's state: each page's source by its path, and the navigation.
_sources: dict[str, str] = {}
_nav: list[Navigation] = []


def on_pre_build(*, config: MkDocsConfig) -> None:
    _sources.clear()
    _nav.clear()


def on_nav(nav: Navigation, *, config: MkDocsConfig, files: Files) -> Navigation:
    _nav.append(nav)
    return nav


def _expand_snippets(markdown: str, config: MkDocsConfig) -> str:
    base = Path(config.config_file_path).parent

    def read(match: re.Match[str]) -> str:
        return (base / match.group(1)).read_text(encoding="utf-8").rstrip("\n")

    return SNIPPET.sub(read, markdown)


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    _sources[page.file.src_uri] = _expand_snippets(markdown, config)
    return markdown


def index(items: list[Any], level: int = 2) -> list[str]:
    """The llms.txt sections: a nav section is a heading with its pages listed under it
    (nested sections one level deeper); loose top-level pages are listed under "Pages"."""
    lines: list[str] = []
    loose = False
    for item in items:
        if isinstance(item, Section):
            lines += ["", f"{'#' * min(level, 6)} {item.title}", "", *index(item.children, level + 1)]
            loose = False
        elif isinstance(item, Page):
            if level == 2 and not loose:
                lines += ["", "## Pages", ""]
                loose = True
            lines.append(f"- [{item.title}]({item.file.src_uri})")
    return lines


def on_post_build(*, config: MkDocsConfig) -> None:
    site = Path(config.site_dir)
    for src_uri, markdown in _sources.items():
        copy = site / src_uri
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(markdown.rstrip("\n") + "\n", encoding="utf-8")
    lines = [f"# {config.site_name}", ""]
    if config.site_description:
        lines += [f"> {config.site_description}", ""]
    lines.append("Every page of the documentation in the order of its navigation, each linked to a raw Markdown copy.")
    lines += index(_nav[0].items) if _nav else []
    (site / "llms.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
