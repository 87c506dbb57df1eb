"""Sphinx configuration of the hybridmpi documentation (built in CI with -W)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "hybridmpi"
author = "the hybridmpi developers"
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_heading_anchors = 3
exclude_patterns = ["_build"]
html_theme = "furo"   # wide tables and code reflow with the window (alabaster cut them)
html_static_path = ["_static"]
html_css_files = ["fit.css"]
html_title = "hybridmpi"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# importing hybridmpi does not start MPI; the doctests start it (one rank) when they run
doctest_global_setup = "import numpy as np\nimport hybridmpi"
