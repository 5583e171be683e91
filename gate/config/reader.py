"""Reading TOML into the schema dataclasses, checking structure and types only.

``config_from_dict`` ends with :func:`gate.config.checks.validate_config`, so everything read
here comes back validated.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any, Literal, cast, get_args

from gate.config.checks import validate_config
from gate.config.schema import (
    CLASS_QUEUE_TIMEOUT_S,
    DEFAULT_CLASS_NAME,
    DEFAULT_CLASSES,
    BackendConfig,
    BudgetConfig,
    BudgetMode,
    ClassConfig,
    Config,
    ConfigError,
    FailurePolicy,
    FleetGateConfig,
    GateConfig,
    KvMode,
    SharedConfig,
    TenantConfig,
)
from gate.config.terms import _got, _key_part, _show, _suggest, _toml_key_of

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


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

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

_TOP_KEYS = ("gate", "backends", "budget", "classes", "tenants", "default_class", "fleet", "shared")


def _keys_of(cls: type) -> tuple[str, ...]:
    return tuple(_toml_key_of(f) for f in dataclasses.fields(cls))


_GATE_KEYS = (
    "listen",
    "journal",
    "max_body_bytes",
    "request_timeout_s",
    "shed_factor",
    "shed_stall_s",
    "header_timeout_s",
    "body_timeout_s",
    "write_stall_s",
    "stream_batch_ms",
    "forward_beside_count",
    "control_socket",
    "control_socket_group",
    "unknown_routes",
)
_BACKEND_KEYS = _keys_of(BackendConfig)
_BUDGET_KEYS = _keys_of(BudgetConfig)
_CLASS_KEYS = tuple(k for k in _keys_of(ClassConfig) if k != "name")
_TENANT_KEYS = _keys_of(TenantConfig)
_FLEET_KEYS = ("name", "socket")
_SHARED_KEYS = _keys_of(SharedConfig)


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
        if not INT64_MIN <= v <= INT64_MAX:
            # TOML's integers are 64-bit and a parser must refuse others, but tomllib reads any:
            # a trial's queue_depth = 99999999999999999999 passed `config check`
            raise self.error(k, f"must be a 64-bit integer, as TOML's are ({INT64_MIN} to {INT64_MAX}), got {v}")
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

    def get_bool(self, k: str, default: bool) -> bool:
        v = self.table.get(k, default)
        if not isinstance(v, bool):
            raise self.error(k, f"must be true or false, got {_got(v)}")
        return v

    def opt_str(self, k: str) -> str | None:
        return self.get_str(k, "") if k in self.table else None

    def str_tuple(self, k: str) -> tuple[str, ...]:
        v = self.table.get(k, [])
        if not isinstance(v, list):
            raise self.error(k, f"must be an array of strings, got {_got(v)}")
        for i, item in enumerate(v):
            if not isinstance(item, str):
                raise ConfigError(self.source, f"{self.key(k)}[{i}]", f"must be a string, got {_got(item)}")
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
        raise ConfigError(source, key, f"must be an array of tables (write [[{key}]], not [{key}]), got a table")
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
    also: list[str] = []
    if r.has("listen"):
        value = r.table["listen"]
        if isinstance(value, list):
            if not value:
                raise r.error("listen", 'must name at least one address, e.g. ["127.0.0.1:8081", "[::1]:8081"]')
            addresses = []
            for i, item in enumerate(value):
                if not isinstance(item, str):
                    raise ConfigError(source, f"gate.listen[{i}]", f"must be a string, got {_got(item)}")
                parsed = _parse_listen(source, f"gate.listen[{i}]", item)
                if parsed in addresses:
                    raise ConfigError(source, f"gate.listen[{i}]", f"{_show(item)} is listed twice")
                addresses.append(parsed)
            (host, port), rest = addresses[0], addresses[1:]
            also = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in rest]
        else:
            host, port = _parse_listen(source, "gate.listen", r.get_str("listen", ""))
    return GateConfig(
        listen_host=host,
        listen_port=port,
        listen_also=tuple(also),
        unknown_routes=cast(Literal["forward", "refuse"], r.choice("unknown_routes", d.unknown_routes, ("forward", "refuse"))),
        journal=r.get_str("journal", d.journal),
        max_body_bytes=r.get_int("max_body_bytes", d.max_body_bytes),
        request_timeout_s=r.get_float("request_timeout_s", d.request_timeout_s),
        shed_factor=r.get_float("shed_factor", d.shed_factor),
        control_socket=r.get_str("control_socket", d.control_socket),
        control_socket_group=r.get_str("control_socket_group", d.control_socket_group),
        shed_stall_s=r.get_float("shed_stall_s", d.shed_stall_s),
        header_timeout_s=r.get_float("header_timeout_s", d.header_timeout_s),
        body_timeout_s=r.get_float("body_timeout_s", d.body_timeout_s),
        write_stall_s=r.get_float("write_stall_s", d.write_stall_s),
        stream_batch_ms=r.get_float("stream_batch_ms", d.stream_batch_ms),
        forward_beside_count=r.get_bool("forward_beside_count", d.forward_beside_count),
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
        prefill_yield_tokens=r.get_int("prefill_yield_tokens", d.prefill_yield_tokens),
        api_key_env=r.opt_str("api_key_env"),
        pin=r.str_tuple("pin"),
        cold_start_s=r.opt_float("cold_start_s"),
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
        aging_s=r.get_float("aging_s", d.aging_s),
        keep_slots=r.get_bool("keep_slots", d.keep_slots),
    )


def _shared(source: str, data: Any) -> SharedConfig:
    r = _Reader(source, "shared", _table(source, "shared", data), _SHARED_KEYS)
    d = SharedConfig()
    return SharedConfig(
        redis_url=r.get_str("redis_url", d.redis_url),
        key_prefix=r.get_str("key_prefix", d.key_prefix),
        failure_policy=cast(FailurePolicy, r.choice("failure_policy", d.failure_policy, get_args(FailurePolicy))),
        renew_interval_s=r.get_float("renew_interval_s", d.renew_interval_s),
        wait_ms=r.get_float("wait_ms", d.wait_ms),
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
        raise r.error("priority", "missing; every class needs a priority (an integer, higher is served first)")
    return ClassConfig(
        name=name,
        priority=r.get_int("priority", 0),
        reserved_tokens=r.get_int("reserved_tokens", 0),
        limit_tokens=r.opt_int("limit_tokens"),
        queue_depth=r.get_int("queue_depth", 64),
        queue_timeout_s=r.get_float("queue_timeout_s", CLASS_QUEUE_TIMEOUT_S),
        default_max_tokens=r.get_int("default_max_tokens", 512),
        max_tokens_cap=r.get_int("max_tokens_cap", 4096),
        ttft_objective_ms=r.opt_float("ttft_objective_ms"),
        fallback=r.str_tuple("fallback"),
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
        fallback=r.str_tuple("fallback"),
        operator=r.get_bool("operator", False),
    )


def _fleet_gate(source: str, i: int, data: dict[str, Any]) -> FleetGateConfig:
    r = _Reader(source, f"fleet[{i}]", data, _FLEET_KEYS)
    if not r.has("socket"):
        raise r.error("socket", "missing; every [[fleet]] gate needs its control socket's path")
    return FleetGateConfig(socket=r.get_str("socket", ""), name=r.get_str("name", ""))


def config_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Config:
    """Build and validate a Config from a parsed TOML document (a dict)."""
    top = _Reader(source, "", _table(source, "", data), _TOP_KEYS)

    gate = _gate(source, data["gate"]) if "gate" in data else GateConfig()
    budget = _budget(source, data["budget"]) if "budget" in data else BudgetConfig()
    shared = _shared(source, data["shared"]) if "shared" in data else SharedConfig()

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

    fleet: tuple[FleetGateConfig, ...] = ()
    if "fleet" in data:
        items = _array_of_tables(source, "fleet", data["fleet"])
        fleet = tuple(_fleet_gate(source, i, f) for i, f in enumerate(items))

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
        fleet=fleet,
        shared=shared,
    )
    validate_config(config, source)
    return config


def _sorted_classes(classes: Iterable[ClassConfig]) -> tuple[ClassConfig, ...]:
    # Highest priority first; equal priorities in name order so the order never depends on
    # the order of keys in the file.
    return tuple(sorted(classes, key=lambda c: (-c.priority, c.name)))


def beside_the_file(config: Config, path: str | os.PathLike[str] | None) -> tuple[Config, str | None]:
    """For a command that reads what a gate on `config` writes (its journal, its control
    socket): a relative ``[gate] journal`` is where the gate runs (its working directory),
    which is not always here. When it is not here and the config file's folder holds it, that
    one, with a note saying so (a trial ran `tokengate log --config /srv/gate/tokengate.toml`
    from its home and read "tokengate.db: journal file not found" while the gate ran)."""
    journal = config.gate.journal
    if path is None or journal == ":memory:" or os.path.isabs(journal) or os.path.exists(journal):
        return config, None
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    there = os.path.join(folder, journal)
    if not os.path.exists(there):
        return config, None
    socket = config.gate.control_socket
    gate = dataclasses.replace(
        config.gate, journal=there, control_socket=socket if not socket or os.path.isabs(socket) else os.path.join(folder, socket)
    )
    note = f"[gate] journal {journal!r} is not in this directory; reading the one beside {os.fspath(path)}: {there}"
    return dataclasses.replace(config, gate=gate), note


def relative_paths_note(config: Config, path: str | os.PathLike[str] | None, *, journal: bool = True, socket: bool = True) -> str | None:
    """For a command that reads the journal (`journal`) or the control socket (`socket`) a config
    file at `path` names: the absolute paths its relative ones resolve to (the current directory,
    as `tokengate serve` reads them too), and another journal of that name in the config file's
    folder. A trial's `tokengate overrides --config prod/tokengate.toml`, run from another gate's
    directory, read that gate's tokengate.db and socket and showed its overrides as prod's state,
    mid-incident, with no word of which files it had read. None: nothing relative (or no file)."""
    if path is None:
        return None
    named = []
    if journal and config.gate.journal != ":memory:" and not os.path.isabs(config.gate.journal):
        named.append(("journal", config.gate.journal))
    sock = config.gate.control_socket_path()
    if socket and sock and not os.path.isabs(sock):
        named.append(("control socket", sock))
    if not named:
        return None
    note = " and ".join(f"{what} {os.path.abspath(p)}" for what, p in named) + (
        f" (relative to the current directory, as {os.fspath(path)}'s [gate] paths are read, not to the file's folder)"
    )
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    there = os.path.join(folder, config.gate.journal)
    if journal and named[0][0] == "journal" and os.path.exists(there) and not _same_file(there, config.gate.journal):
        note += f"; the config file's folder holds another journal, {there}: if its gate runs there, pass --journal {there}"
    return note


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
