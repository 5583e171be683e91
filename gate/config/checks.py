"""Validation on the dataclasses (values and cross-field rules), and the warnings a valid config
is accepted with that need no backend (`objective_warnings`, `limit_warnings`).

It works on any :class:`Config`, not only one just read from TOML, so code that builds a changed
``Config`` (a retune, a reload) runs the same checks and gets the same messages.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import urllib.parse
from collections.abc import Callable
from typing import Any, get_args

from gate.config.schema import (
    CLASS_NAME_RE,
    ENV_NAME_RE,
    NAME_RE,
    SHA256_RE,
    BudgetMode,
    Config,
    ConfigError,
    FailurePolicy,
    KvMode,
)
from gate.config.terms import _got, _key_part, _show, _suggest, _toml_key_of
from gate.core.adaptive import MAX_SAMPLES

#: sun_path holds 108 bytes on Linux, the last one a NUL
MAX_SOCKET_PATH = 107
#: the most waiters one class may queue: each holds its client's connection open (a file
#: descriptor), and a Linux process may have at most fs.nr_open of them (1,048,576, the kernel's
#: default, read on this host's /proc/sys/fs/nr_open); deeper is a typo (a trial's 1e20 passed)
MAX_QUEUE_DEPTH = 1_048_576
DAY_S = 86_400  # a time threshold longer than a day is a typo (1e308 passed, and overflowed)


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

    def duration(self, key: str, value: float | None, unit: str, *, zero: str = "") -> None:
        """A time in `unit` ("ms" or "s"): positive (or zero, when `zero` says what it means),
        at most a day. 1e308 passed `config check`, and `tokengate replay` then stopped at
        `OverflowError: cannot convert float infinity to integer` (the prefill cap from it)."""
        most = DAY_S * (1000 if unit == "ms" else 1)
        low = (lambda v: v >= 0) if zero else (lambda v: v > 0)
        what = f"{zero} or more" if zero else "more than 0"
        self.check(key, value, lambda v: low(v) and v <= most, f"{what}, at most a day ({most:,} {unit})")


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
        elif t.startswith(("str", "Literal", "KvMode", "BudgetMode", "FailurePolicy")):
            if not isinstance(v, str):
                raise ConfigError(source, key, f"must be a string, got {_got(v)}")


#: in place of a value that may be a secret: these messages reach the log and, on a refused
#: reload, the journal's audit row
NOT_SHOWN = "(the value is not shown: it may be the key itself)"


def _check_env_name(c: _Check, key: str, value: str | None) -> None:
    if value is not None and ENV_NAME_RE.fullmatch(value) is None:
        # A key pasted here instead of its variable's name is a common slip: never echo it.
        raise c.fail(key, f"must be an environment variable name (letters, digits, _; not starting with a digit) {NOT_SHOWN}")


def _url_for_messages(url: str) -> str:
    """`url` without what may be a secret (a user and password, a query, a fragment)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(not shown)"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    shown = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else netloc + parts.path
    return shown + ("?***" if parts.query or url.endswith("?") else "") + ("#***" if parts.fragment or url.endswith("#") else "")


def _check_url(c: _Check, key: str, url: str) -> None:
    def bad(problem: str) -> ConfigError:
        return c.fail(key, f"{problem}, got {_show(_url_for_messages(url))}")

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


def backend_endpoint(url: str) -> tuple[str, int] | None:
    """Where a backend URL connects, as written: (host, port), the host lower-case without a
    trailing dot (an IPv6 address in its short form, without brackets), the port the scheme's
    default when the URL names none. None when it does not parse (`_check_url` says why).
    Written forms only: `localhost` and `127.0.0.1` stay two (resolving them is
    gate/backend/sameserver.py's, at `serve` and `config check --backends`)."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    host = _norm_host(parts.hostname or "")
    if not host:
        return None
    return host, port or (443 if parts.scheme.lower() == "https" else 80)


def _norm_host(host: str) -> str:
    """A host as written, compared: lower-case, no brackets nor trailing dot, an IPv6 address in
    its short form ([0:0::1] is [::1])."""
    host = host.strip("[]").rstrip(".").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _reaches(listen_host: str, host: str) -> bool:
    """Does a connection to `host` reach a socket bound to `listen_host` (same port), as far as
    the written forms tell? The same host; an unspecified listen address (0.0.0.0, ::) is
    reached at its family's loopback and at `localhost`; `localhost` is both loopbacks."""
    lh = _norm_host(listen_host)
    if lh == host:
        return True
    bound, target = _address(lh), _address(host)
    if lh == "localhost":
        return target is not None and target.is_loopback
    if bound is None:
        return False
    if host == "localhost":
        return bound.is_loopback or bound.is_unspecified
    return bound.is_unspecified and target is not None and target.version == bound.version and (target.is_loopback or target.is_unspecified)


def _check_backend_places(s: str, config: Config) -> None:
    """No backend is the gate itself, and no two reach one llama-server (as written: the same
    host and port after normalising): its capacity would be counted twice. Two router-mode
    backends (each with a `models` list) may share a router: each model runs in a child process
    of its own, so each is capacity of its own; their lists may not overlap (a model name routes
    to one backend: checked with the models)."""
    seen: dict[tuple[str, int], int] = {}
    for i, be in enumerate(config.backends):
        place = backend_endpoint(be.url)
        if place is None:
            continue
        c = _Check(s, f"backends[{i}]")
        shown = _show(_url_for_messages(be.url))
        for listen_host, listen_port in config.gate.listen_addresses:
            if listen_port == place[1] and _reaches(listen_host, place[0]):
                listen = f"[{listen_host}]:{listen_port}" if ":" in listen_host else f"{listen_host}:{listen_port}"
                # a trial's gate talked to itself forever: "loading ... capacity not known yet"
                raise c.fail(
                    "url",
                    f"{shown} is the gate's own address ([gate] listen {_show(listen)}): the gate would forward each "
                    "request to itself, round and round, and never learn llama-server's capacity; point it at llama-server",
                )
        k = seen.get(place)
        if k is not None:
            other = config.backends[k]
            if not (be.models and other.models):
                raise c.fail(
                    "url",
                    f"{shown} is the llama-server of backends[{k}] ({other.name}, {_show(_url_for_messages(other.url))}) "
                    f"too: backends {_show(other.name)} and {_show(be.name)} would count its capacity twice, so the gate "
                    "would admit up to twice what its KV cache holds; give each backend a llama-server of its own (only "
                    "router-mode backends may share one: each with a `models` list, no model in both)",
                )
        else:
            seen[place] = i


def _check_redis_url(c: _Check, key: str, url: str) -> None:
    if not url:
        return  # off

    def bad(problem: str) -> ConfigError:
        # The URL may hold a password: name the problem, never echo the value.
        return c.fail(key, f"{problem} (the value is not shown: it may hold a password)")

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise bad(f"is not a valid URL ({e})") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise bad('must be "redis://host[:port][/db]", "rediss://..." (TLS) or "unix:///path/to.sock"')
    if parts.scheme == "unix":
        if not parts.path:
            raise bad("a unix:// URL needs the socket's path, as in unix:///run/redis/redis.sock")
        return
    if not parts.hostname:
        raise bad("must name a host, as in redis://127.0.0.1:6379/0")
    if port == 0:
        raise bad("the port must be a number from 1 to 65535")
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise bad("the path must be a database number, as in redis://127.0.0.1:6379/0")


def _check_model_list(c: _Check, key: str, names: tuple[str, ...], known: tuple[str, ...], what: str) -> None:
    """Each of `names` is one of `known` (configured model names), listed once."""
    seen: set[str] = set()
    for j, name in enumerate(names):
        if name not in known:
            listed = ", ".join(known) if known else "none is configured"
            raise c.fail(f"{key}[{j}]", f"must be {what} ({listed}), got {_show(name)}{_suggest(name, known)}")
        if name in seen:
            raise c.fail(f"{key}[{j}]", f"{_show(name)} is listed twice")
        seen.add(name)


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
    seen_addresses = {(g.listen_host, g.listen_port)}
    for i, text in enumerate(g.listen_also, start=1):
        host, sep, port = text.rpartition(":")
        if not sep or not host.strip("[]") or any(ch.isspace() for ch in host) or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise c.fail(f"listen[{i}]", f'must be "host:port" (IPv6 as "[::1]:8081"), got {_show(text)}')
        if (host.strip("[]"), int(port)) in seen_addresses:
            raise c.fail(f"listen[{i}]", f"{_show(text)} is listed twice")
        seen_addresses.add((host.strip("[]"), int(port)))
    if g.unknown_routes not in ("forward", "refuse"):
        raise c.fail("unknown_routes", f'must be "forward" or "refuse", got {_show(g.unknown_routes)}')
    if not g.journal.strip():
        raise c.fail("journal", 'must be a file path (or ":memory:"), got an empty string')
    c.pos_int("max_body_bytes", g.max_body_bytes)
    c.pos_num("request_timeout_s", g.request_timeout_s)
    c.check(
        "shed_factor",
        g.shed_factor,
        lambda v: v > 1,
        "greater than 1 (a request is shed after shed_factor x what the current decode rate predicts)",
    )
    sock = g.control_socket_path()
    if sock is not None and len(sock.encode()) > MAX_SOCKET_PATH:
        raise c.fail(
            "control_socket",
            f"a Unix socket path must be at most {MAX_SOCKET_PATH} bytes, got {len(sock.encode())} "
            f"({_show(sock)}); set a shorter [gate] control_socket",
        )
    for key in ("shed_stall_s", "header_timeout_s", "body_timeout_s", "write_stall_s"):
        c.pos_num(key, getattr(g, key))
    c.check("stream_batch_ms", g.stream_batch_ms, lambda v: 0 <= v <= 1000, "0 (every token as it comes) to 1000 milliseconds")

    # [shared]
    sh = config.shared
    _check_types(s, "shared", sh)
    c = _Check(s, "shared")
    _check_redis_url(c, "redis_url", sh.redis_url)
    c.check(
        "key_prefix",
        sh.key_prefix,
        lambda v: 1 <= len(v) <= 64 and all("\x21" <= ch <= "\x7e" and ch not in "{}" for ch in v),
        "1 to 64 printable ASCII characters without spaces or braces",
    )
    c.check("failure_policy", sh.failure_policy, lambda v: v in get_args(FailurePolicy), '"fail_open" or "fail_closed"')
    c.check("renew_interval_s", sh.renew_interval_s, lambda v: 0.05 <= v <= 60, "from 0.05 to 60 seconds")
    c.check(
        "wait_ms",
        sh.wait_ms,
        lambda v: 0 < v <= sh.renew_interval_s * 1000,
        f"more than 0 and at most renew_interval_s ({sh.renew_interval_s:g} s) in milliseconds",
    )

    # [budget]
    b = config.budget
    _check_types(s, "budget", b)
    c = _Check(s, "budget")
    c.check("mode", b.mode, lambda v: v in get_args(BudgetMode), '"adaptive" or "static"')
    c.check("min_tokens", b.min_tokens, lambda v: v >= 0, "0 (auto) or a positive integer")
    c.duration("slo_ttft_p95_ms", b.slo_ttft_p95_ms, "ms")
    c.duration("slo_tpot_p95_ms", b.slo_tpot_p95_ms, "ms")
    c.duration("window_s", b.window_s, "s")
    c.duration("aging_s", b.aging_s, "s", zero="zero (off)")
    c.duration("cooldown_s", b.cooldown_s, "s", zero="zero")
    # bounded above: 1e308 passed, and the controller's next opening step overflowed
    c.check("increase", b.increase, lambda v: 1 < v <= 10, "greater than 1, at most 10 (the factor that opens the budget)")
    c.check(
        "decrease",
        b.decrease,
        lambda v: 0 < v < 1,
        "between 0 and 1, exclusive (the factor that closes the budget)",
    )
    # more than the controller's window keeps (ControllerSettings refuses it): accepted here, a
    # file passed `config check` and left its backend down for good ("ValueError: max_samples
    # (10000) must be >= min_samples"), and such a retune was half applied
    c.check(
        "min_samples",
        b.min_samples,
        lambda v: 0 < v <= MAX_SAMPLES,
        f"a positive integer, at most {MAX_SAMPLES} (the samples the controller keeps)",
    )

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
        c.check("kv", be.kv, lambda v: v in get_args(KvMode), '"auto", "unified" or "split"')
        for j, model in enumerate(be.models):
            mkey = f"models[{j}]"
            if not model.strip():
                raise c.fail(mkey, "must be a model name, got an empty string")
            if model in model_owner:
                k = model_owner[model]
                where = f"backends[{k}] ({config.backends[k].name})" if k != i else "this backend"
                raise c.fail(
                    mkey,
                    f"model {_show(model)} is already routed to {where}; a model name may be routed to one backend only",
                )
            model_owner[model] = i
        c.pos_int("token_budget", be.token_budget)
        if be.token_budget is not None and b.min_tokens and be.token_budget < b.min_tokens:
            raise c.fail(
                "token_budget",
                f"must be at least budget.min_tokens ({b.min_tokens}), got {be.token_budget}",
            )
        c.check("max_prefill_tokens", be.max_prefill_tokens, lambda v: v is None or v >= 0, "zero (no cap) or a positive integer")
        c.check("prefill_yield_tokens", be.prefill_yield_tokens, lambda v: v >= 0, "zero (never yield) or a positive integer")
        _check_env_name(c, "api_key_env", be.api_key_env)
        _check_model_list(c, "pin", be.pin, be.models, "this backend's models")
        c.check("cold_start_s", be.cold_start_s, lambda v: v >= 0, "zero or more seconds")

    _check_backend_places(s, config)

    # [classes.NAME]
    if not config.classes:
        raise ConfigError(s, "classes", "at least one class is required")
    seen_classes: set[str] = set()
    for cl in config.classes:
        path = f"classes.{_key_part(cl.name)}" if isinstance(cl.name, str) else "classes"
        _check_types(s, path, cl)
        c = _Check(s, path)
        if not CLASS_NAME_RE.fullmatch(cl.name):
            raise ConfigError(s, path, f"class names may use only a-z 0-9 _ -, got {_show(cl.name)}")
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
        c.check(
            "queue_depth",
            cl.queue_depth,
            lambda v: v <= MAX_QUEUE_DEPTH,
            f"at most {MAX_QUEUE_DEPTH:,} (each waiter holds its client's connection, an open file, and a Linux "
            f"process may have at most {MAX_QUEUE_DEPTH:,}: fs.nr_open)",
        )
        c.duration("queue_timeout_s", cl.queue_timeout_s, "s")
        c.duration("ttft_objective_ms", cl.ttft_objective_ms, "ms")
        c.pos_int("default_max_tokens", cl.default_max_tokens)
        c.pos_int("max_tokens_cap", cl.max_tokens_cap)
        if cl.default_max_tokens > cl.max_tokens_cap:
            raise c.fail(
                "default_max_tokens",
                f"must be at most max_tokens_cap ({cl.max_tokens_cap}), got {cl.default_max_tokens}",
            )
        _check_model_list(c, "fallback", cl.fallback, tuple(model_owner), "a model of [[backends]] models")
    reserved = [(cl.name, cl.reserved_tokens) for cl in config.classes if cl.reserved_tokens]
    total_reserved = sum(n for _, n in reserved)
    if b.min_tokens and total_reserved > b.min_tokens:
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
                    f"must be 64 lowercase hex characters (sha256 of the key, e.g. from `printf %s KEY | sha256sum`) {NOT_SHOWN}",
                )
            if t.api_key_sha256 in sha_owner:
                k = sha_owner[t.api_key_sha256]
                raise c.fail(
                    "api_key_sha256",
                    f"the same key hash is already used by tenants[{k}] ({config.tenants[k].name}); each tenant needs its own key",
                )
            sha_owner[t.api_key_sha256] = i
        if t.api_key_env is not None:
            _check_env_name(c, "api_key_env", t.api_key_env)
            if t.api_key_env in env_owner:
                k = env_owner[t.api_key_env]
                raise c.fail(
                    "api_key_env",
                    f"{_show(t.api_key_env)} is already the key of tenants[{k}] ({config.tenants[k].name}); each tenant needs its own key",
                )
            env_owner[t.api_key_env] = i
        if not isinstance(t.operator, bool):
            raise c.fail("operator", f"must be true or false, got {_got(t.operator)}")

        if t.class_name is not None and t.class_name not in seen_classes:
            raise c.fail(
                "class",
                f"must name a class ({', '.join(class_names)}), got {_show(t.class_name)}{_suggest(t.class_name, class_names)}",
            )
        seen_allowed: set[str] = set()
        for j, name in enumerate(t.allowed_classes):
            key = f"allowed_classes[{j}]"
            if name not in seen_classes:
                raise c.fail(
                    key,
                    f"must name a class ({', '.join(class_names)}), got {_show(name)}{_suggest(name, class_names)}",
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
        _check_model_list(c, "fallback", t.fallback, tuple(model_owner), "a model of [[backends]] models")

    # [[fleet]]: other gates' control sockets, for the fleet console
    fleet_names: dict[str, int] = {}
    sockets: dict[str, int] = {}
    for i, f in enumerate(config.fleet):
        path = f"fleet[{i}]"
        _check_types(s, path, f)
        c = _Check(s, path)
        if f.name:
            c.unique_name(f.name, i, fleet_names, "fleet gate")
        if not f.socket.strip():
            raise c.fail("socket", "must be the path of a gate's control socket, got an empty string")
        if len(f.socket.encode()) > MAX_SOCKET_PATH:
            raise c.fail("socket", f"a Unix socket path must be at most {MAX_SOCKET_PATH} bytes, got {len(f.socket.encode())}")
        if f.socket in sockets:
            raise c.fail("socket", f"{_show(f.socket)} is already fleet[{sockets[f.socket]}]'s socket")
        sockets[f.socket] = i


# ---- warnings: accepted, said (`config check`, `serve` at start, replay's proposals) ----------

#: a TTFT objective below this is one no first token meets (llama-server's own HTTP hop and one
#: decode step already take milliseconds): a typo of seconds for milliseconds, most likely
OBJECTIVE_FLOOR_MS = 50.0


def objective_warnings(config: Config) -> list[str]:
    """TTFT objectives no first token can meet: each class's own, or [budget] slo_ttft_p95_ms
    for those without one. Accepted (a warning, not an error): the gate then refuses every
    request that would wait, and serves late the ones that fit at once."""
    out = []
    for c in config.classes:
        objective = config.objective_ms(c.name) or 0.0
        key = f"classes.{c.name}.ttft_objective_ms" if c.ttft_objective_ms else "budget.slo_ttft_p95_ms"
        if objective < OBJECTIVE_FLOOR_MS:
            out.append(
                f"{key} = {objective:g} ms, the time-to-first-token objective of class {c.name!r}: no first token comes "
                f"that soon, so every {c.name} request that would wait is refused at once, and those that start at once "
                "miss it (milliseconds, not seconds?)"
            )
    return out


def limit_warnings(config: Config) -> list[str]:
    """A class whose limit_tokens is not above its default_max_tokens: a request of it without
    max_tokens holds its prompt and default_max_tokens, more than the class may ever hold, and
    is refused (400). A warning, not an error: requests that send a small max_tokens still run
    (the overload tests' interactive class, limit 400 beside the default 512, is such a class)."""
    return [
        f"classes.{c.name}.limit_tokens = {c.limit_tokens} is not above its default_max_tokens {c.default_max_tokens}: "
        f"a request of class {c.name!r} without max_tokens holds its prompt and {c.default_max_tokens} tokens, more than the "
        "class may ever hold, so it is refused (400 context_length_exceeded); only requests that send a smaller "
        "max_tokens run. Raise limit_tokens or lower default_max_tokens"
        for c in config.classes
        if c.limit_tokens is not None and c.limit_tokens <= c.default_max_tokens
    ]
