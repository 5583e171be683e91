"""tokengate configuration: TOML -> frozen, validated dataclasses.

Every key is optional; a missing file section gets the defaults below. Validation is strict:
unknown keys, wrong types and out-of-range values are refused with a :class:`ConfigError` that
names the source, the dotted key path and the problem, e.g.::

    tokengate.toml: classes.batch.queue_depth: must be a positive integer, got -3

Two layers do the work. ``config_from_dict`` turns the TOML document into dataclasses, checking
structure and types only; ``validate_config`` then checks every value and every cross-field rule
on the dataclasses themselves, so code that builds a changed ``Config`` (a retune, a reload) can
run the same checks and get the same messages.

This module is pure: it reads no environment variables and opens no sockets. Whether the
``api_key_env`` variables exist is checked by whoever starts the gate, not here, so that
``tokengate config check`` gives the same answer on any machine.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import tomllib
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

__all__ = [
    "BackendConfig",
    "BudgetConfig",
    "ClassConfig",
    "Config",
    "ConfigError",
    "DEFAULT_CLASSES",
    "EXAMPLE_CONFIG",
    "GateConfig",
    "KvMode",
    "BudgetMode",
    "TenantConfig",
    "config_from_dict",
    "load_config",
    "parse_config",
    "validate_config",
]

KvMode = Literal["unified", "split"]
BudgetMode = Literal["adaptive", "static"]

CLASS_NAME_RE = re.compile(r"[a-z0-9_-]+")
# Backend and tenant names show up in logs, metrics labels and the console: printable, no spaces.
NAME_RE = re.compile(r"[A-Za-z0-9_.@:-]{1,64}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


# --------------------------------------------------------------------------------------------
# Errors


class ConfigError(Exception):
    """A config problem: where (``source``), which key (dotted path) and what is wrong."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.key:
            return f"{self.source}: {self.key}: {self.problem}"
        return f"{self.source}: {self.problem}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.key, self.problem))


# --------------------------------------------------------------------------------------------
# Dataclasses


@dataclass(frozen=True, slots=True)
class GateConfig:
    """``[gate]``: the gate's own listener and limits."""

    listen_host: str = "127.0.0.1"
    listen_port: int = 8081
    journal: str = "tokengate.db"
    max_body_bytes: int = 8 * 1024 * 1024
    request_timeout_s: float = 600.0
    shed_factor: float = 2.5

    @property
    def listen(self) -> str:
        """The listen address as ``host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """One ``[[backends]]`` entry: a llama-server the gate forwards to."""

    name: str = "default"
    url: str = "http://127.0.0.1:8080"
    models: tuple[str, ...] = ()
    kv: KvMode = "unified"
    token_budget: int | None = None
    max_prefill_tokens: int | None = None
    api_key_env: str | None = None


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    """``[budget]``: the token budget and its adaptive controller."""

    mode: BudgetMode = "adaptive"
    min_tokens: int = 2048
    slo_ttft_p95_ms: float = 2000.0
    slo_tpot_p95_ms: float | None = None
    window_s: float = 30.0
    cooldown_s: float = 5.0
    increase: float = 1.1
    decrease: float = 0.8
    min_samples: int = 20


@dataclass(frozen=True, slots=True)
class ClassConfig:
    """One ``[classes.NAME]`` table. A HIGHER ``priority`` is served first.

    ``limit_tokens`` None means the class may borrow up to the whole budget.
    """

    name: str
    priority: int
    reserved_tokens: int = 0
    limit_tokens: int | None = None
    queue_depth: int = 64
    queue_timeout_s: float = 30.0
    default_max_tokens: int = 512
    max_tokens_cap: int = 4096


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """One ``[[tenants]]`` entry. The TOML key ``class`` is ``class_name`` here.

    ``class_name`` None means the config's ``default_class``; ``allowed_classes`` empty means the
    tenant may use only its own class.
    """

    name: str
    api_key_sha256: str | None = None
    api_key_env: str | None = None
    class_name: str | None = None
    allowed_classes: tuple[str, ...] = ()
    weight: float = 1.0
    max_tokens_in_flight: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


DEFAULT_CLASSES: tuple[ClassConfig, ...] = (
    ClassConfig(
        name="interactive",
        priority=10,
        queue_depth=64,
        queue_timeout_s=10.0,
        default_max_tokens=256,
        max_tokens_cap=4096,
    ),
    ClassConfig(
        name="batch",
        priority=1,
        queue_depth=256,
        queue_timeout_s=120.0,
        default_max_tokens=512,
        max_tokens_cap=4096,
    ),
)

DEFAULT_CLASS_NAME = "interactive"


@dataclass(frozen=True, slots=True)
class Config:
    """The whole validated config. ``classes`` is sorted by priority, highest first."""

    gate: GateConfig = field(default_factory=GateConfig)
    backends: tuple[BackendConfig, ...] = (BackendConfig(),)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    classes: tuple[ClassConfig, ...] = DEFAULT_CLASSES
    tenants: tuple[TenantConfig, ...] = ()
    default_class: str = DEFAULT_CLASS_NAME

    def class_by_name(self, name: str) -> ClassConfig:
        """The class called ``name``; KeyError if there is none."""
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(name)

    def backend_by_name(self, name: str) -> BackendConfig:
        """The backend called ``name``; KeyError if there is none."""
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)

    def tenant_by_name(self, name: str) -> TenantConfig:
        """The tenant called ``name``; KeyError if there is none."""
        for t in self.tenants:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def class_names(self) -> tuple[str, ...]:
        """Class names, highest priority first."""
        return tuple(c.name for c in self.classes)


# --------------------------------------------------------------------------------------------
# Loading


def load_config(path: str | os.PathLike[str] | None) -> Config:
    """Read and validate a TOML config file; ``None`` gives the defaults."""
    if path is None:
        return Config()
    source = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(source, "", f"cannot read the file: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(source, "", f"not UTF-8 text ({e.reason} at byte {e.start})") from e
    return parse_config(text, source)


_TOML_POS_RE = re.compile(r"\s*\(at (line \d+, column \d+|end of document)\)\s*$")


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse TOML text and validate it. ``source`` names it in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_POS_RE.search(msg)
        where = m.group(1) if m else ""
        if m:
            msg = msg[: m.start()]
        raise ConfigError(source, where, f"invalid TOML: {msg}") from e
    return config_from_dict(data, source)


# --------------------------------------------------------------------------------------------
# Dict -> dataclasses (structure and types)

_TOP_KEYS = ("gate", "backends", "budget", "classes", "tenants", "default_class")


def _toml_key_of(f: dataclasses.Field[Any]) -> str:
    return "class" if f.name == "class_name" else f.name


def _keys_of(cls: type) -> tuple[str, ...]:
    return tuple(_toml_key_of(f) for f in dataclasses.fields(cls))


_GATE_KEYS = ("listen", "journal", "max_body_bytes", "request_timeout_s", "shed_factor")
_BACKEND_KEYS = _keys_of(BackendConfig)
_BUDGET_KEYS = _keys_of(BudgetConfig)
_CLASS_KEYS = tuple(k for k in _keys_of(ClassConfig) if k != "name")
_TENANT_KEYS = _keys_of(TenantConfig)


def _show(value: Any) -> str:
    """A value as the user would have written it in TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "a table"
    return str(value)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__  # dates and times


def _got(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    return f"{_type_name(value)} {_show(value)}"


def _key_part(name: str) -> str:
    return name if _BARE_KEY_RE.fullmatch(name) else json.dumps(name, ensure_ascii=False)


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {json.dumps(close[0])}?" if close else ""


class _Reader:
    """Typed access to one TOML table, with the error path of that table."""

    def __init__(self, source: str, path: str, table: Mapping[str, Any], allowed: Iterable[str]):
        self.source = source
        self.path = path
        self.table = table
        allowed = tuple(allowed)
        for k in table:
            if k not in allowed:
                hint = _suggest(k, allowed)
                if not hint:
                    hint = "; valid keys: " + ", ".join(allowed)
                raise ConfigError(source, self.key(k), f"unknown key{hint}")

    def key(self, k: str) -> str:
        return f"{self.path}.{_key_part(k)}" if self.path else _key_part(k)

    def error(self, k: str, problem: str) -> ConfigError:
        return ConfigError(self.source, self.key(k), problem)

    def has(self, k: str) -> bool:
        return k in self.table

    def get_int(self, k: str, default: int) -> int:
        v = self.table.get(k, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(k, f"must be an integer, got {_got(v)}")
        return v

    def opt_int(self, k: str) -> int | None:
        return self.get_int(k, 0) if k in self.table else None

    def get_float(self, k: str, default: float) -> float:
        v = self.table.get(k, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.error(k, f"must be a number, got {_got(v)}")
        f = float(v)
        if not math.isfinite(f):
            raise self.error(k, f"must be a finite number, got {_show(v)}")
        return f

    def opt_float(self, k: str) -> float | None:
        return self.get_float(k, 0.0) if k in self.table else None

    def get_str(self, k: str, default: str) -> str:
        v = self.table.get(k, default)
        if not isinstance(v, str):
            raise self.error(k, f"must be a string, got {_got(v)}")
        return v

    def opt_str(self, k: str) -> str | None:
        return self.get_str(k, "") if k in self.table else None

    def str_tuple(self, k: str) -> tuple[str, ...]:
        v = self.table.get(k, [])
        if not isinstance(v, list):
            raise self.error(k, f"must be an array of strings, got {_got(v)}")
        for i, item in enumerate(v):
            if not isinstance(item, str):
                raise ConfigError(
                    self.source, f"{self.key(k)}[{i}]", f"must be a string, got {_got(item)}"
                )
        return tuple(v)

    def choice(self, k: str, default: str, choices: tuple[str, ...]) -> str:
        v = self.get_str(k, default)
        if v not in choices:
            alts = " or ".join(json.dumps(c) for c in choices)
            raise self.error(k, f"must be {alts}, got {_show(v)}{_suggest(v, choices)}")
        return v


def _table(source: str, key: str, value: Any, hint: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(source, key, f"must be a table{hint}, got {_got(value)}")
    return value


def _array_of_tables(source: str, key: str, value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        raise ConfigError(
            source, key, f"must be an array of tables (write [[{key}]], not [{key}]), got a table"
        )
    if not isinstance(value, list):
        raise ConfigError(source, key, f"must be an array of tables ([[{key}]]), got {_got(value)}")
    for i, item in enumerate(value):
        _table(source, f"{key}[{i}]", item)
    return value


def _parse_listen(source: str, key: str, value: str) -> tuple[str, int]:
    def bad(problem: str) -> ConfigError:
        return ConfigError(source, key, f"{problem}, got {_show(value)}")

    if value.startswith("["):
        end = value.find("]")
        if end < 0 or value[end + 1 : end + 2] != ":":
            raise bad('must be "host:port" (IPv6 as "[::1]:8081")')
        host, port_text = value[1:end], value[end + 2 :]
        if not host or ":" not in host:
            raise bad("brackets are only for IPv6 addresses")
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or not host:
            raise bad('must be "host:port", e.g. "127.0.0.1:8081"')
        if ":" in host:
            raise bad('an IPv6 address needs brackets, e.g. "[::1]:8081"')
    if any(ch.isspace() for ch in host) or "/" in host:
        raise bad("the host is not a valid host name or address")
    if not port_text.isascii() or not port_text.isdigit():
        raise bad("the port must be a number from 1 to 65535")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise bad("the port must be a number from 1 to 65535")
    return host, port


def _gate(source: str, data: Any) -> GateConfig:
    r = _Reader(source, "gate", _table(source, "gate", data), _GATE_KEYS)
    d = GateConfig()
    host, port = d.listen_host, d.listen_port
    if r.has("listen"):
        host, port = _parse_listen(source, "gate.listen", r.get_str("listen", ""))
    return GateConfig(
        listen_host=host,
        listen_port=port,
        journal=r.get_str("journal", d.journal),
        max_body_bytes=r.get_int("max_body_bytes", d.max_body_bytes),
        request_timeout_s=r.get_float("request_timeout_s", d.request_timeout_s),
        shed_factor=r.get_float("shed_factor", d.shed_factor),
    )


def _backend(source: str, i: int, data: dict[str, Any]) -> BackendConfig:
    r = _Reader(source, f"backends[{i}]", data, _BACKEND_KEYS)
    d = BackendConfig()
    url = r.get_str("url", d.url)
    # Keep a canonical form without the trailing "/" so callers can append "/v1/...".
    if url.endswith("/") and url.count("/") == 3:
        url = url[:-1]
    return BackendConfig(
        name=r.get_str("name", d.name),
        url=url,
        models=r.str_tuple("models"),
        kv=cast(KvMode, r.choice("kv", d.kv, get_args(KvMode))),
        token_budget=r.opt_int("token_budget"),
        max_prefill_tokens=r.opt_int("max_prefill_tokens"),
        api_key_env=r.opt_str("api_key_env"),
    )


def _budget(source: str, data: Any) -> BudgetConfig:
    r = _Reader(source, "budget", _table(source, "budget", data), _BUDGET_KEYS)
    d = BudgetConfig()
    return BudgetConfig(
        mode=cast(BudgetMode, r.choice("mode", d.mode, get_args(BudgetMode))),
        min_tokens=r.get_int("min_tokens", d.min_tokens),
        slo_ttft_p95_ms=r.get_float("slo_ttft_p95_ms", d.slo_ttft_p95_ms),
        slo_tpot_p95_ms=r.opt_float("slo_tpot_p95_ms"),
        window_s=r.get_float("window_s", d.window_s),
        cooldown_s=r.get_float("cooldown_s", d.cooldown_s),
        increase=r.get_float("increase", d.increase),
        decrease=r.get_float("decrease", d.decrease),
        min_samples=r.get_int("min_samples", d.min_samples),
    )


def _class(source: str, name: str, data: Any) -> ClassConfig:
    path = f"classes.{_key_part(name)}"
    if not isinstance(data, dict):
        hint = ""
        if name in _CLASS_KEYS:
            hint = f" ([classes.NAME] with {name} inside it)"
        raise ConfigError(source, path, f"must be a table{hint}, got {_got(data)}")
    r = _Reader(source, path, data, _CLASS_KEYS)
    if not r.has("priority"):
        raise r.error(
            "priority", "missing; every class needs a priority (an integer, higher is served first)"
        )
    return ClassConfig(
        name=name,
        priority=r.get_int("priority", 0),
        reserved_tokens=r.get_int("reserved_tokens", 0),
        limit_tokens=r.opt_int("limit_tokens"),
        queue_depth=r.get_int("queue_depth", 64),
        queue_timeout_s=r.get_float("queue_timeout_s", 30.0),
        default_max_tokens=r.get_int("default_max_tokens", 512),
        max_tokens_cap=r.get_int("max_tokens_cap", 4096),
    )


def _tenant(source: str, i: int, data: dict[str, Any]) -> TenantConfig:
    r = _Reader(source, f"tenants[{i}]", data, _TENANT_KEYS)
    if not r.has("name"):
        raise r.error("name", "missing; every tenant needs a name")
    return TenantConfig(
        name=r.get_str("name", ""),
        api_key_sha256=r.opt_str("api_key_sha256"),
        api_key_env=r.opt_str("api_key_env"),
        class_name=r.opt_str("class"),
        allowed_classes=r.str_tuple("allowed_classes"),
        weight=r.get_float("weight", 1.0),
        max_tokens_in_flight=r.opt_int("max_tokens_in_flight"),
        requests_per_minute=r.opt_int("requests_per_minute"),
        tokens_per_minute=r.opt_int("tokens_per_minute"),
    )


def config_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Config:
    """Build and validate a Config from a parsed TOML document (a dict)."""
    top = _Reader(source, "", _table(source, "", data), _TOP_KEYS)

    gate = _gate(source, data["gate"]) if "gate" in data else GateConfig()
    budget = _budget(source, data["budget"]) if "budget" in data else BudgetConfig()

    backends: tuple[BackendConfig, ...] = (BackendConfig(),)
    if "backends" in data:
        items = _array_of_tables(source, "backends", data["backends"])
        backends = tuple(_backend(source, i, b) for i, b in enumerate(items))

    classes = DEFAULT_CLASSES
    if "classes" in data:
        table = _table(source, "classes", data["classes"], " of [classes.NAME] tables")
        classes = tuple(_class(source, name, body) for name, body in table.items())

    tenants: tuple[TenantConfig, ...] = ()
    if "tenants" in data:
        items = _array_of_tables(source, "tenants", data["tenants"])
        tenants = tuple(_tenant(source, i, t) for i, t in enumerate(items))

    names = {c.name for c in classes}
    if top.has("default_class"):
        default_class = top.get_str("default_class", "")
    elif DEFAULT_CLASS_NAME in names or not classes:
        default_class = DEFAULT_CLASS_NAME
    else:
        # No "interactive" class and no default_class given: the highest-priority class.
        default_class = _sorted_classes(classes)[0].name

    config = Config(
        gate=gate,
        backends=backends,
        budget=budget,
        classes=_sorted_classes(classes),
        tenants=tenants,
        default_class=default_class,
    )
    validate_config(config, source)
    return config


def _sorted_classes(classes: Iterable[ClassConfig]) -> tuple[ClassConfig, ...]:
    # Highest priority first; equal priorities in name order so the order never depends on
    # the order of keys in the file.
    return tuple(sorted(classes, key=lambda c: (-c.priority, c.name)))


# --------------------------------------------------------------------------------------------
# Validation on the dataclasses (values and cross-field rules)



class _Check:
    def __init__(self, source: str, path: str) -> None:
        self.source = source
        self.path = path

    def fail(self, key: str, problem: str) -> ConfigError:
        full = f"{self.path}.{key}" if self.path and key else (self.path or key)
        return ConfigError(self.source, full, problem)

    def check(self, key: str, value: Any, ok: Callable[[Any], bool], what: str) -> None:
        if value is not None and not ok(value):
            raise self.fail(key, f"must be {what}, got {_show(value)}")

    def unique_name(self, name: str, index: int, seen: dict[str, int], kind: str, hint: str = "") -> None:
        """A well-formed `name`, not used by an earlier entry of the same list (recorded in `seen`)."""
        self.check("name", name, lambda v: NAME_RE.fullmatch(v) is not None, "1 to 64 characters from A-Z a-z 0-9 _ . @ : -")
        if name in seen:
            table = self.path.split("[", 1)[0]
            raise self.fail("name", f"duplicate {kind} name {_show(name)} ({table}[{seen[name]}] has it too){hint}")
        seen[name] = index

    def pos_int(self, key: str, value: int | None) -> None:
        self.check(key, value, lambda v: v > 0, "a positive integer")

    def pos_num(self, key: str, value: float | None) -> None:
        self.check(key, value, lambda v: v > 0, "a positive number")


def _check_types(source: str, path: str, obj: Any) -> None:
    """Field types on a hand-built dataclass (the TOML path has already checked these)."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        key = f"{path}.{_toml_key_of(f)}" if path else _toml_key_of(f)
        t = str(f.type)
        optional = "None" in t
        if v is None:
            if not optional:
                raise ConfigError(source, key, "must be set")
            continue
        if t.startswith("tuple"):
            if not isinstance(v, tuple) or not all(isinstance(x, str) for x in v):
                raise ConfigError(source, key, f"must be a tuple of strings, got {v!r}")
        elif t.startswith("int"):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(source, key, f"must be an integer, got {_got(v)}")
        elif t.startswith("float"):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(source, key, f"must be a finite number, got {_got(v)}")
        elif t.startswith(("str", "Literal", "KvMode", "BudgetMode")):
            if not isinstance(v, str):
                raise ConfigError(source, key, f"must be a string, got {_got(v)}")


def _check_env_name(c: _Check, key: str, value: str | None) -> None:
    c.check(
        key,
        value,
        lambda v: ENV_NAME_RE.fullmatch(v) is not None,
        "an environment variable name (letters, digits, _; not starting with a digit)",
    )


def _check_url(c: _Check, key: str, url: str) -> None:
    def bad(problem: str) -> ConfigError:
        return c.fail(key, f"{problem}, got {_show(url)}")

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise bad(f"is not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https"):
        raise bad("must be http://host[:port] or https://host[:port]")
    if not parts.hostname:
        raise bad("must name a host, as in http://127.0.0.1:8080")
    if parts.username is not None or parts.password is not None:
        raise bad("must not carry credentials (use api_key_env)")
    if parts.path not in ("", "/"):
        raise bad("must not have a path (the gate adds /v1/... itself)")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise bad("must not have a query or fragment")
    if port == 0 or (parts.netloc.endswith(":") and port is None):
        raise bad("the port must be a number from 1 to 65535")


def validate_config(config: Config, source: str = "<config>") -> None:
    """Check every value and cross-field rule of ``config``; raise ConfigError on the first."""
    s = source

    # [gate]
    g = config.gate
    _check_types(s, "gate", g)
    c = _Check(s, "gate")
    if not g.listen_host or any(ch.isspace() for ch in g.listen_host):
        raise c.fail("listen", f"the host must not be empty, got {_show(g.listen_host)}")
    c.check("listen", g.listen_port, lambda v: 1 <= v <= 65535, "a port from 1 to 65535")
    if not g.journal.strip():
        raise c.fail("journal", "must be a file path (or \":memory:\"), got an empty string")
    c.pos_int("max_body_bytes", g.max_body_bytes)
    c.pos_num("request_timeout_s", g.request_timeout_s)
    c.check(
        "shed_factor",
        g.shed_factor,
        lambda v: v > 1,
        "greater than 1 (a request is shed after shed_factor x its expected duration)",
    )

    # [budget]
    b = config.budget
    _check_types(s, "budget", b)
    c = _Check(s, "budget")
    c.check("mode", b.mode, lambda v: v in get_args(BudgetMode), '"adaptive" or "static"')
    c.pos_int("min_tokens", b.min_tokens)
    c.pos_num("slo_ttft_p95_ms", b.slo_ttft_p95_ms)
    c.pos_num("slo_tpot_p95_ms", b.slo_tpot_p95_ms)
    c.pos_num("window_s", b.window_s)
    c.check("cooldown_s", b.cooldown_s, lambda v: v >= 0, "zero or more seconds")
    c.check(
        "increase", b.increase, lambda v: v > 1, "greater than 1 (the factor that opens the budget)"
    )
    c.check(
        "decrease",
        b.decrease,
        lambda v: 0 < v < 1,
        "between 0 and 1, exclusive (the factor that closes the budget)",
    )
    c.pos_int("min_samples", b.min_samples)

    # [[backends]]
    if not config.backends:
        raise ConfigError(s, "backends", "at least one backend is required")
    backend_names: dict[str, int] = {}
    model_owner: dict[str, int] = {}
    for i, be in enumerate(config.backends):
        path = f"backends[{i}]"
        _check_types(s, path, be)
        c = _Check(s, path)
        c.unique_name(be.name, i, backend_names, "backend", "; give each backend its own name")
        _check_url(c, "url", be.url)
        c.check("kv", be.kv, lambda v: v in get_args(KvMode), '"unified" or "split"')
        for j, model in enumerate(be.models):
            mkey = f"models[{j}]"
            if not model.strip():
                raise c.fail(mkey, "must be a model name, got an empty string")
            if model in model_owner:
                k = model_owner[model]
                where = f"backends[{k}] ({config.backends[k].name})" if k != i else "this backend"
                raise c.fail(
                    mkey,
                    f"model {_show(model)} is already routed to {where}; "
                    "a model name may be routed to one backend only",
                )
            model_owner[model] = i
        c.pos_int("token_budget", be.token_budget)
        if be.token_budget is not None and be.token_budget < b.min_tokens:
            raise c.fail(
                "token_budget",
                f"must be at least budget.min_tokens ({b.min_tokens}), got {be.token_budget}",
            )
        c.pos_int("max_prefill_tokens", be.max_prefill_tokens)
        _check_env_name(c, "api_key_env", be.api_key_env)

    # [classes.NAME]
    if not config.classes:
        raise ConfigError(s, "classes", "at least one class is required")
    seen_classes: set[str] = set()
    for cl in config.classes:
        path = f"classes.{_key_part(cl.name)}" if isinstance(cl.name, str) else "classes"
        _check_types(s, path, cl)
        c = _Check(s, path)
        if not CLASS_NAME_RE.fullmatch(cl.name):
            raise ConfigError(
                s, path, f"class names may use only a-z 0-9 _ -, got {_show(cl.name)}"
            )
        if cl.name in seen_classes:
            raise ConfigError(s, path, f"duplicate class name {_show(cl.name)}")
        seen_classes.add(cl.name)
        c.check("reserved_tokens", cl.reserved_tokens, lambda v: v >= 0, "zero or a positive integer")
        c.pos_int("limit_tokens", cl.limit_tokens)
        if cl.limit_tokens is not None and cl.limit_tokens < cl.reserved_tokens:
            raise c.fail(
                "limit_tokens",
                f"must be at least reserved_tokens ({cl.reserved_tokens}), got {cl.limit_tokens}",
            )
        c.pos_int("queue_depth", cl.queue_depth)
        c.pos_num("queue_timeout_s", cl.queue_timeout_s)
        c.pos_int("default_max_tokens", cl.default_max_tokens)
        c.pos_int("max_tokens_cap", cl.max_tokens_cap)
        if cl.default_max_tokens > cl.max_tokens_cap:
            raise c.fail(
                "default_max_tokens",
                f"must be at most max_tokens_cap ({cl.max_tokens_cap}), "
                f"got {cl.default_max_tokens}",
            )
    reserved = [(cl.name, cl.reserved_tokens) for cl in config.classes if cl.reserved_tokens]
    total_reserved = sum(n for _, n in reserved)
    if total_reserved > b.min_tokens:
        parts = " + ".join(f"{name} {n}" for name, n in reserved)
        raise ConfigError(
            s,
            "classes",
            f"reserved_tokens add up to {total_reserved} ({parts}), more than budget.min_tokens "
            f"({b.min_tokens}); reservations must fit the smallest budget the controller may "
            "choose, so lower them or raise budget.min_tokens",
        )

    class_names = [cl.name for cl in config.classes]
    if config.default_class not in seen_classes:
        raise ConfigError(
            s,
            "default_class",
            f"must name a class ({', '.join(class_names)}), got {_show(config.default_class)}"
            f"{_suggest(str(config.default_class), class_names)}",
        )

    # [[tenants]]
    tenant_names: dict[str, int] = {}
    sha_owner: dict[str, int] = {}
    env_owner: dict[str, int] = {}
    for i, t in enumerate(config.tenants):
        path = f"tenants[{i}]"
        _check_types(s, path, t)
        c = _Check(s, path)
        c.unique_name(t.name, i, tenant_names, "tenant")

        if (t.api_key_sha256 is None) == (t.api_key_env is None):
            both = t.api_key_sha256 is not None
            raise c.fail(
                "api_key_sha256" if both else "",
                (
                    "set either api_key_sha256 or api_key_env, not both"
                    if both
                    else "a tenant needs exactly one of api_key_sha256 or api_key_env"
                ),
            )
        if t.api_key_sha256 is not None:
            if not SHA256_RE.fullmatch(t.api_key_sha256):
                raise c.fail(
                    "api_key_sha256",
                    "must be 64 lowercase hex characters (sha256 of the key, e.g. from "
                    f"`printf %s KEY | sha256sum`), got {_show(t.api_key_sha256)}",
                )
            if t.api_key_sha256 in sha_owner:
                k = sha_owner[t.api_key_sha256]
                raise c.fail(
                    "api_key_sha256",
                    f"the same key hash is already used by tenants[{k}] "
                    f"({config.tenants[k].name}); each tenant needs its own key",
                )
            sha_owner[t.api_key_sha256] = i
        if t.api_key_env is not None:
            _check_env_name(c, "api_key_env", t.api_key_env)
            if t.api_key_env in env_owner:
                k = env_owner[t.api_key_env]
                raise c.fail(
                    "api_key_env",
                    f"{_show(t.api_key_env)} is already the key of tenants[{k}] "
                    f"({config.tenants[k].name}); each tenant needs its own key",
                )
            env_owner[t.api_key_env] = i

        if t.class_name is not None and t.class_name not in seen_classes:
            raise c.fail(
                "class",
                f"must name a class ({', '.join(class_names)}), got {_show(t.class_name)}"
                f"{_suggest(t.class_name, class_names)}",
            )
        seen_allowed: set[str] = set()
        for j, name in enumerate(t.allowed_classes):
            key = f"allowed_classes[{j}]"
            if name not in seen_classes:
                raise c.fail(
                    key,
                    f"must name a class ({', '.join(class_names)}), got {_show(name)}"
                    f"{_suggest(name, class_names)}",
                )
            if name in seen_allowed:
                raise c.fail(key, f"{_show(name)} is listed twice")
            seen_allowed.add(name)
        own = t.class_name if t.class_name is not None else config.default_class
        if t.allowed_classes and own not in seen_allowed:
            what = "the tenant's class" if t.class_name is not None else "default_class"
            raise c.fail(
                "allowed_classes",
                f"must include {what} {_show(own)}, got {_show(t.allowed_classes)}",
            )
        c.pos_num("weight", t.weight)
        c.pos_int("max_tokens_in_flight", t.max_tokens_in_flight)
        c.pos_int("requests_per_minute", t.requests_per_minute)
        c.pos_int("tokens_per_minute", t.tokens_per_minute)


# --------------------------------------------------------------------------------------------
# The annotated example (`tokengate config example`)

EXAMPLE_CONFIG = """\
# tokengate.toml: every key, with its default. Every key is optional; delete what you do not
# need. Check a file with `tokengate config check FILE`.
#
# Token counts below are KV-cache tokens: a request costs prompt tokens + max_tokens.

# Class used when a request names none (no tenant class, no X-Tokengate-Class header).
# Default: "interactive" when that class exists, else the highest-priority class.
default_class = "interactive"

[gate]
# Address the gate listens on, "host:port"; IPv6 as "[::1]:8081". Default "127.0.0.1:8081".
# Clients talk to this instead of llama-server.
listen = "127.0.0.1:8081"
# SQLite journal (decisions, audit, samples), relative to the working directory.
# Default "tokengate.db".
journal = "tokengate.db"
# Largest request body accepted, in bytes; bigger gets 413 body_too_large. Default 8388608 (8 MiB).
max_body_bytes = 8388608
# Upper bound on one upstream request, in seconds (504 upstream_timeout after it). Default 600.
request_timeout_s = 600.0
# A running request older than shed_factor x its expected duration is aborted (503
# shed_overrun) so it stops holding a slot and KV memory. Must be > 1. Default 2.5.
shed_factor = 2.5

# One [[backends]] table per llama-server. Default: one backend "default" at
# http://127.0.0.1:8080 (llama-server's own default address).
[[backends]]
# Unique name, shown in the console, metrics and journal. Default "default".
name = "default"
# Base URL, http(s)://host[:port], no path. Default "http://127.0.0.1:8080".
url = "http://127.0.0.1:8080"
# Model names (the request's "model" field) routed to this backend. A model may be routed to
# one backend only. Default [] (no explicit routing).
models = []
# How llama-server shares its KV cache between slots: "unified" (one shared pool, llama-server
# --kv-unified; the budget ceiling is the pool size) or "split" (per-slot context; the ceiling
# is slots x per-slot context). Default "unified", the safe side.
kv = "unified"
# Override the budget ceiling (tokens) read from the backend; must be >= budget.min_tokens.
# Default: unset (use the backend's physical capacity).
# token_budget = 16384
# Most prompt tokens that may be prefilling at once on this backend. Long prefills stall every
# running decode, so a burst of long prompts waits. Default: unset (no limit).
# max_prefill_tokens = 8192
# Name of an environment variable holding the API key the gate sends upstream
# (llama-server --api-key). Default: unset (send none).
# api_key_env = "LLAMA_API_KEY"

[budget]
# "adaptive": the controller moves the working budget between min_tokens and the backend's
# ceiling, steered by upstream latency against the SLOs below. "static": the budget stays at
# the ceiling (or token_budget). Default "adaptive".
mode = "adaptive"
# Smallest budget the controller may choose, in tokens. The classes' reserved_tokens must add
# up to no more than this. Default 2048.
min_tokens = 2048
# Target p95 time-to-first-token measured upstream (from dispatch, not queue time), in
# milliseconds. Default 2000.
slo_ttft_p95_ms = 2000.0
# Target p95 time per output token, in milliseconds. Default: unset (TTFT only).
# slo_tpot_p95_ms = 100.0
# Sliding window the p95 values are computed over, in seconds. Default 30.
window_s = 30.0
# Least time between two budget moves, in seconds. Default 5.
cooldown_s = 5.0
# Factor applied when latency is well under the SLO and there is demand. Must be > 1. Default 1.1.
increase = 1.1
# Factor applied when latency is over the SLO. Must be between 0 and 1. Default 0.8.
decrease = 0.8
# Fewest upstream samples in the window before the controller moves at all. Default 20.
min_samples = 20

# One [classes.NAME] table per priority class; names use a-z 0-9 _ -. Without any [classes],
# these two are the defaults. Defining any class replaces both defaults.
[classes.interactive]
# Higher is served first. Required for every class you define.
priority = 10
# Tokens guaranteed to this class: other classes cannot use them while it has demand.
# Default 0.
reserved_tokens = 1024
# Most tokens this class may hold in flight, borrowing included; >= reserved_tokens.
# Default: unset (may borrow up to the whole budget).
# limit_tokens = 8192
# Most requests waiting in this class's queue; more are refused with 429 queue_full.
# Default 64.
queue_depth = 64
# Longest wait in the queue, in seconds; then 429 queue_timeout. Default 30.
queue_timeout_s = 10.0
# max_tokens assumed AND injected upstream when a request gives none, so the worst case is
# bounded. Must be <= max_tokens_cap. Default 512.
default_max_tokens = 256
# Largest max_tokens a request of this class may ask for. Default 4096.
max_tokens_cap = 4096

[classes.batch]
priority = 1
reserved_tokens = 0
# Keep batch work from taking the whole budget.
limit_tokens = 16384
queue_depth = 256
queue_timeout_s = 120.0
default_max_tokens = 512
max_tokens_cap = 4096

# One [[tenants]] table per client. With no tenants the gate is open: the class comes from the
# X-Tokengate-Class header or default_class, the tenant from the request's "user" field or the
# client address. With tenants, every request needs a tenant's API key (Authorization: Bearer).
# Uncomment to use:
#
# [[tenants]]
# # Unique name, shown in the console and journal.
# name = "team-a"
# # Environment variable holding this tenant's API key (read when the gate starts).
# # Give exactly one of api_key_env or api_key_sha256.
# api_key_env = "TOKENGATE_KEY_TEAM_A"
# # Class used when the request names none. Default: default_class.
# class = "interactive"
# # Classes this tenant may ask for (X-Tokengate-Class); must include its own class.
# # Default [] (only its own class).
# allowed_classes = ["interactive", "batch"]
# # Share of its class's capacity relative to other tenants (deficit round robin, in tokens).
# # Default 1.0.
# weight = 2.0
# # Most tokens this tenant may hold in flight; a larger single request gets 429 tenant_quota.
# # Default: unset (no quota).
# max_tokens_in_flight = 8192
# # Token-bucket rate limits, per minute; 429 rate_limited beyond them. Default: unset.
# requests_per_minute = 600
# tokens_per_minute = 200000
#
# [[tenants]]
# name = "nightly-batch"
# # sha256 of the API key as 64 lowercase hex characters: printf %s "$KEY" | sha256sum
# api_key_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
# class = "batch"
"""
