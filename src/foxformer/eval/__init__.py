"""Evaluation instruments: per-position loss, needle in a haystack, forget-gate analysis, harness, reports.

Python API (the CLI commands `foxformer eval ...`, `foxformer analyze gates`, `foxformer report` wrap these):
    load_model(path) -> LoadedModel              run dir, checkpoint dir or Hugging Face folder
    per_token_loss(model, tokens) -> [N, T-1]    fp32 next-token losses
    eval_loss / loss_curve -> LossCurve          L(i), P(l), bootstrap bands
    niah_grid(model, tokenizer, haystack, lengths=...) -> NiahResult
    gate_stats(model, tokens) -> GateStats; head_matrices(model, tokens, heads)
    save_loss / save_niah / save_gates           JSON + PNG into a folder; build_report(run_dirs, out)

Names are imported on first use (see foxformer._lazy): `foxformer eval --help` needs none of them.
"""
from .._lazy import lazy_exports

_EXPORTS = {"GateStats": ".gates", "capture_attention": ".gates", "choose_heads": ".gates", "gate_stats": ".gates",
            "head_matrices": ".gates", "parse_heads": ".gates", "HarnessAdapter": ".harness",
            "lm_eval_available": ".harness", "make_lm": ".harness", "run_harness": ".harness",
            "LoadedModel": "foxformer.train.loading", "load_model": "foxformer.train.loading",
            "wrap_model": "foxformer.train.loading", "LossCurve": ".loss",
            "bootstrap_mean_bands": ".loss", "eval_loss": ".loss", "loss_curve": ".loss",
            "per_token_loss": ".loss", "smooth": ".loss", "MODES": ".niah", "Needle": ".niah", "NiahCase": ".niah",
            "NiahResult": ".niah", "build_case": ".niah", "make_needle": ".niah", "niah_grid": ".niah",
            "normalize": ".niah", "run_case": ".niah", "save_gates": ".outputs", "save_loss": ".outputs",
            "save_niah": ".outputs", "build_report": ".report", "dataset_sequences": ".sequences",
            "document_token_stream": ".sequences", "source_sequences": ".sequences", "SkippedFiles": ".sequences"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = list(_EXPORTS)
