"""scripts/reproduce.sh picks each run's evaluations by its name; its evaluate function, run with a stub that
records the step names instead of running them (the script itself needs a GPU and the prepared data)."""
import os
import shutil
import subprocess

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "reproduce.sh")

EVALS = {
    "fox-pro-small": ["eviction", "eval_loss", "gates", "bias_shift", "eval_niah"],
    "fox-llama-small_fgate-fixed": ["eval_loss", "gates", "bias_shift", "eval_niah"],
    "transformer-pro-small": ["eval_loss", "eval_niah"],
    # no keys to evict, but a forget gate to analyse and shift
    "linear-pro-small": ["eval_loss", "gates", "bias_shift", "eval_niah"],
    "fox-pro-small_attention-linear": ["eval_loss", "gates", "bias_shift", "eval_niah"],
}


def evaluations(run: str) -> list[str]:
    body = open(SCRIPT).read()
    start = body.index("evaluate() {")
    function = body[start:body.index("\n}\n", start) + 3]
    stub = 'step() { echo "${1%%_$p.log}"; }\nFX=fx NIAH=1\n'
    out = subprocess.run(["bash", "-c", f'{function}{stub}evaluate "$1"', "bash", run], capture_output=True,
                         text=True, check=True)
    return out.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("run", list(EVALS), ids=list(EVALS))
def test_each_run_gets_the_evaluations_its_model_supports(run):
    assert evaluations(run) == EVALS[run]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_parses():
    subprocess.run(["bash", "-n", SCRIPT], check=True)
