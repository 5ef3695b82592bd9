"""Every ```python block of the README, docs/ and the package's READMEs that imports foxformer runs as written
(the README's model block used input_ids and mask without defining them: a NameError for whoever pasted it).
Only sizes shrink, so that the blocks run in seconds on a CPU; each shrink must still find its text, so a doc
that changes its sizes is looked at again here instead of running at full size."""
import re

import pytest

from .test_docs_commands import DOCS, ROOT

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
IMPORTS_FOXFORMER = re.compile(r"^\s*(from|import) foxformer\b", re.M)
# a block's first line: the replacements that bring it to sizes a CPU test affords
SHRINK = {
    "import torch, torch.nn.functional as F": [("4096", "64")],
    "import torch": [('"fox-pro-125m"', '"fox-pro-tiny"'), ("(2, 32)", "(2, 8)"),
                     ("max_new_tokens=64", "max_new_tokens=2")],
}


def _line(text: str, at: int) -> int:
    return text[:at].count("\n") + 1


BLOCKS = [pytest.param(m.group(1), id=f"{doc.relative_to(ROOT)}:{_line(text, m.start())}")
          for doc in DOCS for text in [doc.read_text()] for m in FENCE.finditer(text)
          if IMPORTS_FOXFORMER.search(m.group(1))]


def test_the_docs_show_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("code", BLOCKS)
def test_documented_python_block_runs(code):
    first = code.splitlines()[0]
    assert first in SHRINK, f"a new block, starting {first!r}: add its sizes to SHRINK (or [] to run it as it is)"
    for old, new in SHRINK[first]:
        assert old in code, f"{old!r} is no longer in the block starting {first!r}: update SHRINK"
        code = code.replace(old, new)
    exec(compile(code, "<doc>", "exec"), {})
