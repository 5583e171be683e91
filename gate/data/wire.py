"""Frozen dataclasses <-> JSON-ready dicts, by their type hints (snapshots over the control socket).

`encode` turns a dataclass tree into dicts and lists; `decode(cls, data)` builds it
back, checking each value against the field's type: a field a newer gate added is
ignored, a field it dropped takes its default, and a wrong type raises WireError
rather than reaching a widget.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union


class WireError(ValueError):
    """Data that does not fit the type it should decode to."""


def encode(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [encode(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    return obj


def decode(cls: Any, data: Any) -> Any:
    return _decoder(cls)(data)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _decoder(tp: Any) -> Callable[[Any], Any]:  # noqa: C901 - one branch per kind of type, flat
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return lambda v: v
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        fields = [(f.name, _decoder(_hints(tp)[f.name]), _required(f)) for f in dataclasses.fields(tp) if f.init]

        def dataclass_(v: Any) -> Any:
            if not isinstance(v, dict):
                raise WireError(f"{tp.__name__}: expected an object, got {type(v).__name__}")
            kwargs = {}
            for name, dec, required in fields:
                if name in v:
                    kwargs[name] = dec(v[name])
                elif required:
                    raise WireError(f"{tp.__name__}: {name} is missing")
            return tp(**kwargs)

        return dataclass_
    if origin in (Union, types.UnionType):
        decs = [_decoder(a) for a in args if a is not type(None)]
        nullable = type(None) in args

        def union(v: Any) -> Any:
            if v is None:
                if nullable:
                    return None
                raise WireError("null where a value is needed")
            errors = []
            for dec in decs:
                try:
                    return dec(v)
                except WireError as exc:
                    errors.append(str(exc))
            raise WireError("; ".join(errors))

        return union
    if origin is tuple:
        item = _decoder(args[0]) if args else (lambda v: v)
        return lambda v: tuple(item(x) for x in _list(v))
    if origin is list:
        item = _decoder(args[0]) if args else (lambda v: v)
        return lambda v: [item(x) for x in _list(v)]
    if origin is dict or tp is dict:
        value = _decoder(args[1]) if args else (lambda v: v)
        return lambda v: {k: value(x) for k, x in _dict(v).items()}
    if origin is Literal:
        allowed = set(args)

        def literal(v: Any) -> Any:
            if v not in allowed:
                raise WireError(f"{v!r} is not one of {sorted(map(str, allowed))}")
            return v

        return literal
    if tp is float:
        return lambda v: float(_check(v, (int, float), "a number"))
    if tp is bool:
        return lambda v: _check(v, bool, "true or false")
    if tp in (int, str):
        return lambda v: _check(v, tp, tp.__name__)
    if isinstance(tp, type):  # e.g. a str subclass such as a Reason
        return lambda v: _check(v, (tp, *tp.__mro__[1:2]), tp.__name__)
    raise TypeError(f"wire: no decoder for {tp!r}")


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _check(v: Any, kinds: Any, what: str) -> Any:
    if isinstance(v, bool) and kinds is not bool and (kinds is int or (isinstance(kinds, tuple) and bool not in kinds)):
        raise WireError(f"expected {what}, got a boolean")
    if not isinstance(v, kinds):
        raise WireError(f"expected {what}, got {type(v).__name__}")
    return v


def _list(v: Any) -> list:
    if not isinstance(v, list):
        raise WireError(f"expected a list, got {type(v).__name__}")
    return v


def _dict(v: Any) -> dict:
    if not isinstance(v, dict):
        raise WireError(f"expected an object, got {type(v).__name__}")
    return v
