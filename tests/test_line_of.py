"""frames.line_of: a frame's line by its instruction, cached. CPython walks a code object's line table
from its start on every f_lineno read, so a training loop at the end of a long script paid tens of
µs a step in the probe's call-site check (docs/performance.md, fourteenth pass)."""
from __future__ import annotations

import sys
import time

from diag.probe import frames
from diag.probe.frames import line_of


def test_line_of_is_f_lineno_for_every_call_site():
    seen: list = []
    ns: dict = {"seen": seen, "line_of": line_of, "sys": sys}
    src = "".join(f"w{i} = {i}\nseen.append((line_of(sys._getframe()), sys._getframe().f_lineno))\n"
                  for i in range(300))
    exec(compile(src, "<many>", "exec"), ns)
    assert [a for a, _ in seen] == [b for _, b in seen] == list(range(2, 601, 2))


def test_an_entry_of_another_code_object_at_the_same_key_is_not_used():
    def suspended():
        yield 1

    g = suspended()
    next(g)
    f = g.gi_frame                         # a frame that stays at one instruction
    key = (id(f.f_code), f.f_lasti)
    other = compile("pass", "<other>", "exec")
    frames._LINES[key] = (other, -7)      # what a gone code object whose id was reused would leave
    try:
        assert line_of(f) == f.f_lineno
        assert frames._LINES[key][0] is f.f_code
    finally:
        frames._LINES.pop(key, None)


def test_line_of_is_cheap_where_f_lineno_walks_a_long_line_table():
    src = "".join(f"c{i} = {{'k': {i}, 'v': {i} * 3}}\n" for i in range(2000)) + "res = probe(sys._getframe())\n"

    def probe(f):
        line_of(f)                       # the first read fills the cache
        t0 = time.perf_counter_ns()
        for _ in range(200):
            f.f_lineno
        t1 = time.perf_counter_ns()
        for _ in range(200):
            line_of(f)
        t2 = time.perf_counter_ns()
        return t1 - t0, t2 - t1, line_of(f), f.f_lineno

    ns: dict = {"probe": probe, "sys": sys}
    exec(compile(src, "<long>", "exec"), ns)
    walked, cached, line, truth = ns["res"]
    assert line == truth == 2001
    assert cached * 5 < walked, (cached, walked)   # measured in one run: ~100x apart on a 2-core VM
