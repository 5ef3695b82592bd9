"""What `pip install foxformer` (a wheel) holds is what the source tree holds.

The README's setup installs in editable mode, which reads src/ itself: a file the wheel leaves out still works
there, and only an installed user finds it missing. setuptools puts in the wheel the packages its find step
finds (folders with an __init__.py, below folders with one) and, of their other files, only those that
pyproject.toml's package-data names. These check both rules on the tree, without building a wheel.
"""
import glob
import os
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; on 3.10 the check runs where CI's newer Python runs it

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "foxformer"


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _folders():
    """Every folder of the package; caches and hidden folders (an editor's, a tool's) are nobody's source."""
    for folder, dirs, _ in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        yield Path(folder)


def _package_name(folder: Path) -> str:
    return ".".join(folder.relative_to(SRC).parts)


def test_the_wheel_takes_packages_from_src_by_their_init_files():
    # The premise of the next test: find_namespace would also take folders without an __init__.py
    assert _pyproject()["tool"]["setuptools"]["packages"] == {"find": {"where": ["src"]}}


def test_every_folder_of_modules_is_a_package_the_wheel_takes():
    # Without an __init__.py a folder still imports from src/ (a namespace package), but setuptools' find step
    # skips it and everything below it, the standalone export's source files among them.
    # A folder with modules only further down needs one too: the find step does not look below it.
    missing = sorted(str(folder.relative_to(ROOT)) for folder in _folders()
                     if any(folder.rglob("*.py")) and not (folder / "__init__.py").exists())
    assert not missing, f"add an __init__.py to {missing}: the wheel leaves these folders out"


def test_every_data_file_of_the_package_is_in_package_data():
    spec = _pyproject()["tool"]["setuptools"].get("package-data", {})
    shipped = set()
    # setuptools' rules: key "*" (or "") applies to every package, any other key to that package; each pattern
    # is a glob (with **) from the package's folder
    for folder in _folders():
        patterns = spec.get("*", []) + spec.get("", []) + spec.get(_package_name(folder), [])
        for pattern in patterns:
            shipped.update(Path(p) for p in glob.glob(str(folder / pattern), recursive=True) if os.path.isfile(p))
    data = [folder / name for folder in _folders() for name in os.listdir(folder)
            if (folder / name).is_file() and not name.endswith((".py", ".pyc")) and not name.startswith(".")]
    assert data, f"no data files found under {PACKAGE} (the package's READMEs are some): the walk is broken"
    left_out = sorted(str(p.relative_to(ROOT)) for p in data if p not in shipped)
    assert not left_out, (f"{left_out} would be missing from the wheel: name them in pyproject.toml's "
                          f"[tool.setuptools.package-data], or move them out of src/foxformer if the installed "
                          f"package never needs them")
