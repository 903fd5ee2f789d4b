"""Headless Chromium for the HTML report: open a report, read what it rendered, take a screenshot.

Used by the browser test (tests/test_report_html.py) and scripts/screenshots.py; never by ``diag``
itself. The page reports its own state on ``<body>`` (see diag/report/html_assets/errors.js):
``data-rendered`` is ``ok`` once every chart is drawn, ``error`` after any script error, console
error or blocked script (the messages are listed in ``#diag-errors``); ``data-charts`` counts the
charts drawn; ``data-render-ms`` is ``performance.now()`` when the last one was drawn.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> str | None:
    """$DIAG_CHROMIUM, else the first Chromium/Chrome on PATH, else None."""
    env = os.environ.get("DIAG_CHROMIUM")
    if env:
        return env if Path(env).is_file() else shutil.which(env)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _args(binary: str, profile: str, window: tuple[int, int]) -> list[str]:
    args = [binary, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
            "--disable-extensions", "--disable-background-networking", "--disable-sync", "--mute-audio",
            "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}",
            "--enable-logging=stderr", "--v=0"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--no-sandbox")       # Chromium refuses to run as root with its sandbox
    return args


@dataclass
class Rendered:
    body: dict[str, str]                  # the attributes of <body> after the scripts ran
    errors: list[str]                     # the items of #diag-errors
    console_errors: list[str] = field(default_factory=list)  # "Uncaught ..." lines Chromium logged
    dom: str = ""

    @property
    def ok(self) -> bool:
        return self.body.get("data-rendered") == "ok" and not self.errors and not self.console_errors


class _DomReader(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.body: dict[str, str] | None = None
        self.errors: list[str] = []
        self._in_errors = 0
        self._li: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = {k: (v or "") for k, v in attrs}
        if tag == "body" and self.body is None:
            self.body = a
        elif tag == "ul" and a.get("id") == "diag-errors":
            self._in_errors = 1
        elif tag == "li" and self._in_errors:
            self._li = []

    def handle_endtag(self, tag):
        if tag == "li" and self._li is not None:
            self.errors.append("".join(self._li))
            self._li = None
        elif tag == "ul" and self._in_errors:
            self._in_errors = 0

    def handle_data(self, data):
        if self._li is not None:
            self._li.append(data)


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run Chromium in its own process group; on a timeout the whole group is killed (no helper
    process outlives the call)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        raise RuntimeError(f"chromium did not finish within {timeout:.0f} s") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # helpers left behind by a finished browser
        except OSError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _console_errors(stderr: str) -> list[str]:
    out = []
    for line in stderr.splitlines():
        if "CONSOLE" in line and re.search(r"Uncaught|Error|Refused|violat", line):
            out.append(line.strip())
    return out


def render(path: str | os.PathLike, binary: str | None = None, window: tuple[int, int] = (1280, 2400),
           timeout: float = 120) -> Rendered:
    """Open ``path`` headless, let its scripts run, and return the rendered DOM's status."""
    binary = binary or find_chromium()
    if not binary:
        raise FileNotFoundError("no Chromium found (install the Debian package chromium, or set DIAG_CHROMIUM)")
    url = Path(path).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="diag-chromium-") as profile:
        p = _run([*_args(binary, profile, window), "--dump-dom", url], timeout)
    if p.returncode != 0 or "<body" not in p.stdout:
        raise RuntimeError(f"chromium failed (exit {p.returncode}): {p.stderr.strip()[-800:]}")
    reader = _DomReader()
    reader.feed(p.stdout)
    return Rendered(body=reader.body or {}, errors=reader.errors, console_errors=_console_errors(p.stderr),
                    dom=p.stdout)


def screenshot(path: str | os.PathLike, out: str | os.PathLike, binary: str | None = None,
               window: tuple[int, int] = (1280, 2400), timeout: float = 120) -> Path:
    """A PNG of the page's top ``window`` pixels."""
    binary = binary or find_chromium()
    if not binary:
        raise FileNotFoundError("no Chromium found (install the Debian package chromium, or set DIAG_CHROMIUM)")
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    url = Path(path).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="diag-chromium-") as profile:
        p = _run([*_args(binary, profile, window), f"--screenshot={out}", url], timeout)
    if p.returncode != 0 or not out.is_file():
        raise RuntimeError(f"chromium failed to take a screenshot (exit {p.returncode}): {p.stderr.strip()[-800:]}")
    return out
