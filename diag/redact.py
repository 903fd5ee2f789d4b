"""Redaction of secret-looking script arguments, everywhere they are stored or shown.

``--api-key sk-...``, ``--token=...``, ``--password hunter2``, ``OPENAI_API_KEY=sk-...`` and bare values
that look like a well-known token (``sk-...``, ``ghp_...``, ``hf_...``, ``AKIA...``, ``xox.-...``) become
``***``. The argument names stay, so a reader still sees what was passed.
"""
from __future__ import annotations

import re

REDACTED = "***"

_SECRET_NAME = re.compile(
    r"(pass(word|wd|phrase)?|pwd|secret|token|api[-_]?key|apikey|access[-_]?key|private[-_]?key|"
    r"auth|credential|cred|session[-_]?key|signature|cookie|bearer|client[-_]?secret|dsn|webhook)",
    re.IGNORECASE)
# names that contain a secret-looking word but are not secrets
_HARMLESS = re.compile(r"(max|num|n)[-_]?tokens?$|tokens?[-_](per|count|len|length|limit)|tokenizer|"
                       r"author", re.IGNORECASE)
_TOKEN_VALUE = re.compile(
    r"^(sk-[A-Za-z0-9_-]{8,}|sk_(live|test)_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{16,}|github_pat_\w{16,}|"
    r"hf_[A-Za-z0-9]{16,}|AKIA[0-9A-Z]{12,}|xox[abprs]-[A-Za-z0-9-]{8,}|glpat-[A-Za-z0-9_-]{16,}|"
    r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+)$")
_URL_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^:/@\s]+:)([^@/\s]+)(@)", re.IGNORECASE)


def secret_name(name: str) -> bool:
    n = name.lstrip("-")
    return bool(_SECRET_NAME.search(n)) and not _HARMLESS.search(n)


def redact_value(value: str) -> str:
    if _TOKEN_VALUE.match(value):
        return REDACTED
    m = _URL_PASSWORD.match(value)
    if m:
        return _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), value, count=1)
    return value


def redact_args(args) -> list:
    """A copy of ``args`` (a list of strings) with secret values replaced by ``***``."""
    if not isinstance(args, (list, tuple)):
        return args
    out = []
    hide_next = False
    for a in args:
        if not isinstance(a, str):
            out.append(a)
            hide_next = False
            continue
        if hide_next and not (a.startswith("--") and len(a) > 2):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if a.startswith("-") and len(a) > 1:
            name, eq, value = a.partition("=")
            if secret_name(name):
                if eq:
                    out.append(f"{name}={REDACTED}")
                else:
                    out.append(a)
                    hide_next = True
                continue
            out.append(f"{name}={redact_value(value)}" if eq else a)
            continue
        name, eq, value = a.partition("=")
        if eq and name and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name) and secret_name(name):
            out.append(f"{name}={REDACTED}")
            continue
        out.append(redact_value(a))
    return out
