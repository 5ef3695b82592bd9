import os
import sys
from pathlib import Path

# Tests run from the source tree without an install as well.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
# Triton kernels run on CPU tensors through the interpreter; it must be chosen before the
# first `import triton` anywhere in the process.
os.environ.setdefault("TRITON_INTERPRET", "1")
