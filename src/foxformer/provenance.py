"""Which code a result came from (stored with benchmarks and training runs)."""
from __future__ import annotations

import os
import subprocess


def code_version() -> str | None:
    """The foxformer commit a result came from: $FOXFORMER_COMMIT (set it where the checkout has no
    usable .git, e.g. a copied tree on a GPU machine), else `git rev-parse HEAD` with "+dirty" for
    uncommitted changes, else None."""
    if os.environ.get("FOXFORMER_COMMIT"):
        return os.environ["FOXFORMER_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=here, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        # an installed copy inside someone else's repository must not report that repository's commit
        if not top or not os.path.samefile(os.path.join(top, "src", "foxformer"), here):
            return None
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None
