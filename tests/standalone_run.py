"""Run tests/standalone_user.py in a subprocess that cannot import foxformer (the standalone-export tests)."""
import json
import os
import subprocess
import sys

import torch

USER = os.path.join(os.path.dirname(__file__), "standalone_user.py")
REMOTE_CODE_QUESTION = "Do you wish to run the custom code?"  # transformers' question without trust_remote_code


def run_as_user(tmp_path, mode: str, job: dict) -> dict:
    """standalone_user.py MODE JOB in a fresh interpreter; returns what it saved."""
    job_path, out_path = tmp_path / f"{mode}-job.json", tmp_path / f"{mode}-results.pt"
    job_path.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # tiny models: one thread (more only contend on a busy machine)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1",
               HF_MODULES_CACHE=str(tmp_path / "hf_modules"))
    # stdin closed: a load that asks "Do you wish to run the custom code? [y/N]" writes the question and reads no
    # answer, where a user at a terminal waits on it; docs/interop.md's ways of loading an export ask nothing
    proc = subprocess.run([sys.executable, USER, mode, str(job_path), str(out_path)], cwd=str(tmp_path), env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert REMOTE_CODE_QUESTION not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-4000:]
    return torch.load(out_path, weights_only=False)
