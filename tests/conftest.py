import importlib.util
import os
import sys
from pathlib import Path

import pytest

# Tests run from the source tree without an install as well.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
# Triton kernels run on CPU tensors through the interpreter; it must be chosen before the
# first `import triton` anywhere in the process. On a CUDA machine they compile for the GPU
# (tests/gpu); run the CPU suite there with TRITON_INTERPRET=1 set explicitly.
import torch  # noqa: E402  (importing torch does not import triton)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def load_script():
    """load_script(NAME): scripts/NAME.py as a module (the scripts are not a package)."""
    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load
