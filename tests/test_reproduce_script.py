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


def evaluations(run: str, env: str = "") -> list[str]:
    body = open(SCRIPT).read()
    start = body.index("eval_sources() {")
    function = body[start:body.index("\n}\n", body.index("evaluate() {")) + 3]
    stub = f'step() {{ echo "${{1%%_$p.log}}"; }}\nFX=fx NIAH=1 EVICTION=1 BIAS_SHIFT=1 {env}\n'
    out = subprocess.run(["bash", "-c", f'{function}{stub}evaluate "$1"; true', "bash", run], capture_output=True,
                         text=True, check=True)
    return out.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("run", list(EVALS), ids=list(EVALS))
def test_each_run_gets_the_evaluations_its_model_supports(run):
    assert evaluations(run) == EVALS[run]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_out_of_domain_and_per_source_evaluations_join_when_asked():
    """Every loss before any gate analysis: a deadline cuts the last steps, and the losses are the comparison."""
    env = 'OOD="austen=d1 go=d2" EVAL_SOURCES=prose NIAH=0 EVICTION=0 BIAS_SHIFT=0'
    assert evaluations("fox-pro-small_s1", env) == ["eval_loss", "eval_ood_austen", "eval_ood_go", "eval_src_prose",
                                                    "gates_ood_austen", "gates_ood_go", "gates"]
    assert evaluations("transformer-pro-small_s1", env) == ["eval_loss", "eval_ood_austen", "eval_ood_go",
                                                            "eval_src_prose"]
    # a leave-one-domain-out call: the left-out source right after the mix
    assert evaluations("transformer-pro-small_s1", env + " SOURCES_FIRST=1") == [
        "eval_loss", "eval_src_prose", "eval_ood_austen", "eval_ood_go"]
    # texts added to seeds whose mix an earlier call evaluated (issue20.sh lodo-rest)
    assert evaluations("fox-pro-small_s1", 'OOD="go=d2" EVAL_SOURCES=prose NIAH=0 EVICTION=0 BIAS_SHIFT=0 '
                       'SOURCES_FIRST=1 EVAL_MIX=0') == ["eval_src_prose", "eval_ood_go", "gates_ood_go", "gates"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_parses():
    subprocess.run(["bash", "-n", SCRIPT], check=True)
