"""Strings that came from outside diag (evidence, the script's output or exception, the environment)
are made safe before they reach a terminal: one function for the console reports and the TUI.

- :func:`for_terminal`: control characters (ESC, BEL, C1 controls, CR, DEL, ...) are shown escaped
  (``\\x1b``), so an evidence file cannot move the cursor, recolour the screen, rename the window
  (OSC) or hide text. Newlines and tabs are kept only where the caller allows them (a traceback).
- :func:`strip_ansi`: for JSON output: the data stays, ANSI escape sequences (colour codes captured
  from a script's log) are removed.
"""
from __future__ import annotations

import re

# CSI ... final byte, OSC ... BEL/ST, other two-byte ESC sequences; 8-bit CSI/OSC too
_ANSI = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d).*?(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[PX^_].*?(?:\x1b\\|\x9c)"
    r"|\x1b[@-Z\\-_]"
    r"|\x1b[ -/]+[0-~]", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_NO_NL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match) -> str:
    c = m.group(0)
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def for_terminal(value, multiline: bool = False) -> str:
    """``value`` as text that is safe to print: control characters escaped. With ``multiline``,
    newlines and tabs are kept (tracebacks, logs); otherwise they are escaped too."""
    if value is None:
        return ""
    s = value if isinstance(value, str) else str(value)
    if multiline:
        return _CONTROL.sub(_escape, s.replace("\r\n", "\n"))
    return _CONTROL_NO_NL.sub(_escape, s)


def strip_ansi(value):
    """Remove ANSI escape sequences from strings, recursively through dicts and lists (JSON output)."""
    if isinstance(value, str):
        return _ANSI.sub("", value) if ("\x1b" in value or "\x9b" in value or "\x9d" in value) else value
    if isinstance(value, dict):
        return {k: strip_ansi(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_ansi(v) for v in value]
    return value


def safe_evidence_strings(obj, multiline_keys=("traceback", "text", "message", "log")):
    """A copy of a JSON-like structure with every string made safe for a terminal (used where a
    renderer prints many evidence fields)."""
    if isinstance(obj, str):
        return for_terminal(obj)
    if isinstance(obj, dict):
        return {k: (for_terminal(v, multiline=True) if isinstance(v, str) and k in multiline_keys
                    else safe_evidence_strings(v, multiline_keys)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [safe_evidence_strings(v, multiline_keys) for v in obj]
    return obj


def safe_finding(f):
    """A copy of a Finding with every string made safe for a terminal (its message may quote an
    exception, a file name or a host name taken from evidence). Tracebacks and snippets keep their
    newlines."""
    import copy

    g = copy.copy(f)
    for name in ("id", "title", "message", "why", "fix", "docs", "check"):
        v = getattr(g, name, None)
        if isinstance(v, str):
            setattr(g, name, for_terminal(v))
    if isinstance(g.snippet, str):
        g.snippet = for_terminal(g.snippet, multiline=True)
    if g.location is not None:
        loc = copy.copy(g.location)
        loc.file = for_terminal(loc.file)
        if isinstance(loc.function, str):
            loc.function = for_terminal(loc.function)
        g.location = loc
    g.evidence = safe_evidence_strings(g.evidence or {})
    return g


def safe_json(obj):
    """For JSON output: ANSI codes stripped from every string (the data otherwise unchanged)."""
    return strip_ansi(obj)
