"""Do no harm (issue 26): every script of the corpus behaves under ``diag check`` as it does bare —
the same exit code, output, files (checkpoints that load where diag cannot be imported, with the same
tensors) and, on the CPU with deterministic settings, the same losses bit for bit. The harness is
tests/dnh.py; ``scripts/do-no-harm.py`` prints its table."""
import importlib.util

import pytest

import dnh

# every case runs a corpus script twice (bare and under diag): the full suite only
pytestmark = pytest.mark.slow



def _available(case: dnh.Case) -> bool:
    if "hf_trainer" in case.script:
        return importlib.util.find_spec("transformers") is not None
    if "lightning" in case.script:
        return importlib.util.find_spec("lightning") is not None or \
            importlib.util.find_spec("pytorch_lightning") is not None
    return True


@pytest.mark.parametrize("case", dnh.CASES, ids=[c.id for c in dnh.CASES])
def test_the_script_behaves_under_diag_as_it_does_bare(case, tmp_path):
    if not _available(case):
        pytest.skip(f"{case.script} needs a framework that is not installed")
    diffs = dnh.run_case(case, tmp_path)
    assert not diffs, f"{case.script} {' '.join(case.args)} under diag:\n" + "\n".join(diffs)


def test_the_harness_sees_a_difference_when_there_is_one(tmp_path):
    """The harness is not blind: a script whose loss depends on whether diag is in the process, and
    that writes diag's name into its checkpoint under diag, fails every comparison it should."""
    import shutil
    import sys
    from pathlib import Path

    src = tmp_path / "src"
    src.mkdir()
    (src / "tell.py").write_text(
        "import sys, torch\n"
        "probe = any(m.startswith('diag.probe') for m in sys.modules)\n"
        "w = torch.ones(2, requires_grad=True)\n"
        "(w.sum() * (2.0 if probe else 1.0)).backward()\n"
        "print('under diag' if probe else 'bare')\n"
        "torch.save({'w': w.detach() + (1 if probe else 0), 'who': 'diag.probe' if probe else ''}, 'ck.pt')\n"
        "sys.exit(3 if probe else 0)\n")
    case = dnh.Case("tell.py")
    old = dnh.SCRIPTS
    dnh.SCRIPTS = src
    try:
        diffs = dnh.run_case(case, tmp_path / "run")
    finally:
        dnh.SCRIPTS = old
    text = "\n".join(diffs)
    assert "exit code 0 bare, 3 under diag" in text
    assert "the script's output differs" in text
    assert "names diag's probe" in text
    assert "holds other tensors" in text
    assert "losses differ" in text


def test_the_harness_masks_timings_not_values():
    assert dnh.mask("epoch 1 took 3.25 s, 120.5 it/s, loss 0.125") == dnh.mask("epoch 1 took 9.1 s, 3 it/s, loss 0.125")
    assert dnh.mask("loss 0.125") != dnh.mask("loss 0.126")
    assert dnh.mask("{'train_runtime': 1.5, 'train_loss': 2.0}") == dnh.mask("{'train_runtime': 7.25, 'train_loss': 2.0}")


def test_the_script_sees_argv_path_and_file_as_python_gives_them(tmp_path):
    """`python s.py`: argv[0] as typed, __file__ absolute, sys.path without diag's source tree, no
    PYTHONPATH/PYTHONSAFEPATH of diag's, __main__'s names (``__builtins__`` the module, a
    SourceFileLoader, ``__annotations__``); the same under `diag check --script s.py`."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "s.py").write_text(
        "import json, os, sys\n"
        "try:\n"
        "    profile\n"
        "except NameError:\n"
        "    __builtins__.profile = lambda f: f   # line_profiler's idiom: __builtins__ is a module in __main__\n"
        "main = {k: type(v).__name__ for k, v in vars(sys.modules['__main__']).items() if k.startswith('__')}\n"
        "print('STATE ' + json.dumps({'argv': sys.argv, 'file': __file__, 'path': sys.path,\n"
        "      'pp': os.environ.get('PYTHONPATH'), 'safe': os.environ.get('PYTHONSAFEPATH'), 'main': main,\n"
        "      'loader': [__loader__.name, __loader__.path]}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIAG_", "PYTHONPATH", "PYTHONSAFEPATH"))}
    bare = subprocess.run([sys.executable, "s.py", "--x", "1"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    subprocess.run([sys.executable, "-m", "diag", "check", "--script", "s.py", "--run-dir", str(tmp_path / "rd"),
                    "--", "--x", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    log = (tmp_path / "rd" / "log.txt").read_text()

    def state(text):
        return json.loads(next(ln for ln in text.splitlines() if ln.startswith("STATE "))[6:])

    assert state(log) == state(bare.stdout)


def test_lines_of_the_two_streams_are_never_merged_in_the_log(tmp_path):
    """print() writes its text and its newline apart; diag reads stdout and stderr through two pipes. A
    stderr line read between the two landed mid-line in log.txt (a corpus script's generated text ran
    into its CORPUS_TRUTH line). Every line is whole, in each stream's order."""
    import subprocess
    import sys

    (tmp_path / "mix.py").write_text(
        "import sys\n"
        "for i in range(400):\n"
        "    print(f'out {i} ' + 'x' * 60)\n"
        "    print(f'err {i}', file=sys.stderr)\n")
    subprocess.run([sys.executable, "-m", "diag", "check", "--script", "mix.py", "--run-dir", str(tmp_path / "rd")],
                   cwd=tmp_path, capture_output=True, text=True, timeout=240)
    lines = (tmp_path / "rd" / "log.txt").read_text().splitlines()
    out = [ln for ln in lines if ln.startswith("out ")]
    err = [ln for ln in lines if ln.startswith("err ")]
    assert len(lines) == 800 and out == [f"out {i} " + "x" * 60 for i in range(400)]
    assert err == [f"err {i}" for i in range(400)]


def test_only_torchs_teardown_abort_of_a_torchrun_launch_runs_again(tmp_path):
    """A side runs again only when torch's gloo teardown abort took a torchrun launch: never for a
    script that fails, nor for a single process, nor for a launch that exited 0."""
    ddp, single = dnh.Case("x.py", nproc=2), dnh.Case("x.py")
    abort = f"CORPUS_TRUTH {{}}\n{dnh.TEARDOWN_ABORT}\n"

    def side(code, out):
        return dnh.Side(code, out, {}, {}, tmp_path)

    assert dnh.torn_down(ddp, side(1, abort))
    assert not dnh.torn_down(ddp, side(0, abort))
    assert not dnh.torn_down(ddp, side(1, "Traceback ...\nValueError: bad\n"))
    assert not dnh.torn_down(single, side(-6, abort))
