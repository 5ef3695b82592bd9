"""Just enough of R's serialization format (XDR, versions 2 and 3) to read the character vectors of an R
package's lazy-load data base (data/Rdata.rdx + Rdata.rdb), where CRAN packages keep their data sets.

Read: NULL, character, integer, double, logical and generic vectors, pairlists (attributes, tags), symbols
and references to them. Anything else raises ValueError naming the type (no silent partial reads).
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib

NIL, SYM, LIST, CHAR, LGL, INT, REAL, STR, VEC, REF, NILVALUE = 0, 1, 2, 9, 10, 13, 14, 16, 19, 255, 254
_HAS_ATTR, _HAS_TAG = 1 << 9, 1 << 10


class _Reader:
    def __init__(self, data: bytes):
        if data[:2] != b"X\n":
            raise ValueError("rdata: not an XDR serialization (expected the header 'X\\n')")
        self.data, self.pos, self.refs = data, 2, []
        version = self.int()
        self.int(), self.int()  # the writer's R version, the oldest reader's
        if version == 3:
            length = self.int()
            self.pos += length  # the native encoding's name
        elif version != 2:
            raise ValueError(f"rdata: serialization version {version} (expected 2 or 3)")

    def int(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def item(self):
        flags = self.int()
        kind = flags & 0xFF
        if kind in (NILVALUE, NIL):
            return None
        if kind == REF:
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if kind == SYM:
            name = self.item()
            self.refs.append(name)
            return name
        if kind == LIST:
            out = {}
            while True:  # a pairlist: (tag, value) cells until NILVALUE, read as a dict (duplicate tags: last)
                if flags & _HAS_ATTR:
                    self.item()  # a cell's own attributes: nothing a data set's text needs
                tag = self.item() if flags & _HAS_TAG else None
                out[tag if tag is not None else len(out)] = self.item()
                flags = self.int()
                if flags & 0xFF == NILVALUE:
                    return out
                if flags & 0xFF != LIST:
                    raise ValueError(f"rdata: a pairlist ends in an object of type {flags & 0xFF}, not NULL")
        if kind == CHAR:
            n = self.int()
            if n == -1:
                return None
            text = self.data[self.pos:self.pos + n].decode("utf-8", errors="replace")
            self.pos += n
            return text
        if kind in (STR, VEC, INT, LGL, REAL):
            n = self.int()
            if kind == STR or kind == VEC:
                value = [self.item() for _ in range(n)]
            else:
                fmt, size = (">d", 8) if kind == REAL else (">i", 4)
                value = list(struct.unpack_from(f">{n}{fmt[1]}", self.data, self.pos))
                self.pos += n * size
            if flags & _HAS_ATTR:
                attrs = self.item()
                names = attrs.get("names") if isinstance(attrs, dict) else None
                if kind == VEC and names is not None:
                    return dict(zip(names, value))
            return value
        raise ValueError(f"rdata: R object type {kind} is not supported by this reader")


def unserialize(data: bytes):
    """The R object serialized in ``data`` (uncompressed XDR) as Python lists, dicts and scalars."""
    return _Reader(data).item()


def _decompress_chunk(chunk: bytes) -> bytes:
    """A lazy-load data base entry: 4 bytes of length, then zlib (R's default), or a type byte and bzip2
    ('2'), xz ('X'), zlib ('Z') or nothing ('0')."""
    (size,) = struct.unpack_from(">I", chunk, 0)
    body = chunk[4:]
    if body[:1] in (b"2", b"X", b"Z", b"0"):
        kind, body = body[:1], body[1:]
        out = {b"2": bz2.decompress, b"X": lzma.decompress, b"Z": zlib.decompress, b"0": bytes}[kind](body)
    else:
        out = zlib.decompress(body)
    if len(out) != size:
        raise ValueError(f"rdata: an entry decompressed to {len(out)} bytes, its header says {size}")
    return out


def lazy_load(rdx: bytes, rdb: bytes) -> dict:
    """Every variable of a lazy-load data base: name -> value (``rdx`` gzip-compressed, as R writes it)."""
    index = unserialize(gzip.decompress(rdx))
    if not isinstance(index, dict) or "variables" not in index:
        raise ValueError("rdata: the .rdx file holds no 'variables' index")
    out = {}
    for name, (offset, length) in index["variables"].items():
        out[name] = unserialize(_decompress_chunk(rdb[int(offset):int(offset) + int(length)]))
    return out
