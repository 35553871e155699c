"""One story per option: the README's OTBConfig table is OTBConfig's, and every option's one-line help points to
its section of docs/options.md, where its semantics are written once."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

from trl import GRPOConfig

from trl_otb import OTBConfig
from trl_otb.config import otb_fields_markdown

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
OPTIONS = ROOT / "docs" / "options.md"


def readme_otbconfig_table() -> dict[str, tuple[str, str]]:
    """field -> (default, help) from the table of the README's "## OTBConfig" section."""
    text = README.read_text()
    section = re.search(r"^## OTBConfig\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## OTBConfig' section"
    rows = {}
    for line in section[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1].strip("`"), cells[2])
    return rows


def own_fields() -> dict[str, object]:
    """OTBConfig's fields that are not GRPOConfig's, or whose default differs from GRPOConfig's, with the default."""
    parent = {f.name: (f.default, f.default_factory) for f in fields(GRPOConfig)}
    return {
        f.name: f.default if f.default is not MISSING else f.default_factory()
        for f in fields(OTBConfig)
        if parent.get(f.name) != (f.default, f.default_factory)
    }


def test_the_readme_table_lists_every_otbconfig_field_with_its_default_and_help():
    table = readme_otbconfig_table()
    wanted = own_fields()
    assert {f.name for f in fields(OTBConfig)} - {f.name for f in fields(GRPOConfig)} <= set(table)
    assert set(table) == set(wanted), "README's OTBConfig table: paste trl_otb.config.otb_fields_markdown()"
    helps = {f.name: f.metadata["help"] for f in fields(OTBConfig)}
    for name, default in wanted.items():
        assert table[name] == (repr(default), helps[name]), name


def test_the_readme_table_is_the_generated_one():
    assert otb_fields_markdown() in README.read_text()


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_help_links_to_its_section_of_docs_options():
    anchors = {_slug(h) for h in re.findall(r"^#+ (.*)$", OPTIONS.read_text(), re.M)}
    for f in fields(OTBConfig):
        if f.name in own_fields():
            links = re.findall(r"docs/options\.md#([\w-]+)", f.metadata["help"])
            assert links, f"{f.name}: its help should end with 'See docs/options.md#...'"
            assert set(links) <= anchors, (f.name, links)


def test_every_otb_option_has_a_section_in_docs_options():
    text = OPTIONS.read_text()
    for name in own_fields():
        section = "otb_fidelity" if name.startswith("otb_fidelity_") else name
        assert re.search(rf"^## {section}$", text, re.M), name
        assert f"`{name}`" in text or name == section, name
