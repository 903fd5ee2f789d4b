"""The user's traceback under diag is the one a bare run prints (diag/probe/frames.py ``user_traceback``):
chained exceptions and exception groups kept, the probe's pass-through wrappers left out, diag's own
frames kept where the error is diag's. The end-to-end case (an error through the probe's DataLoader
wrapper, under ``diag check`` against the bare run) is the do-no-harm corpus's
``spine_crash_in_loader.py``."""
from __future__ import annotations

import builtins
import os
import sys
import traceback

import pytest

from diag.probe.frames import _DIAG_DIR, as_bare, user_traceback

SCRIPT = os.path.abspath(__file__)


def _diag_function(name: str, body: str):
    """A function whose code lives, for the traceback, in a file of diag's package (as the probe's
    wrappers do)."""
    ns: dict = {}
    exec(compile(f"def {name}(f, *a):\n    {body}\n", os.path.join(_DIAG_DIR, "probe", "wrapper_for_test.py"),
                 "exec"), ns)
    return ns[name]


def _raise_chained():
    try:
        {}["missing"]
    except KeyError as e:
        raise RuntimeError("no label") from e


def _catch(fn, *args) -> BaseException:
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 (the test inspects whatever was raised)
        return e
    raise AssertionError("nothing raised")


def test_chained_exceptions_print_as_python_prints_them():
    e = _catch(_raise_chained)
    assert user_traceback(e, SCRIPT) == "".join(traceback.format_exception(e))
    assert "KeyError: 'missing'" in user_traceback(e, SCRIPT)
    assert "direct cause" in user_traceback(e, SCRIPT)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups are Python 3.11's")
def test_exception_groups_print_as_python_prints_them():
    def group():
        raise builtins.ExceptionGroup("many", [ValueError("a"), TypeError("b")])
    g = _catch(group)
    assert user_traceback(g, SCRIPT) == "".join(traceback.format_exception(g))
    assert "TypeError: b" in user_traceback(g, SCRIPT)


def test_a_wrapper_of_diags_the_call_passed_through_is_left_out():
    passthru = _diag_function("wrapper", "return f(*a)")
    e = _catch(passthru, _raise_chained)
    text = user_traceback(e, SCRIPT)
    assert "wrapper_for_test.py" not in text
    # the user's frames and both exceptions stay
    assert "_raise_chained" in text and "KeyError: 'missing'" in text and "RuntimeError: no label" in text
    # and the traceback is the bare one but for that frame
    bare = _catch(_raise_chained)
    assert text.count('  File "') == "".join(traceback.format_exception(bare)).count('  File "')


def test_an_error_raised_in_diags_own_code_keeps_diags_frames():
    broken = _diag_function("broken", "return {}['diag bug']")
    e = _catch(broken, None)
    text = user_traceback(e, SCRIPT)
    assert "wrapper_for_test.py" in text and "KeyError: 'diag bug'" in text


def test_diags_frames_above_the_users_first_one_are_left_out():
    # the traceback starts where the exception was caught: here in a frame of diag's (as the probe's
    # launcher runs the script), above the user's frames
    runner = _diag_function("launcher", "try:\n        f()\n    except BaseException as e:\n        return e")
    e = runner(_raise_chained)
    assert traceback.extract_tb(e.__traceback__)[0].name == "launcher"
    text = user_traceback(e, SCRIPT)
    assert "launcher" not in text and "_raise_chained" in text and "KeyError: 'missing'" in text


def test_as_bare_gives_the_exception_and_its_cause_the_tracebacks_of_a_bare_run():
    """For the script's own sys.excepthook: the traceback objects themselves, diag's frames out."""
    passthru = _diag_function("wrapper", "return f(*a)")
    e = _catch(passthru, _raise_chained)
    as_bare(e, SCRIPT)
    for x in (e, e.__cause__):
        names = [f.name for f in traceback.extract_tb(x.__traceback__)]
        assert "wrapper" not in names
    assert [f.name for f in traceback.extract_tb(e.__traceback__)] == ["_catch", "_raise_chained"]
    assert "".join(traceback.format_exception(e)) == user_traceback(e, SCRIPT)
