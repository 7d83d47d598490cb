"""Clear ImportErrors for optional dependencies: which extra of topocoll brings what is missing."""
from __future__ import annotations

import importlib


def require(module: str, extra: str, needed_by: str) -> None:
    """Import ``module`` or raise ImportError saying ``needed_by`` needs it and which extra has it."""
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{needed_by} needs {module}, which is not installed: "
                          f"pip install 'topocoll[{extra}]'") from err
