"""JSON Lines documents: one object a line, its text in one field. A line of another shape is refused by file and
line, with what it holds and the command that rewrites the file so that it reads (jq, where one line of it does).

A file's first line speaks for the whole file (a plain-text file named .jsonl, a field named otherwise); a later
line is one row gone wrong among rows that read, and its fix is that row's."""

from __future__ import annotations

import json
import re
import shlex
from functools import partial
from typing import Callable, Iterator

from ..argtypes import SettingError, did_you_mean
from ..paths import decode_utf8

# Half of a UTF-16 surrogate pair: no character, and not encodable as UTF-8
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def jq(path: str, decompress: str | None, program: str, raw: bool = False) -> str:
    """The shell command that rewrites the file ``path`` by the jq ``program`` into fixed.jsonl, one JSON value a
    line, as a message shows it; ``decompress``: the command that writes a compressed file's bytes (jq reads none);
    ``raw``: its input is lines of text."""
    command = f"jq -{'R' if raw else ''}c {shlex.quote(program)}"
    if decompress:
        command = f"{decompress} {shlex.quote(path)} | {command}"
    else:
        command = f"{command} {shlex.quote(path)}"
    return f"`{command} > fixed.jsonl`"


def jq_key(field: str) -> str:
    """``field`` as jq names a key: bare where it can be, quoted otherwise (``text``, ``"the text"``)."""
    return field if re.fullmatch(r"[A-Za-z_]\w*", field, re.ASCII) else json.dumps(field)


def _is_texts(value) -> bool:
    """Whether ``value`` is a list of texts (a document's paragraphs)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def _what(value) -> str:
    """A row's value as a message names it."""
    if isinstance(value, list):
        return "a list of texts" if _is_texts(value) else "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (bool, int, float)):
        return f"{json.dumps(value)} (a {'boolean' if isinstance(value, bool) else 'number'})"
    return f"a value of type {type(value).__name__}"  # a Parquet or Hugging Face column's bytes, dates, ...


def text_value(value, where: str, text_field: str, fix: Callable[[object], str] = lambda value: "") -> str:
    """A row's text: null is an empty document (skipped, as Parquet nulls are); str(None) made one "None", and a
    list's repr was tokenized as the document. ``fix``: what to do about another value, said after it."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SettingError("source", f"{where} has {_what(value)} in field {text_field!r}, not text{fix(value)}")
    return value


def _texts_in(row: dict) -> list[str]:
    """The fields of ``row`` that hold text."""
    return [k for k, v in row.items() if isinstance(v, str)]


def _rewrite(value, row: dict, text_field: str, fix: Callable[..., str]) -> str:
    """How a JSONL row's text field of ``value`` becomes text, said after what it holds."""
    key = jq_key(text_field)
    if _is_texts(value):
        newline = json.dumps("\n")
        return f": join them into one ({fix(f'.{key} |= join({newline})')})"
    inner = _texts_in(value) if isinstance(value, dict) else []
    if inner:  # the longest text is the document's rather than its language's or title's
        inner = max(inner, key=lambda k: len(value[k]))
        return f": a field inside it is not read; copy its text out ({fix(f'.{key} |= .{jq_key(inner)}')})"
    others = ", ".join(map(repr, _texts_in(row)))
    where = f"; the line has text in {others}" if others else ""
    return f"; texts are JSON strings: quote it if it is one{where}"


def _start(line: str, width: int = 40) -> str:
    """The start of a line, as a message shows it."""
    line = line.rstrip()
    return repr(line if len(line) <= width else line[:width] + "...")


def _not_json(where: str, line: str, e: json.JSONDecodeError, first: bool, last: bool, text_field: str,
              fix: Callable[..., str]) -> str:
    """Why a line that is not JSON is not, and its fix."""
    body = line.rstrip()
    # a string cut off is named where it starts, not where the line ends
    cut = e.pos >= len(body) or e.msg.startswith("Unterminated string")
    shown = f"(the line starts {_start(line)})"
    if cut and last:  # no newline after it: the file stops inside the value
        return (f"{where} ends inside a JSON value, with no newline after it: the file is cut short (an interrupted "
                f"download or write?); fetch or write it again, or delete that line")
    if cut and e.msg.startswith("Invalid control character"):  # a text's line break written as it is
        return (f"{where} ends inside a JSON string {shown}: a line break inside a text is written \\n in JSON "
                f"Lines (json.dumps writes it so), each object whole on its line")
    if cut:  # said "not valid JSON (Expecting value: line 2 column 1)"
        return (f"{where} ends inside a JSON value {shown}: JSONL takes one whole object per line, and a .json file "
                f"of one value over several lines (an array, pretty-printed) is not read: write it one object a line "
                f"({fix('.[]')} does that for an array, {fix('.')} for objects one after another)")
    if e.msg == "Extra data":
        return (f"{where} holds more than one JSON value (the second at column {e.colno}) {shown}: JSONL takes one "
                f"object per line ({fix('.')} writes each one on its own)")
    if first and not body.startswith(("{", "[")):
        return (f"{where} is not JSON {shown}: the file looks like plain text; name it .txt to read it as one "
                f"document, or make each line a document ({fix(f'{{{jq_key(text_field)}: .}}', raw=True)})")
    if line[e.pos:e.pos + 1] == "'":
        return (f"{where} is not valid JSON at column {e.colno} {shown}: JSON quotes with \", where a Python "
                f"dict's repr has ' (write each row with json.dumps)")
    # json's own "line 1" is the row's: its column is the one to name
    return f"{where} is not valid JSON at column {e.colno} ({e.msg}) {shown}"


def _no_field(where: str, row: dict, text_field: str, first: bool, fix: Callable[..., str]) -> str:
    """Why a row without the text field is refused, and its fix."""
    fields = ", ".join(map(repr, list(row)[:5])) + (", ..." if len(row) > 5 else "")
    outer, dot, inner = text_field.partition(".")
    if dot and isinstance(row.get(outer), dict):  # "meta.text": the fix said was the one just taken
        return (f"{where} has no field {text_field!r}: a field inside another ({outer!r}) is not read; copy the text "
                f"to a top-level field ({fix(f'. + {{text: .{jq_key(outer)}.{jq_key(inner)}}}')}) and give that")
    close = did_you_mean(text_field, _texts_in(row))
    if first:
        return f"{where} has no field {text_field!r} (its fields: {fields}){close}; set text_field / --text-field"
    return (f"{where} has no field {text_field!r}, which the lines before it have (its fields: {fields}){close}: "
            f"fix the line, or leave out the rows without it ({fix(f'select(has({json.dumps(text_field)}))')})")


def rows(fh, path: str, text_field: str, decompress: str | None = None,
         leave_out: str = "leave it out", in_folder: bool = False,
         head: Callable[[], bytes] | None = None) -> Iterator[tuple[str, str, str]]:
    """(id, "file:line", text) of each document of a JSONL file's lines, ``fh`` its bytes (decompressed);
    ``decompress``: the command that decompresses a compressed one, for the fixes' commands; ``leave_out`` and
    ``head``: how a fix says to do without the file, and its first bytes (decode_utf8's). Blank lines are none.
    ``in_folder``: the file is one of a source folder's, whose first line refused says how to do without it too (a
    package.json or a settings file among the documents holds none, and its fixes were jq commands that rewrite
    it)."""
    fix = partial(jq, path, decompress)
    first = True

    def refused(said: str) -> SettingError:
        return SettingError("source", f"{said}; if the file holds no documents, {leave_out}" if first and in_folder
                            else said)

    offset = 0  # of the line in the file's (decompressed) bytes
    for lineno, raw in enumerate(fh, 1):
        # `cat a.jsonl b.jsonl` keeps b's byte-order mark at the start of a line, which no JSON value starts with
        line = decode_utf8(raw, path, lineno, leave_out, offset, head).lstrip("\ufeff")
        offset += len(raw)
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise refused(_not_json(where, line, e, first, not raw.endswith(b"\n"), text_field, fix)) from None
        if not isinstance(row, dict):  # a .json file holding one array is the usual case
            split = f" ({fix('.[]')} writes an array one element a line)" if isinstance(row, list) else ""
            raise refused(f"{where} holds a JSON {type(row).__name__}, not an object: JSONL takes one object per "
                          f"line, e.g. {{\"{text_field}\": \"...\"}}{split}")
        if text_field not in row:
            raise refused(_no_field(where, row, text_field, first, fix))
        first = False
        text = text_value(row[text_field], where, text_field, lambda value: _rewrite(value, row, text_field, fix))
        # JSON's escapes are the one way into a str of half a UTF-16 pair: gpt2 read it as U+FFFD in silence,
        # the bytes and Hugging Face tokenizers stopped with an error that named no file
        lone = _LONE_SURROGATE.search(text) if b"\\u" in raw else None
        if lone:
            raise SettingError("source", f"{where} holds \\u{ord(lone.group()):04x} in field {text_field!r}, half "
                                         f"of a UTF-16 surrogate pair without its other half, which is no text: fix "
                                         f"the row (\\ufffd is the replacement character) or leave the file out")
        yield str(row.get("id", where)), where, text
