"""JSON as a person reads it: the commands' printed summaries and the reports they write.

json.dumps escapes every non-ASCII character by default, so a path under "Données" printed as "Donn\\u00e9es" and a
Japanese document title as a row of \\uXXXX. Standard library only: every floor of the package prints or writes one.
"""
from __future__ import annotations

import json
import sys


def _encodes(char: str, encoding: str) -> bool:
    try:
        char.encode(encoding)
    except UnicodeEncodeError:
        return False
    return True


def json_text(obj, *, encoding: str = "utf-8", **options) -> str:
    """``obj`` as ``json.dumps(obj, **options)`` with its non-ASCII characters as themselves, except those
    ``encoding`` cannot hold, which keep JSON's escape: a terminal's ASCII or cp1252 (printing raised
    UnicodeEncodeError), and in any encoding the lone surrogate an undecodable file name becomes (writing the file
    raised). json.loads reads back the same object either way."""
    text = json.dumps(obj, ensure_ascii=False, **options)
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        # only characters inside JSON strings can fail (its syntax is ASCII), where an escape means the same
        return "".join(c if _encodes(c, encoding) else json.dumps(c)[1:-1] for c in text)
    return text


def print_json(obj, **options) -> None:
    """``obj`` printed as json_text for stdout's encoding, flushed (a log sees it as it is printed)."""
    print(json_text(obj, encoding=getattr(sys.stdout, "encoding", None) or "utf-8", **options), flush=True)
