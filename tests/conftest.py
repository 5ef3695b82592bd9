import importlib.util
import os
import signal
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

# Under pytest-xdist (the README's command runs two workers) each worker gets its share of the cores: torch's
# default of one thread a core in every worker made CPU-bound tests wait on each other (tests/eval/test_mqar.py's
# training 67 s against 17 s alone on the 2-core CI machine, 2026-12-07).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


# A suite started as a background job (`nohup ... &`, a script's `... &`) inherits SIGINT ignored, and so does every
# command a test starts: `foxformer train` then prints its note that Ctrl-C will not stop it, a line the tests of
# its output do not expect. A handler of our own is not inherited across exec: the commands start as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
