"""The one place the command line defers importing the package's own modules.

What the commands call imports torch, which `--help` and the one-line errors need not (tests/test_cli.py checks
that --help imports no torch). A command module names what it calls at its top,

    dgd = lazy_module("privdistill.methods.dgd")  # imported when the command runs

and the module is imported when an attribute is first read. Modules that import no torch are imported plainly.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for module `name` until one of its attributes is read; that imports it (once: sys.modules keeps it)
    and reads the attribute from it, so what a test patches on the module is what the command sees."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_module(name: str) -> Any:
    """Module `name`, imported on first use (typed Any: its attributes are the module's)."""
    return LazyModule(name)
