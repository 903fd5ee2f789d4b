"""The machinery under the typed Evidence: typed sections, the validating converter, field docs.

* :class:`Section` is a typed section written by a probe extension (``memory``, ``flops``, ...): a
  ``dict`` (so it round-trips through JSON unchanged and code written against the dict keeps working)
  whose keys are declared once, with types and docs, as annotated class attributes; each declared key
  also reads as an attribute (``r.flops.measured``), None or its default when absent.
* :func:`build` turns parsed JSON into the dataclasses and sections, checking every declared field's
  type and naming the JSON path of the first mismatch (:class:`SchemaError`).
* :func:`field_docs` reads a class's fields with their types, units and docs (the trailing comment
  of each field) for docs/evidence.md.

Pure Python; no torch.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import io
import math
import re
import tokenize
import types
import typing
from typing import Any

MAX_INT = 1 << 63   # integers beyond int64 are refused (they overflow every formatter)


class SchemaError(ValueError):
    """A value of the wrong type at a JSON path."""

    def __init__(self, path: str, expected: str, value: Any):
        self.path, self.expected, self.value = path, expected, value
        super().__init__(f"{path or 'the top level'} is {describe(value)}, expected {expected}")


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})" if abs(value) < 10 ** 15 else "an integer out of range"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        v = value if len(value) <= 20 else value[:17] + "..."
        return f"a string ({v!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# ---- typed sections --------------------------------------------------------------------------------

class Section(dict):
    """A typed, JSON-shaped section. Subclasses declare their keys as annotated class attributes
    (``status: str | None = None  # doc``); unknown keys (a newer probe, an extension) are kept."""

    __section_fields__: dict[str, Any] = {}
    __section_defaults__: dict[str, Any] = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        ann = {k: v for k, v in cls.__dict__.get("__annotations__", {}).items() if not k.startswith("_")}
        defaults = dict(getattr(cls, "__section_defaults__", {}))
        for name in ann:
            if name in cls.__dict__:
                defaults[name] = cls.__dict__[name]
                delattr(cls, name)   # so that attribute reads reach __getattr__ (the dict's value)
            else:
                defaults.setdefault(name, None)
        cls.__section_defaults__ = defaults
        cls.__section_fields__ = {**getattr(cls, "__section_fields__", {}), **ann}

    def __getattr__(self, name: str) -> Any:
        defaults = type(self).__section_defaults__
        if name in defaults:
            value = self.get(name)
            if value is None:
                d = defaults[name]
                return d() if callable(d) else d
            return value
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self).__section_defaults__:
            self[name] = value
        else:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __deepcopy__(self, memo):
        import copy
        return type(self)((k, copy.deepcopy(v, memo)) for k, v in self.items())

    @classmethod
    def hints(cls) -> dict[str, Any]:
        return resolve_hints(cls)


def section_factory(cls: type[Section]):
    return dataclasses.field(default_factory=cls)


# ---- type hints ------------------------------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}


def resolve_hints(cls: type) -> dict[str, Any]:
    h = _HINTS.get(cls)
    if h is None:
        if isinstance(cls, type) and issubclass(cls, Section):
            mod = inspect.getmodule(cls)
            ns = dict(vars(mod)) if mod else {}
            h = {}
            for klass in reversed(cls.__mro__):
                for name, tp in klass.__dict__.get("__annotations__", {}).items():
                    if name.startswith("_") or name not in cls.__section_fields__:
                        continue
                    kmod = inspect.getmodule(klass)
                    h[name] = eval(tp, dict(vars(kmod)) if kmod else ns) if isinstance(tp, str) else tp
        else:
            h = typing.get_type_hints(cls)
        _HINTS[cls] = h
    return h


def type_name(tp: Any) -> str:
    """The type in words, for messages and docs: "an integer", "a list of StepRecord", ..."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = tuple(a for a in typing.get_args(tp) if a is not type(None))
        return " or ".join(type_name(a) for a in args) + (" or null" if len(args) < len(typing.get_args(tp)) else "")
    if tp is Any:
        return "any JSON value"
    if origin is list or tp is list:
        args = typing.get_args(tp)
        return f"a list of {_plural(args[0])}" if args and args[0] is not Any else "a list"
    if origin is dict or tp is dict:
        args = typing.get_args(tp)
        return f"an object of {_plural(args[1])}" if args and args[1] is not Any else "an object"
    if tp is bool:
        return "a boolean"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or issubclass(tp, Section)):
        return f"an object ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _plural(tp: Any) -> str:
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or issubclass(tp, Section)):
        return tp.__name__
    return {int: "integers", float: "numbers", str: "strings", bool: "booleans"}.get(tp, type_name(tp))


# ---- converting parsed JSON ------------------------------------------------------------------------

def build(tp: Any, value: Any, path: str) -> Any:
    """``value`` (parsed JSON) as type ``tp``: dataclasses and sections built, every declared field
    type-checked. Raises :class:`SchemaError` naming the JSON path of the first mismatch.

    Runs a converter compiled once per type (:func:`_converter`: no JSON path kept, no type hint
    looked up per value); only when it meets a mismatch is the value walked again, path by path, for
    the error's words. ``diag check`` folds every step event through this while the job runs."""
    try:
        return _converter(tp)(value)
    except _Mismatch:
        return _build(tp, value, path)


def _build(tp: Any, value: Any, path: str) -> Any:
    """:func:`build`, walked with the JSON path (what an error names). The compiled converters
    accept and return exactly what this does."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise SchemaError(path, type_name(tp), value)
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _build(a, value, path)
            except SchemaError as e:
                errors.append(e)
        # the most specific error: one that went deeper than this path
        deeper = [e for e in errors if e.path != path]
        if deeper:
            raise deeper[0]
        if len(errors) == 1:
            raise errors[0]
        raise SchemaError(path, type_name(tp), value)
    if tp is Any or tp is object:
        return value
    if value is None:
        # a scalar left unset (older writers): kept as null; containers and objects must be present
        if tp in (int, float, str, bool):
            return None
        raise SchemaError(path, type_name(tp), value)
    if isinstance(tp, type) and issubclass(tp, Section):
        if not isinstance(value, dict):
            raise SchemaError(path, type_name(tp), value)
        hints = resolve_hints(tp)
        out = tp()
        for k, v in value.items():
            if k in hints:
                out[k] = _build(hints[k], v, f"{path}.{k}")
            else:
                out[k] = v
        return out
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SchemaError(path, type_name(tp), value)
        hints = resolve_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                v = value[f.name]
                if v is None and _is_section(hints[f.name]):
                    continue   # a section left null: empty
                kwargs[f.name] = _build(hints[f.name], v, f"{path}.{f.name}" if path else f.name)
        # unknown keys (written by a newer minor version) are ignored on purpose
        return tp(**kwargs)
    if origin is list or tp is list:
        if not isinstance(value, list):
            raise SchemaError(path, type_name(tp), value)
        args = typing.get_args(tp)
        if not args or args[0] is Any:
            return list(value)
        return [_build(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise SchemaError(path, type_name(tp), value)
        args = typing.get_args(tp)
        if not args or args[1] is Any:
            return dict(value)
        return {k: _build(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise SchemaError(path, type_name(tp), value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and abs(value) < MAX_INT:
                return int(value)
            raise SchemaError(path, type_name(tp), value)
        if abs(value) >= MAX_INT:
            raise SchemaError(path, "an integer within ±2^63", value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(path, type_name(tp), value)
        if isinstance(value, int):
            try:
                float(value)
            except OverflowError:
                raise SchemaError(path, "a finite number", value) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise SchemaError(path, "a finite number", value)
        return value
    if tp is str:
        if not isinstance(value, str):
            raise SchemaError(path, type_name(tp), value)
        return value
    return value


# ---- compiled converters ---------------------------------------------------------------------------

class _Mismatch(Exception):
    """A compiled converter met a value of the wrong type (:func:`build` then walks it for the words)."""


_CONVERTERS: dict[Any, Any] = {}


def _converter(tp: Any):
    """A function turning parsed JSON into ``tp`` exactly as :func:`_build` does, raising
    :class:`_Mismatch` where that raises :class:`SchemaError`. Built once per type; the fields of a
    dataclass or section are compiled at its first use (a type may name itself)."""
    try:
        return _CONVERTERS[tp]
    except KeyError:
        pass
    except TypeError:       # an unhashable annotation: the slow walk, every time
        return functools.partial(_slow, tp)
    conv = _compile(tp)
    _CONVERTERS[tp] = conv
    return conv


def _slow(tp: Any, v: Any) -> Any:
    try:
        return _build(tp, v, "")
    except SchemaError:
        raise _Mismatch from None


def _compile(tp: Any):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        nullable = type(None) in args
        members = [a for a in args if a is not type(None)]

        def union(v: Any) -> Any:
            if v is None:
                if nullable:
                    return None
                raise _Mismatch
            for a in members:
                try:
                    return _converter(a)(v)
                except _Mismatch:
                    pass
            raise _Mismatch
        return union
    if tp is Any or tp is object:
        return lambda v: v
    if isinstance(tp, type) and issubclass(tp, Section):
        hints: dict[str, Any] | None = None

        def section(v: Any) -> Any:
            nonlocal hints
            if not isinstance(v, dict):
                raise _Mismatch
            if hints is None:
                hints = {k: _converter(h) for k, h in resolve_hints(tp).items()}
            out = tp()
            for k, x in v.items():
                c = hints.get(k)
                out[k] = c(x) if c is not None else x
            return out
        return section
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        fields: list | None = None

        def dataclass(v: Any) -> Any:
            nonlocal fields
            if not isinstance(v, dict):
                raise _Mismatch
            if fields is None:
                h = resolve_hints(tp)
                fields = [(f.name, _converter(h[f.name]), _is_section(h[f.name])) for f in dataclasses.fields(tp)]
            kwargs = {}
            for name, c, sec in fields:
                if name in v:
                    x = v[name]
                    if x is None and sec:
                        continue
                    kwargs[name] = c(x)
            return tp(**kwargs)
        return dataclass
    if origin is list or tp is list:
        args = typing.get_args(tp)
        item = args[0] if args and args[0] is not Any else None

        def a_list(v: Any) -> Any:
            if not isinstance(v, list):
                raise _Mismatch
            if item is None:
                return list(v)
            c = _converter(item)
            return [c(x) for x in v]
        return a_list
    if origin is dict or tp is dict:
        args = typing.get_args(tp)
        value_tp = args[1] if args and args[1] is not Any else None

        def a_dict(v: Any) -> Any:
            if not isinstance(v, dict):
                raise _Mismatch
            if value_tp is None:
                return dict(v)
            c = _converter(value_tp)
            return {k: c(x) for k, x in v.items()}
        return a_dict
    if tp is bool:
        def boolean(v: Any) -> Any:
            if v is None or type(v) is bool:
                return v
            raise _Mismatch
        return boolean
    if tp is int:
        def integer(v: Any) -> Any:
            if type(v) is int and -MAX_INT < v < MAX_INT:
                return v
            return _slow(int, v)    # null, a whole float, an int subclass, a mismatch
        return integer
    if tp is float:
        def number(v: Any) -> Any:
            if type(v) is float and math.isfinite(v):
                return v
            return _slow(float, v)  # null, an integer, a mismatch
        return number
    if tp is str:
        def string(v: Any) -> Any:
            if v is None or isinstance(v, str):
                return v
            raise _Mismatch
        return string

    def other(v: Any) -> Any:     # a type _build passes through (it still refuses null)
        if v is None:
            raise _Mismatch
        return v
    return other


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Section)


# ---- field docs ------------------------------------------------------------------------------------

_UNIT_SUFFIXES = (("_s", "seconds"), ("_ms", "milliseconds"), ("_bytes", "bytes"), ("_flops", "FLOPs"))


def _comments(cls: type) -> dict[str, str]:
    """The trailing comment of each field in a class body (continuation comment lines appended)."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    current = None
    last_line = -1
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 4 and current != tok.string:
            line = src.splitlines()[tok.start[0] - 1]
            if re.match(rf"\s{{4}}{re.escape(tok.string)}\s*:", line):
                current, last_line = tok.string, tok.start[0]
                continue
        if tok.type == tokenize.COMMENT and current:
            text = tok.string.lstrip("#").strip()
            if tok.start[0] == last_line or (tok.start[0] == last_line + 1 and tok.start[1] > 8):
                out[current] = (out.get(current, "") + " " + text).strip()
                last_line = tok.start[0]
        elif tok.type == tokenize.NAME and tok.start[1] == 4:
            current = None
        if tok.type == tokenize.NAME and tok.string in ("def", "class") and tok.start[1] == 4:
            break
    return out


def unit_of(name: str, doc: str) -> str:
    m = re.search(r"\[([^\]]+)\]", doc)
    if m:
        return m.group(1)
    if name == "t" or name.endswith("_at"):
        return "seconds" if name == "t" else "unix time (s)"
    for suffix, unit in _UNIT_SUFFIXES:
        if name.endswith(suffix):
            return unit
    if name.endswith("bytes") or name in ("total_memory",):
        return "bytes"
    return ""


def field_docs(cls: type) -> list[tuple[str, str, str, str]]:
    """(name, type in words, unit, doc) for every field of a dataclass or Section."""
    hints = resolve_hints(cls)
    comments = _comments(cls)
    names = ([f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls)
             else list(typing.cast("type[Section]", cls).__section_fields__))
    rows = []
    for name in names:
        doc = comments.get(name, "")
        rows.append((name, type_name(hints[name]), unit_of(name, doc), re.sub(r"\s*\[[^\]]+\]", "", doc)))
    return rows


def median(values) -> float:
    """The median of the values (0.0 for none)."""
    v = sorted(values)
    n = len(v)
    if n == 0:
        return 0.0
    mid = n // 2
    return v[mid] if n % 2 else (v[mid - 1] + v[mid]) / 2
