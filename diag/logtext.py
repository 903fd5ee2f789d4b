"""The script's output as a terminal shows it (used by the runner's listeners and the TUI's log replay)."""
from __future__ import annotations


def shown_line(line: str) -> str:
    """What a terminal shows of a line redrawn with carriage returns (a progress bar): the text
    after the last one (a trailing \\r, as in \\r\\n, ends the line and hides nothing)."""
    body = line.rstrip("\r")
    i = body.rfind("\r")
    return body[i + 1:] if i >= 0 else body
