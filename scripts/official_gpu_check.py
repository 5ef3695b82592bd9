"""Compare foxformer's conversion of the FoX paper's models against their own model class, on a GPU.

Their code (github zhixuan-lin/forgetting-transformer) needs CUDA: Triton kernels with autotuning, CUDA jiterator
functions in the MLP. The CPU tests compare with an fp64 forward written from their maths
(tests/models/official_reference.py); this script runs their class itself. For each variant: their model with
random weights (every norm weight and bias randomized), saved in their layout, converted by
foxformer.models.official, then logits on the same random tokens from
  - theirs under bf16 autocast (their kernels' dtype) and theirs in fp32 when their kernels accept it,
  - ours under the same autocast (Triton kernels) and ours in fp64 (torch backend: the exact reference).
Their Transformer (LLaMA) class needs fla and flash-attn and is skipped when they are missing.

Setup (CPU machine, once): their src/ and einops (a pure-Python wheel) in the git-ignored folder .official/:
    git -C /work/.mirror/zhixuan-lin+forgetting-transformer/repo archive HEAD src | tar -x -C .official
    pip download einops --no-deps -d /tmp/w && unzip -q /tmp/w/einops-*.whl -d .official/site
Run (GPU machine, repo root; carry .official):
    PYTHONPATH=src:.official/src:.official/site python scripts/official_gpu_check.py
Writes $OUT/official_gpu_check.json (or ./official_gpu_check.json) and prints a table.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import types

import torch

VARIANTS = {
    "fox-pro-released": dict(use_k_shift=True, use_v_shift=True, qk_norm=True, qk_norm_share_param_across_head=True,
                             use_output_gate=True, use_output_norm=True),
    "fox-pro-per-head": dict(use_k_shift=True, use_v_shift=True, qk_norm=True, qk_norm_share_param_across_head=False,
                             use_output_gate=True, use_output_norm=True),
    "fox-llama": dict(),
    "transformer-pro": dict(fgate_type="none", use_rope=True, use_k_shift=True, use_v_shift=True, qk_norm=True,
                            qk_norm_share_param_across_head=True, use_output_gate=True, use_output_norm=True),
}
SIZE = dict(vocab_size=50257, hidden_size=768, num_hidden_layers=2, num_heads=12, intermediate_size=2048,
            max_position_embeddings=None, fuse_cross_entropy=False)
BATCH, SEQ = 2, 2048


def _stub_pytest() -> None:
    """Their token_shift.py imports pytest for its own tests; the GPU machine may not have it."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("pytest")
        stub.mark = types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f))
        sys.modules["pytest"] = stub


def _randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g).to(p.device)
            if "norm" in name:
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(2.0 + 0.2 * noise)
            else:
                p.copy_(0.02 * noise)


def _save_theirs(model, folder: str) -> None:
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(model.config.to_dict(), f, default=str)
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
              os.path.join(folder, "model.safetensors"))


def _logits(model, ids, autocast: bool, **kw) -> torch.Tensor:
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        return model(input_ids=ids, **kw).logits.double()


def check(name: str, overrides: dict) -> dict:
    from forgetting_transformer.model.forgetting_transformer.configuration_forgetting_transformer import \
        ForgettingTransformerConfig
    from forgetting_transformer.model.forgetting_transformer.modeling_forgetting_transformer import \
        ForgettingTransformerForCausalLM

    from foxformer.models.official import load_official

    torch.manual_seed(0)
    theirs = ForgettingTransformerForCausalLM(ForgettingTransformerConfig(**SIZE, **overrides)).cuda().eval()
    _randomize(theirs, seed=1)
    folder = tempfile.mkdtemp(prefix=f"official-{name}-")
    _save_theirs(theirs, folder)
    ours = load_official(folder).cuda().eval()
    ids = torch.randint(0, SIZE["vocab_size"], (BATCH, SEQ), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(2))
    row = {"variant": name, "qk_norm_per_head": ours.config.qk_norm_per_head}
    t = time.time()
    exact = ours.double()
    exact.config.attention_backend = "torch"
    truth = _logits(exact, ids, autocast=False)
    ours = ours.float()
    ours.config.attention_backend = "auto"
    ours_bf16 = _logits(ours, ids, autocast=True)
    theirs_bf16 = _logits(theirs, ids, autocast=True, use_cache=False)
    scale = truth.abs().max().item()
    row.update(logit_scale=scale, theirs_bf16_vs_exact=(theirs_bf16 - truth).abs().max().item(),
               ours_bf16_vs_exact=(ours_bf16 - truth).abs().max().item(),
               theirs_bf16_vs_ours_bf16=(theirs_bf16 - ours_bf16).abs().max().item())
    try:
        theirs_fp32 = _logits(theirs, ids, autocast=False, use_cache=False)
        row["theirs_fp32_vs_exact"] = (theirs_fp32 - truth).abs().max().item()
    except Exception as e:  # their kernels may refuse fp32 inputs: report, do not stop
        row["theirs_fp32_vs_exact"] = f"{type(e).__name__}: {str(e)[:200]}"
    row["seconds"] = time.time() - t
    return row


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("error: this check needs a CUDA GPU (their kernels do)")
    _stub_pytest()
    rows = []
    for name, overrides in VARIANTS.items():
        try:
            rows.append(check(name, overrides))
        except Exception as e:
            rows.append({"variant": name, "error": f"{type(e).__name__}: {str(e)[:500]}"})
    try:
        import fla  # noqa: F401
        import flash_attn  # noqa: F401
        note = "transformer-llama: not run here (their class needs fla and flash-attn; add it if both are present)"
    except ImportError:
        note = "transformer-llama: skipped (their class needs fla and flash-attn, absent)"
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "batch": BATCH, "seq": SEQ, **SIZE}
    try:
        import transformers
        import triton

        env.update(transformers=transformers.__version__, triton=triton.__version__)
    except ImportError:
        pass
    out_dir = os.environ.get("OUT", ".")
    with open(os.path.join(out_dir, "official_gpu_check.json"), "w") as f:
        json.dump({"env": env, "rows": rows, "note": note}, f, indent=2)
    print(json.dumps(env))
    cols = ("theirs_bf16_vs_exact", "ours_bf16_vs_exact", "theirs_bf16_vs_ours_bf16", "theirs_fp32_vs_exact")
    print(f"{'variant':18s} {'|logit|max':>10s} " + " ".join(f"{c:>26s}" for c in cols))
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:18s} ERROR {r['error']}")
            continue
        cells = [f"{r[c]:26.3e}" if isinstance(r[c], float) else f"{str(r[c])[:26]:>26s}" for c in cols]
        print(f"{r['variant']:18s} {r['logit_scale']:10.3f} " + " ".join(cells))
    print(note)


if __name__ == "__main__":
    main()
