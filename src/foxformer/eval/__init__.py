"""Evaluation instruments: per-position loss, needle in a haystack, forget-gate analysis, harness, reports.

Python API (the CLI commands `foxformer eval ...`, `foxformer analyze gates`, `foxformer report` wrap these):
    load_model(path) -> LoadedModel              run dir, checkpoint dir or Hugging Face folder
    per_token_loss(model, tokens) -> [N, T-1]    fp32 next-token losses
    eval_loss / loss_curve -> LossCurve          L(i), P(l), bootstrap bands
    niah_grid(model, tokenizer, haystack, lengths=...) -> NiahResult
    gate_stats(model, tokens) -> GateStats; head_matrices(model, tokens, heads)
    save_loss / save_niah / save_gates           JSON + PNG into a folder; build_report(run_dirs, out)
"""
from foxformer.train.loading import LoadedModel, load_model, wrap_model

from .gates import GateStats, capture_attention, choose_heads, gate_stats, head_matrices, parse_heads
from .harness import HarnessAdapter, lm_eval_available, make_lm, run_harness
from .loss import LossCurve, bootstrap_mean_bands, eval_loss, loss_curve, per_token_loss, smooth
from .niah import MODES, Needle, NiahCase, NiahResult, build_case, make_needle, niah_grid, normalize, run_case
from .outputs import save_gates, save_loss, save_niah
from .report import build_report
from .sequences import dataset_sequences, document_token_stream, source_sequences

__all__ = [
    "GateStats", "capture_attention", "choose_heads", "gate_stats", "head_matrices", "parse_heads",
    "HarnessAdapter", "lm_eval_available", "make_lm", "run_harness",
    "LoadedModel", "load_model", "wrap_model",
    "LossCurve", "bootstrap_mean_bands", "eval_loss", "loss_curve", "per_token_loss", "smooth",
    "MODES", "Needle", "NiahCase", "NiahResult", "build_case", "make_needle", "niah_grid", "normalize", "run_case",
    "save_gates", "save_loss", "save_niah", "build_report",
    "dataset_sequences", "document_token_stream", "source_sequences",
]
