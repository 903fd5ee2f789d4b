from diag.testing import EvidenceBuilder, run_check

from diag_example_plugin.checks import slow_step


def test_fires_on_slow_cuda_steps():
    ev = EvidenceBuilder().cuda_training().steps(10, total_s=2.5).build()
    (f,) = run_check(slow_step, ev)
    assert f.severity == "warning" and f.id == "example.slow-step" and "2.50 s" in f.message


def test_passes_fast_steps_and_skips_cpu():
    (f,) = run_check(slow_step, EvidenceBuilder().cuda_training().steps(10, total_s=0.2).build())
    assert f.severity == "pass" and "200.0 ms" in f.message
    (g,) = run_check(slow_step, EvidenceBuilder().model(device="cpu").steps(10, total_s=2.5).build())
    assert g.severity == "skipped" and "trains on cpu" in g.message
