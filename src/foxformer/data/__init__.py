"""Data: sources -> tokenizer -> memory-mapped token arrays -> fixed-length training sequences."""
from .dataset import TokenDataset
from .prepare import PrepareConfig, prepare, read_manifest
from .sources import Document, iter_documents
from .tokenizer import Tokenizer, load_tokenizer

__all__ = ["TokenDataset", "PrepareConfig", "prepare", "read_manifest", "Document", "iter_documents",
           "Tokenizer", "load_tokenizer"]
