"""Sphinx configuration: the reference docs built from the code and its docstrings.

Built with warnings as errors by ``tests/test_docs.py`` (``sphinx-build -W``); the Python blocks
of every page run in ``tests/test_readme.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the `cli_help` extension beside this file

import packer  # noqa: E402

project = "packer"
release = packer.__version__
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "cli_help"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "alabaster"
html_title = f"packer {release}"
