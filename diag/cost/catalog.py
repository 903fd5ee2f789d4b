"""The GPU catalogue: dense peak TFLOPS per precision, memory, bandwidth and an indicative price.

Pure Python (no torch). The built-in data is ``diag/cost/gpus.toml`` (every figure with its source,
every price with ``as_of`` and ``source``). A user file in the same format overrides or adds entries:

1. the ``path`` argument (``diag cost --catalog PATH``), else
2. ``$DIAG_GPU_CATALOG``, else
3. ``$XDG_CONFIG_HOME/diag/gpus.toml`` (``~/.config/diag/gpus.toml``), when it exists.

A table in the user file replaces the built-in fields it names; ``tflops`` keys merge one by one;
a ``price`` table replaces the built-in price as a whole. A broken file is a :class:`CatalogError`
(a :class:`diag.errors.DiagError`) that names the file and the line.

API (used by ``diag cost``, the probe's MFU and the TUI's Cost tab)::

    cat = load_catalog()                 # built-in + user overrides
    gpu = cat.get("a100")                # by id, name or alias; CatalogError lists close matches
    gpu.peak_flops("bf16")               # 3.12e14 FLOP/s per card (None when not supported)
    cat.match_device("NVIDIA A100-SXM4-80GB")   # the entry for a torch device name, or None
"""
from __future__ import annotations

import difflib
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.errors import DiagError

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
BUILTIN_PATH = Path(__file__).with_name("gpus.toml")
ENV_VAR = "DIAG_GPU_CATALOG"

_GPU_FIELDS = {"name", "aliases", "match", "memory_gb", "bandwidth_tbs", "devices_per_card", "source",
               "notes", "tflops", "price"}
_PRICE_FIELDS = {"usd_per_hour", "as_of", "source", "range"}


class CatalogError(DiagError):
    """A GPU catalogue that cannot be used: unknown GPU, broken file."""


def _toml():
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:
        import tomli  # type: ignore[import-not-found]

        return tomli
    except ImportError:
        raise CatalogError("reading the GPU catalogue needs Python 3.11+ (tomllib) or the 'tomli' package "
                           "on Python 3.10: pip install tomli") from None


def user_catalog_path() -> Path:
    """Where a user's catalogue is looked for when no path is given (it need not exist)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "diag" / "gpus.toml"


@dataclass
class Price:
    usd_per_hour: float
    as_of: str
    source: str
    range: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"usd_per_hour": self.usd_per_hour, "as_of": self.as_of, "source": self.source,
                "range": list(self.range) if self.range else None}


@dataclass
class Gpu:
    id: str
    name: str
    tflops: dict[str, float] = field(default_factory=dict)   # dense, per card
    memory_gb: float | None = None
    bandwidth_tbs: float | None = None
    devices_per_card: int = 1
    price: Price | None = None
    aliases: list[str] = field(default_factory=list)
    match: list[str] = field(default_factory=list)
    source: str | None = None
    notes: str | None = None
    origin: str = "builtin"           # "builtin" or the user file that defined or changed it

    def peak_tflops(self, precision: str, per: str = "card") -> float | None:
        """Dense peak TFLOPS for ``precision`` (fp32, tf32, bf16, fp16, fp8); None when the GPU has
        no such rate (or it is not published). ``per="device"`` divides by ``devices_per_card``."""
        precision = normalize_precision(precision)
        v = self.tflops.get(precision)
        if v is None:
            return None
        return v / self.devices_per_card if per == "device" else v

    def peak_flops(self, precision: str, per: str = "card") -> float | None:
        v = self.peak_tflops(precision, per)
        return None if v is None else v * 1e12

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "tflops": dict(self.tflops), "memory_gb": self.memory_gb,
            "bandwidth_tbs": self.bandwidth_tbs, "devices_per_card": self.devices_per_card,
            "price": self.price.to_dict() if self.price else None, "aliases": list(self.aliases),
            "match": list(self.match), "source": self.source, "notes": self.notes, "origin": self.origin,
        }


_PRECISION_ALIASES = {
    "float32": "fp32", "fp32": "fp32", "f32": "fp32", "32": "fp32",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "fp16": "fp16", "half": "fp16", "f16": "fp16",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8",
}


def normalize_precision(p: str) -> str:
    key = str(p).lower().replace("torch.", "").replace("-", "").replace("_", "")
    key = {"float8e4m3fn": "fp8", "float8e5m2": "fp8"}.get(key, key)
    out = _PRECISION_ALIASES.get(key)
    if out is None:
        raise CatalogError(f"unknown precision {p!r} (one of: {', '.join(PRECISIONS)})")
    return out


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


class Catalog:
    def __init__(self, gpus: dict[str, Gpu], sources: list[str] | None = None):
        self.gpus = gpus
        self.sources = list(sources or [])   # files read, built-in first

    def __iter__(self):
        return iter(self.gpus.values())

    def __len__(self) -> int:
        return len(self.gpus)

    def _index(self) -> dict[str, str]:
        idx: dict[str, str] = {}
        # ids first, then names, then aliases: an id always wins
        for g in self.gpus.values():
            idx.setdefault(_norm(g.id), g.id)
        for g in self.gpus.values():
            idx.setdefault(_norm(g.name), g.id)
        for g in self.gpus.values():
            for a in g.aliases:
                idx.setdefault(_norm(a), g.id)
        return idx

    def find(self, name: str) -> Gpu | None:
        gid = self._index().get(_norm(name))
        return self.gpus.get(gid) if gid else None

    def get(self, name: str) -> Gpu:
        """The entry for an id, name or alias; unknown names raise a CatalogError with close matches."""
        g = self.find(name)
        if g is not None:
            return g
        close = self.suggest(name)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise CatalogError(f"unknown GPU {name!r}{hint} (run 'diag cost --list-gpus' for the catalogue, "
                           "or add it to your catalogue file)")

    def suggest(self, name: str, n: int = 3) -> list[str]:
        idx = self._index()
        key = _norm(name)
        out: list[str] = []
        if key:
            for k, gid in idx.items():
                if (key in k or k in key) and gid not in out and len(k) >= 2:
                    out.append(gid)
        for k in difflib.get_close_matches(key, list(idx), n=n * 2, cutoff=0.5):
            if idx[k] not in out:
                out.append(idx[k])
        return out[:n]

    def match_device(self, device_name: str | None) -> Gpu | None:
        """The entry whose ``match`` string (longest first, as a whole word) occurs in a torch device name."""
        if not device_name:
            return None
        low = device_name.lower()
        best: tuple[int, Gpu] | None = None
        for g in self.gpus.values():
            for m in g.match:
                if m and (best is None or len(m) > best[0]) and re.search(
                        r"(?<![a-z0-9])" + re.escape(m.lower()) + r"(?![a-z0-9])", low):
                    best = (len(m), g)
        return best[1] if best else None

    def to_dict(self) -> dict[str, Any]:
        return {"sources": self.sources, "gpus": [g.to_dict() for g in self.gpus.values()]}


# ---- loading --------------------------------------------------------------------------------------

_BUILTIN_CACHE: dict[str, Any] | None = None


def _read(path: Path, what: str) -> tuple[dict, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CatalogError(f"{what} {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise CatalogError(f"{what} {str(path)!r} is a directory, not a TOML file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogError(f"cannot read {what} {str(path)!r}: {e}") from None
    toml = _toml()
    try:
        return toml.loads(text), text
    except toml.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        where = f"line {m.group(1)}, column {m.group(2)}" if m else "somewhere"
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg) or "syntax error"
        line_text = ""
        if m:
            lines = text.splitlines()
            ln = int(m.group(1))
            if 0 < ln <= len(lines):
                line_text = f": {lines[ln - 1].strip()[:80]!r}"
        raise CatalogError(f"{what} {str(path)!r} is not valid TOML at {where}{line_text} ({reason})") from None


def _line_of(text: str, table: str, key: str | None = None) -> int | None:
    """Best-effort line number (1-based) of ``key`` inside ``[table]`` (or of the table header)."""
    lines = text.splitlines()
    header = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(re.escape(p) for p in table.split(".")) + r"\s*\]\s*(#.*)?$")
    any_header = re.compile(r"^\s*\[")
    start = None
    for i, ln in enumerate(lines):
        if header.match(ln):
            start = i
            break
    if start is None:
        # dotted keys or inline tables: look for the last part of the table name followed by '='
        last = table.split(".")[-1]
        pat = re.compile(r"^\s*" + re.escape(key or last) + r"\s*=")
        for i, ln in enumerate(lines):
            if pat.match(ln):
                return i + 1
        return None
    if key is None:
        return start + 1
    pat = re.compile(r"^\s*[\"']?" + re.escape(key) + r"[\"']?\s*=")
    for i in range(start + 1, len(lines)):
        if any_header.match(lines[i]):
            break
        if pat.match(lines[i]):
            return i + 1
    return start + 1


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _parse(data: dict, text: str, path: str, builtin: bool) -> dict[str, dict]:
    """Validate one file's tables; returns {gpu_id: raw table}."""
    what = "the built-in GPU catalogue" if builtin else "GPU catalogue"

    def fail(msg: str, table: str, key: str | None = None) -> CatalogError:
        line = _line_of(text, table, key)
        at = f" line {line}" if line else ""
        return CatalogError(f"{what} {path!r}{at}: {msg}")

    unknown_top = [k for k in data if k not in ("schema", "gpu")]
    if unknown_top:
        k = unknown_top[0]
        line = _line_of(text, k, None)
        raise CatalogError(f"{what} {path!r}" + (f" line {line}" if line else "")
                           + f": unknown top-level key {k!r} (expected [gpu.<id>] tables)")
    schema = data.get("schema", 1)
    if not isinstance(schema, int) or schema > 1:
        raise CatalogError(f"{what} {path!r} uses schema {schema!r}, newer than this diag understands (1)")
    gpus = data.get("gpu", {})
    if not isinstance(gpus, dict):
        raise fail("'gpu' must be a table of [gpu.<id>] tables", "gpu")
    out: dict[str, dict] = {}
    for gid, t in gpus.items():
        tname = f"gpu.{gid}"
        if not isinstance(t, dict):
            raise fail(f"[gpu.{gid}] must be a table", tname)
        for k in t:
            if k not in _GPU_FIELDS:
                close = difflib.get_close_matches(k, sorted(_GPU_FIELDS), n=1)
                raise fail(f"unknown field {k!r} in [gpu.{gid}]"
                           + (f" (did you mean {close[0]!r}?)" if close else ""), tname, k)
        for k in ("name", "source", "notes"):
            if k in t and not isinstance(t[k], str):
                raise fail(f"{k} of {gid!r} must be a string", tname, k)
        for k in ("aliases", "match"):
            if k in t and not (isinstance(t[k], list) and all(isinstance(x, str) for x in t[k])):
                raise fail(f"{k} of {gid!r} must be a list of strings", tname, k)
        for k in ("memory_gb", "bandwidth_tbs"):
            if k in t and not _num(t[k]):
                raise fail(f"{k} of {gid!r} must be a positive number, got {t[k]!r}", tname, k)
        if "devices_per_card" in t and not (isinstance(t["devices_per_card"], int)
                                            and not isinstance(t["devices_per_card"], bool)
                                            and t["devices_per_card"] >= 1):
            raise fail(f"devices_per_card of {gid!r} must be a whole number >= 1", tname, "devices_per_card")
        tf = t.get("tflops", {})
        if not isinstance(tf, dict):
            raise fail(f"tflops of {gid!r} must be a table of precision = TFLOPS", tname, "tflops")
        for p, v in tf.items():
            if p not in PRECISIONS:
                raise fail(f"unknown precision {p!r} in [gpu.{gid}.tflops] (one of: {', '.join(PRECISIONS)})",
                           f"{tname}.tflops", p)
            if not _num(v):
                raise fail(f"tflops.{p} of {gid!r} must be a positive number (leave it out when the GPU has "
                           f"no such rate), got {v!r}", f"{tname}.tflops", p)
        if "price" in t:
            pr = t["price"]
            if not isinstance(pr, dict):
                raise fail(f"price of {gid!r} must be a table with usd_per_hour, as_of and source", tname, "price")
            for k in pr:
                if k not in _PRICE_FIELDS:
                    raise fail(f"unknown field {k!r} in [gpu.{gid}.price] (expected usd_per_hour, as_of, "
                               "source, range)", f"{tname}.price", k)
            if not _num(pr.get("usd_per_hour")):
                raise fail(f"price.usd_per_hour of {gid!r} must be a positive number, got "
                           f"{pr.get('usd_per_hour')!r}", f"{tname}.price", "usd_per_hour")
            for k in ("as_of", "source"):
                if k in pr and not isinstance(pr[k], (str,)) and not hasattr(pr[k], "isoformat"):
                    raise fail(f"price.{k} of {gid!r} must be a string", f"{tname}.price", k)
                if builtin and k not in pr:
                    raise fail(f"price of {gid!r} has no {k}", f"{tname}.price")
            if "range" in pr:
                r = pr["range"]
                if not (isinstance(r, list) and len(r) == 2 and all(_num(x) for x in r) and r[0] <= r[1]):
                    raise fail(f"price.range of {gid!r} must be [low, high]", f"{tname}.price", "range")
        out[str(gid)] = t
    return out


def _build(gid: str, t: dict, origin: str) -> Gpu:
    pr = t.get("price")
    price = None
    if pr:
        price = Price(usd_per_hour=float(pr["usd_per_hour"]), as_of=str(pr.get("as_of", "unknown")),
                      source=str(pr.get("source", origin)),
                      range=tuple(float(x) for x in pr["range"]) if pr.get("range") else None)  # type: ignore[arg-type]
    return Gpu(
        id=gid, name=t.get("name", gid), tflops={k: float(v) for k, v in (t.get("tflops") or {}).items()},
        memory_gb=t.get("memory_gb"), bandwidth_tbs=t.get("bandwidth_tbs"),
        devices_per_card=int(t.get("devices_per_card", 1)), price=price,
        aliases=list(t.get("aliases", [])), match=list(t.get("match", [])), source=t.get("source"),
        notes=t.get("notes"), origin=origin,
    )


def _merge(base: dict, over: dict, path: str, mtime_date: str) -> dict:
    out = dict(base)
    for k, v in over.items():
        if k == "tflops":
            tf = dict(base.get("tflops", {}))
            tf.update(v)
            out["tflops"] = tf
        elif k == "price":
            p = dict(v)
            p.setdefault("as_of", mtime_date)
            p.setdefault("source", f"your catalogue {path}")
            out["price"] = p
        else:
            out[k] = v
    return out


def _builtin_tables() -> dict[str, dict]:
    global _BUILTIN_CACHE
    if _BUILTIN_CACHE is None:
        data, text = _read(BUILTIN_PATH, "the built-in GPU catalogue")
        _BUILTIN_CACHE = _parse(data, text, str(BUILTIN_PATH), builtin=True)
    return _BUILTIN_CACHE


def load_catalog(path: str | os.PathLike | None = None, *, user: bool = True) -> Catalog:
    """The built-in catalogue plus, when ``user`` is true, the user's file (``path``, else
    ``$DIAG_GPU_CATALOG``, else ``~/.config/diag/gpus.toml`` when it exists).

    An explicit ``path`` (or ``$DIAG_GPU_CATALOG``) that does not exist is an error; the default
    location is optional. Every problem is a :class:`CatalogError` naming the file and line.
    """
    tables = {gid: dict(t) for gid, t in _builtin_tables().items()}
    origins = {gid: "builtin" for gid in tables}
    sources = [str(BUILTIN_PATH)]
    upath: Path | None = None
    if path is not None:
        upath = Path(path).expanduser()
    elif user:
        cand = user_catalog_path()
        if os.environ.get(ENV_VAR) or cand.is_file():
            upath = cand
    if upath is not None:
        data, text = _read(upath, "GPU catalogue")
        over = _parse(data, text, str(upath), builtin=False)
        try:
            import datetime

            mtime_date = datetime.date.fromtimestamp(upath.stat().st_mtime).isoformat()
        except OSError:
            mtime_date = "unknown"
        for gid, t in over.items():
            # an override may name a built-in GPU by id or by alias
            key = gid
            if key not in tables:
                probe = Catalog({k: _build(k, v, origins[k]) for k, v in tables.items()}).find(gid)
                if probe is not None:
                    key = probe.id
            tables[key] = _merge(tables.get(key, {}), t, str(upath), mtime_date)
            origins[key] = str(upath)
        sources.append(str(upath))
    gpus = {gid: _build(gid, t, origins[gid]) for gid, t in tables.items()}
    return Catalog(gpus, sources)
