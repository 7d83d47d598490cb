"""Sphinx configuration for topocoll's API reference (built from the docstrings).

Build it with ``sphinx-build -W -b html docs/api <outdir>`` after ``pip install -e '.[docs]'``
(tests/test_docs_build.py does the same, warnings as errors).
"""
from __future__ import annotations

import topocoll

project = "topocoll"
author = "topocoll contributors"
copyright = "topocoll contributors"  # noqa: A001 - Sphinx's name
version = release = topocoll.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

# The docstrings are Google style (Args:/Returns:/Raises:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# CuPy and NVML are the optional [cuda] extra; the NCCL backend imports them lazily, but mock them
# so the reference builds on machines without a GPU. torch is needed (the [torch] extra is in
# [all]): the parallel layers subclass torch.nn.Module and can't be documented against a mock.
autodoc_mock_imports = ["cupy", "cupyx", "cupy_backends", "pynvml"]
autodoc_default_options = {
    "members": True,
    "undoc-members": False,
    "show-inheritance": True,
    "member-order": "bysource",
}
# Signatures keep the annotations as written (many are strings under `from __future__ import
# annotations`, some name TYPE_CHECKING-only classes); the description is where they'd resolve.
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = True

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = f"topocoll {release} API reference"
