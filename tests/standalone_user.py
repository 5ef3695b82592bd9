"""Run as a script by the standalone-export tests: use exported folders as a user with only torch, transformers
(and lm_eval) would; foxformer, triton and tiktoken cannot be imported here. Saves what they compute.

    python standalone_user.py models JOB.json OUT.pt    JOB: {folder: {"ids": [[...]], "new_tokens": n,
                                                              "texts": [...], "remote_tokenizer": bool,
                                                              "resave": folder to save_pretrained into}}
    python standalone_user.py lm_eval JOB.json OUT.pt   JOB: {"model_args": "...", "tasks": [...],
                                                              "include_path": "..."}
"""
import importlib.abc
import json
import sys


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("foxformer", "triton", "tiktoken"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, _Absent())

import torch  # noqa: E402


def _model(folder: str, job: dict) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    ids = torch.tensor(job["ids"])
    with torch.no_grad():
        logits = model(ids).logits
    generated = model.generate(ids[:1], max_new_tokens=job["new_tokens"], do_sample=False)
    out = {"module": type(model).__module__, "logits": logits, "generated": generated[0].tolist()}
    if job.get("texts"):
        remote = job["remote_tokenizer"]
        # False, not left out: AutoTokenizer reads the folder's config.json first, whose auto_map names code
        tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=remote)
        out["encoded"] = [tok(text).input_ids for text in job["texts"]]
        out["decoded"] = [tok.decode(x, skip_special_tokens=True) for x in out["encoded"]]
        out["eos"] = {"tokenizer": tok.eos_token_id, "generation_config": model.generation_config.eos_token_id}
        out["pad"] = {"tokenizer": tok.pad_token_id, "generation_config": model.generation_config.pad_token_id}
        pipe = pipeline("text-generation", model=folder, trust_remote_code=True)
        out["pipeline"] = pipe(job["texts"][0], max_new_tokens=3, do_sample=False)[0]["generated_text"]
    if job.get("resave"):
        from transformers import AutoModel

        model.save_pretrained(job["resave"])
        again = AutoModelForCausalLM.from_pretrained(job["resave"], trust_remote_code=True).eval()
        with torch.no_grad():
            out["resaved"] = {"logits": again(ids).logits,
                              "base": type(AutoModel.from_pretrained(job["resave"], trust_remote_code=True)).__name__}
    return out


def _lm_eval(job: dict) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    res = lm_eval.simple_evaluate(model="hf", model_args=job["model_args"], tasks=job["tasks"], device="cpu",
                                  task_manager=TaskManager(include_path=job["include_path"]), log_samples=True)
    samples = {task: [{"arguments": [list(a) for a in s["arguments"]], "resps": s["resps"]} for s in rows]
               for task, rows in res["samples"].items()}
    return {"results": res["results"], "samples": samples}


def main() -> None:
    mode, job_path, out_path = sys.argv[1:4]
    with open(job_path) as f:
        job = json.load(f)
    results = {folder: _model(folder, spec) for folder, spec in job.items()} if mode == "models" else _lm_eval(job)
    results["imported"] = sorted(m for m in ("foxformer", "triton", "tiktoken") if m in sys.modules)
    torch.save(results, out_path)


if __name__ == "__main__":
    main()
