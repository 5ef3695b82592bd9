"""bench.common.time_ms: what a timed call includes."""
import torch

from foxformer.bench.common import time_ms


def test_timed_backward_stores_its_gradients_instead_of_adding_to_the_last_ones():
    """grad_to_none drops the leaves' gradients before each call: the benchmark times the op's backward, not an
    add of every gradient into the previous call's (which no training step with non-leaf inputs runs)."""
    x = torch.randn(7, 5, requires_grad=True)
    w = torch.randn(5, 5)

    def step():
        (x @ w).square().sum().backward()

    step()
    once = x.grad.clone()
    time_ms(step, grad_to_none=[x])
    assert torch.equal(x.grad, once)
    time_ms(step)
    assert not torch.allclose(x.grad, once)


def test_a_table_leaves_out_the_columns_no_row_fills(capsys):
    """bench decode's CPU table ran to 330 characters a line, five of its columns dashes in every row (peak memory,
    the bandwidth floors, error, skipped)."""
    from foxformer.bench.common import print_table

    text = print_table([{"model": "fox", "ms": 1.5, "error": None}, {"model": "llama", "ms": 0.75}],
                       ["model", "ms", "peak_gib", "error"])
    assert text.splitlines()[0].split() == ["model", "|", "ms"] and capsys.readouterr().out == text + "\n"
    assert "error" in print_table([{"model": "fox", "error": "OOM"}, {"model": "llama"}], ["model", "error"])


def test_a_table_is_headed_by_its_device_and_a_cpu_s_says_its_timings_are_no_gpu_figures(capsys):
    """A CPU run under --device auto (every timing command's default) printed a table that read like a GPU's."""
    from foxformer.bench.common import device_heading, print_table

    gpu = device_heading({"device": "NVIDIA H100 80GB HBM3", "cuda": "13.0"})
    assert gpu == "device: NVIDIA H100 80GB HBM3"
    cpu = device_heading({"device": "cpu", "cpu": "AMD EPYC", "threads": 2})
    assert cpu == ("device: cpu (AMD EPYC, 2 threads); CPU timings check the code path and are not comparable with "
                   "the GPU figures")
    assert device_heading({"device": "cpu", "cpu": None, "threads": 1}).startswith("device: cpu (processor unknown, "
                                                                                   "1 thread);")
    text = print_table([{"model": "fox", "ms": 1.5}], ["model", "ms"], cpu)
    assert text.splitlines()[:2] == [cpu, "model | ms "] and capsys.readouterr().out == text + "\n"
