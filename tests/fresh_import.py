"""What tests/test_imports.py runs in each child of its fork server: a module imported before any other synthkd
module. This file imports only the standard library, so unpickling `import_first` in the child loads none."""

from __future__ import annotations

import importlib
import sys
import traceback


def import_first(module: str) -> str | None:
    """Import `module` in this (freshly forked) process: None when it imports, else why not (a traceback)."""
    loaded = sorted(name for name in sys.modules if name.split(".")[0].startswith("synthkd"))
    if loaded:
        return f"not a fresh interpreter: {loaded} already imported"
    try:
        importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - whatever the import raised is the test's failure message
        return traceback.format_exc()
    return None
