"""argparse types for the comma-separated lists the CLI commands take (--lengths 1024,2048 ...), token counts
with suffixes (``16K`` = 16,000, ``16Ki`` = 16,384, likewise ``M``/``Mi``/``G``/``Gi``/``T``/``Ti``), text with
backslash escapes (``--stop '\\n'``), the "did you mean" hint of every check that refuses an unknown name (one
name, or each of a list's: unknown_words), and how a check that serves both the Python API and the CLI names a
setting (``top_p`` or ``--top-p``); and the --no-progress flag the commands share."""
from __future__ import annotations

import argparse
import difflib
import functools
import math
import re
import sys
from typing import Any, Callable

_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([KMGT]i?)?\s*$", re.IGNORECASE)
_SCALE = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
# What the suffixes mean, said by the help of every option that reads a count (see count_type): `--seq-len 1k`
# ran at 1000 tokens where the help showed only Ki
COUNT_SUFFIXES = "k/M: powers of 1000, Ki/Mi: of 1024"


def parse_count(value: Any, name: str) -> int:
    """``"512Ki"`` -> 524288; ints pass through. Raises ValueError naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a token count such as 524288 or '512Ki', got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = _COUNT.match(value)
        if m:
            scale = _SCALE[m.group(2).lower()] if m.group(2) else 1
            count = float(m.group(1)) * scale
            if count == round(count):  # "1000.5" or "0.1Ki" is no count of tokens: refuse rather than round
                return int(round(count))
    raise ValueError(f"{name}: expected a token count such as 524288 or '512Ki', got {value!r}")


def _items(text: str) -> list[str]:
    """The items of a comma-separated list. An empty one ("256,,512", a trailing comma) is refused: the value
    a typo lost would otherwise leave a smaller grid that looks complete."""
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"empty item in {text!r}: separate the values with single commas")
    return items


def ints(text: str) -> list[int]:
    items = _items(text)
    try:
        return [int(x) for x in items]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e


def floats(text: str) -> list[float]:
    items = _items(text)
    try:
        values = [float(x) for x in items]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from e
    # float() reads "nan" and "inf": `bias-shift --shifts nan` then failed only once the model and the data had
    # loaded, in the gates' words
    if not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers, got {text!r}")
    return values


def words(text: str) -> list[str]:
    return _items(text)


def model_specs(text: str) -> list[str]:
    """Comma-separated ``kind[:key=value,...]`` model specs: a ``key=value`` item continues the spec before it,
    so that "fox-llama:fgate=fixed,rope=true,transformer-pro" is two models (a model's second override was
    read as a model of its own)."""
    specs: list[str] = []
    for item in _items(text):
        if specs and ":" in specs[-1] and "=" in item and ":" not in item.partition("=")[0]:
            specs[-1] += f",{item}"
        else:
            specs.append(item)
    return specs


def count_type(kind):
    """Mark the argparse type ``kind`` as one that reads token counts: the CLI's help formatter then ends the help
    of each option of it with COUNT_SUFFIXES, so that every such option says it once and in the same words."""
    kind.count_type = True
    return kind


def is_count_type(kind) -> bool:
    """Whether ``kind`` (an option's argparse type) was marked by count_type."""
    return getattr(kind, "count_type", False)


@count_type
def count(text: str) -> int:
    """One token count: 4096, 4Ki, 4K (as the training config takes them)."""
    try:
        return parse_count(text, "count")
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a token count such as 4096 or 4Ki, got {text!r}") from e


@count_type
def length(text: str) -> int:
    """A sequence length, read as count reads it, with a note on stderr where a k or M made it: "4k" is 4000
    tokens and runs as such, while a length so written is usually meant as 4Ki = 4096 (`eval loss --seq-len 4k`
    measured P(l) up to 2048 only). The value typed is kept; the note gives the spelling of the other."""
    value = count(text)
    if note := decimal_length_note(text):
        print(f"note: {note}", file=sys.stderr)
    return value


def decimal_length_note(value: Any) -> str | None:
    """What length notes of a sequence length written with a k or M ("4k is 4,000 tokens (...); 4Ki is 4,096"),
    for each command that reads one (train's context too); None for any other value, a number not written as
    text among them."""
    m = _COUNT.match(value) if isinstance(value, str) else None
    if not (m and m.group(2) and not m.group(2).lower().endswith("i")):
        return None
    binary = f"{m.group(1)}{m.group(2).upper()}i"
    try:
        tokens = parse_count(value, "count")
    except ValueError:  # no count at all: the check that reads it refuses it
        return None
    try:
        other = f"; {binary} is {parse_count(binary, 'count'):,}"
    except ValueError:  # "1.1Ki" is no whole count
        other = ""
    return f"{value.strip()} is {tokens:,} tokens ({COUNT_SUFFIXES}){other}"


def _int_from(text: str, least: int, said: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {said}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {said}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1, refused while the arguments are parsed: a count of bins or rounds that a check deep in the
    work would refuse only after the model or data had loaded."""
    return _int_from(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a count of warm-up steps, where none is a choice), refused as positive_int refuses."""
    return _int_from(text, 0, "a non-negative integer")


def positive_ints(text: str) -> list[int]:
    """Comma-separated integers >= 1."""
    items = _items(text)
    try:
        return [_int_from(x, 1, "a positive integer") for x in items]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None


@count_type
def counts(text: str) -> list[int]:
    """Comma-separated token counts: 1Ki,2048,4K."""
    return [count(x) for x in _items(text)]


@count_type
def lengths(text: str) -> list[int]:
    """Comma-separated sequence lengths, each read as length reads it."""
    return [length(x) for x in _items(text)]


def distinct(kind):
    """The list type ``kind`` refusing a value given twice: a benchmark timed it twice as separate rows, or (the
    same provider twice) merged the two into one row as if they were rounds."""
    @functools.wraps(kind)  # its name, in argparse's errors, and its count_type mark
    def parse(text: str) -> list:
        values = kind(text)
        repeated = [v for i, v in enumerate(values) if v in values[:i]]
        if repeated:
            raise argparse.ArgumentTypeError(f"{text!r} gives {repeated[0]!r} more than once")
        return values
    return parse


_ESCAPE = re.compile(r"\\(?:([nrt\\])|x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.?))", re.DOTALL)
_CONTROL = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
ESCAPES = r"\n, \t, \r, \\ (a backslash), \xNN, \uNNNN, \UNNNNNNNN"


def escaped(text: str) -> str:
    r"""``text`` with its backslash escapes read (ESCAPES; \xNN and \uNNNN are code points, as in Python), for text
    a shell makes hard to type: ``--stop '\n'``. Any other backslash is refused rather than kept, so that a typo
    does not pass as literal text."""
    def read(m: re.Match) -> str:
        control, *codes, other = m.groups()
        if control:
            return _CONTROL[control]
        code = next((c for c in codes if c), None)
        if code is None:
            shown = text[m.start():m.start() + 2 + _HEX_DIGITS.get(other, 0)]
            why = (f"\\{other} takes {_HEX_DIGITS[other]} hex digits" if other in _HEX_DIGITS else
                   "a lone backslash ends the text" if not other else f"\\{other} is no escape")
            raise argparse.ArgumentTypeError(f"bad escape \"{shown}\" in \"{text}\": {why}; the escapes are {ESCAPES}")
        point = int(code, 16)
        if 0xD800 <= point <= 0xDFFF or point > 0x10FFFF:
            raise argparse.ArgumentTypeError(f"bad escape \"{m.group(0)}\" in \"{text}\": U+{point:04X} is no "
                                             f"character (a surrogate, or past U+10FFFF); write one past U+FFFF as "
                                             f"\\UNNNNNNNN")
        return chr(point)

    return _ESCAPE.sub(read, text)


def no_progress_arg(parser: argparse.ArgumentParser, bars: str | None) -> None:
    """--no-progress, with ``bars`` saying which bars it turns off (what the command draws them for); None for a
    command that draws none and takes the flag only so that scripts may pass it to every command alike."""
    parser.add_argument("--no-progress", action="store_true",
                        help=f"no progress bars ({bars})" if bars else
                        "accepted as by the other commands; this one shows no progress bar")


def did_you_mean(word, choices) -> str:
    """`` (did you mean 'x'?)`` with the choice closest to ``word``, or "" when none is close."""
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_words(values, choices) -> str:
    """Those of ``values`` not among ``choices``, comma-separated, each with its did_you_mean ("'standart' (did you
    mean 'standard'?)"), or "" where all are known: how every list of names from a fixed set answers a typo."""
    return ", ".join(f"{v!r}{did_you_mean(v, choices)}" for v in values if v not in choices)


def setting_name(label: str, field: str, flag: str | None = None) -> str:
    """``field`` as ``label`` names it: "{}" the keyword itself, "FoxConfig.{}" a config's attribute, "--{}" a
    command's flag (underscores become dashes): one check serves the Python API and the CLI, each in its words.
    ``flag``: the flag's own name where it is not the keyword's (``--smooth`` sets ``smooth_window``)."""
    text = label.format(flag if flag and label.startswith("--") else field)
    return text.replace("_", "-") if text.startswith("--") else text


class SettingError(ValueError):
    """A setting refused by a check deep inside a call that serves both the Python API and the CLI (a source's
    reader, a tokenizer's loader), too deep to thread a ``label`` down to: the message names ``field`` as the API
    does (``out_dir: ...``), and a command re-says ``reason`` after the flag its user typed (``--out: ...``).

    A reason that names other settings too is a function of how to name one (``lambda name: f"... {name('seed')}"``):
    ``reason`` holds it in the API's words, and ``said(name)`` in a command's, through the same table as ``field``."""

    def __init__(self, field: str, reason: str | Callable[[Callable[[str], str]], str]):
        self._words = reason if callable(reason) else lambda name: reason
        self.field, self.reason = field, self.said(lambda key: key)
        super().__init__(f"{field}: {self.reason}")

    def said(self, name: Callable[[str], str]) -> str:
        """The reason with each setting it names as ``name(field)`` calls it."""
        return self._words(name)

    def in_flags(self, flags: dict[str, str]) -> ValueError:
        """This error as a command says it: its field and each setting its reason names as the flag in ``flags``
        that sets it (``--out: ...``); ``flags`` holds the field. None is a flag left out, which a command line
        cannot spell."""
        reason = self.said(lambda field: flags.get(field, field)).replace(" or None", " (or leave the flag out)")
        return ValueError(f"{flags[self.field]}: {reason}")

    # pickled as its arguments (a worker's error reaching its parent), not as args[0] alone; a reason that names
    # settings travels in the API's words, as a function does not pickle
    def __reduce__(self):
        return SettingError, (self.field, self.reason)


def unset_said(label: str) -> str:
    """How a message of ``label``'s check (see setting_name) tells to leave a setting unset: a flag's user cannot
    type None, and was offered it ("--top-p: expected a number in (0, 1] or None")."""
    return "leave it out" if label.startswith("--") else "None"
