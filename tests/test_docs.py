"""The generated parts of the docs stay in sync with the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trl_otb.config import otb_fields_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_api_doc_has_the_current_otbconfig_table():
    doc = (ROOT / "docs" / "api.md").read_text()
    assert otb_fields_markdown() in doc, "docs/api.md: paste trl_otb.config.otb_fields_markdown() into the table"


def test_troubleshooting_catalogue_lists_every_error_message():
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "make_troubleshooting.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_shows_both_commands_and_every_otb_field():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    for line in otb_fields_markdown().splitlines()[2:]:
        field = line.split("`")[1]
        assert f"`{field}`" in readme, f"README's OTBConfig table lacks {field}"
