"""Package attributes imported on first use (PEP 562).

`foxformer --help` imported every package's public names, and with them torch, transformers and triton:
`import foxformer.cli` took 4.5 s on the 2-core CPU machine (issue 21). A package that declares its exports
here still offers ``from foxformer.data import TokenDataset``, but only the submodule that defines the
name is imported, and only when the name is first looked up.
"""
from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str], submodules: tuple[str, ...] = ()):
    """Make ``package`` import its names on first use; returns ``(__getattr__, __dir__)`` for its namespace.

    ``exports`` maps a public name to the module that defines it (relative, e.g. ``".dataset"``, or absolute
    for a name the package re-exports from a lower one); ``submodules`` are reachable as attributes without an
    import. No export may share a submodule's name: importing the submodule sets the package attribute, and
    ``import package.name as m`` reads that attribute, so one of the two would get the other's object
    (tests/test_imports.py checks every module).
    """
    module = sys.modules[package]

    def __getattr__(name: str):
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where, package), name)
        setattr(module, name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(exports) | set(submodules))

    return __getattr__, __dir__
