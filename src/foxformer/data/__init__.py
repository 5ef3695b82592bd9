"""Data: sources -> tokenizer -> memory-mapped token arrays -> fixed-length training sequences.

Names are imported on first use (see foxformer._lazy): `foxformer data --help` needs none of them.
"""
from .._lazy import lazy_exports

_EXPORTS = {"TokenDataset": ".dataset", "PrepareConfig": ".preparation", "prepare": ".preparation",
            "read_manifest": ".preparation", "Document": ".sources", "iter_documents": ".sources",
            "Tokenizer": ".tokenizer", "load_tokenizer": ".tokenizer"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = list(_EXPORTS)
