"""Every module of the package imports, without a GPU, under both spellings of an import.

`import foxformer.ops.forgetting_attention.hopper.aot as m` failed while `from ... import aot` worked: the
`as` form reads each package attribute on the way down, and foxformer.ops's attribute `forgetting_attention`
was the function it exports, not the subpackage of that name. Exports no longer share submodules' names
(foxformer/_lazy.py); this walks the whole tree so that a new clash shows up here.
"""
import importlib
import pkgutil

import pytest

import foxformer


def _raise(name):
    raise ImportError(f"walk_packages could not import {name}")


MODULES = sorted(info.name for info in pkgutil.walk_packages(foxformer.__path__, "foxformer.", onerror=_raise))


def test_the_walk_reaches_the_deepest_modules():
    assert "foxformer.ops.forgetting_attn.hopper.aot" in MODULES and "foxformer.models.kvcache.paged" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_a_module_is_the_same_object_however_it_is_imported(name):
    module = importlib.import_module(name)
    parent, _, leaf = name.rpartition(".")
    spelled = {}
    exec(f"import {name} as dotted\nfrom {parent} import {leaf} as attribute", spelled)
    assert spelled["dotted"] is module and spelled["attribute"] is module
