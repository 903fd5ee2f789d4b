"""Event sinks: where the probe's events go. ``FileSink`` appends one JSON line per event (what
``python -m diag.probe`` uses); ``diag.watch()`` passes a callback instead. Any callable taking one
event dict is a sink."""
from __future__ import annotations

import json
import threading
from typing import Any


class FileSink:
    """One JSON object per line, flushed per event: a crash or kill loses nothing already written."""

    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def __call__(self, event: dict) -> None:
        try:
            line = json.dumps(event, default=str, allow_nan=False)
        except ValueError:   # NaN or infinity somewhere: JSON has no spelling for them
            line = json.dumps(_scrub(event), default=str)
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()

    def close(self) -> None:
        try:
            self._f.close()
        except Exception:
            pass


def _scrub(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_scrub(v) for v in obj]
    return obj

