"""Backends that reach one llama-server, or the gate itself, found by resolving their hosts.

`validate_config` compares backend URLs as written (the same host and port once normalised)
and opens no socket, so that `tokengate config check` answers alike on every machine. Here the
names are resolved (getaddrinfo): `localhost` and `127.0.0.1` are then one address, and a
backend whose host resolves to where the gate itself listens is the gate. `tokengate serve`
runs it before it starts and `tokengate config check --backends` before it asks the backends;
each refuses what it finds with a ConfigError (exit 2) naming both backends.

What resolving cannot tell (one llama-server on 0.0.0.0 reached as 127.0.0.1 and as ::1, or at
the host's own LAN address) the process can: `same_process` pairs the backends whose local
llama-server is the same pid (gate/backend/layout.py reads it from /proc).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from gate.backend.layout import ServerArgs
from gate.config import BackendConfig, Config, ConfigError, backend_endpoint, url_for_messages

#: The longest wait for names to resolve, all of them together. A name the resolver does not
#: answer for in time is left to the probes (it is said down, or found, as before): the gate
#: starts late by this much at most. Measured on the development host (no DNS server): localhost
#: 2.4 ms (the first lookup, /etc/hosts), an unknown name refused in 0.6-1.2 ms; literal
#: addresses are not looked up.
RESOLVE_TIMEOUT_S = 2.0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[Iterable[str]], Mapping[str, frozenset[Address]]]


def _connects_to(address: Address) -> Address:
    """Where a connection to `address` lands: an unspecified address (0.0.0.0, ::) is its
    family's loopback (Linux connects there), anything else itself."""
    if address.is_unspecified:
        return ipaddress.ip_address("127.0.0.1" if address.version == 4 else "::1")
    return address


def resolve(hosts: Iterable[str], timeout_s: float = RESOLVE_TIMEOUT_S) -> dict[str, frozenset[Address]]:
    """Each host's addresses; a host that does not resolve within `timeout_s` (all together) is
    left out. Lookups run on daemon threads: one the resolver never answers cannot hold the
    process at exit."""
    found: dict[str, frozenset[Address]] = {}
    pending = []
    for host in set(hosts):
        try:
            found[host] = frozenset({ipaddress.ip_address(host)})
        except ValueError:
            pending.append(host)

    def lookup(host: str) -> None:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return
        addresses = set()
        for info in infos:
            try:
                addresses.add(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
            except ValueError:
                continue
        found[host] = frozenset(addresses)

    threads = [threading.Thread(target=lookup, args=(h,), name=f"tokengate-resolve-{h}", daemon=True) for h in pending]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return dict(found)


def _is_local(address: Address) -> bool:
    """Is `address` one of this host's (a socket may be bound to it)?"""
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((str(address), 0))
        return True
    except OSError:
        return False


def _shown(url: str) -> str:
    return f'"{url_for_messages(url)}"'  # what may be a secret (a password in it) left out


def check_places(config: Config, source: str, *, resolver: Resolver = resolve) -> None:
    """Raise ConfigError (naming the file, the key and both backends) when a backend's host
    resolves to where the gate listens, or two backends' hosts resolve to one address on the
    same port, router-mode backends with disjoint `models` excepted (see validate_config)."""
    places = [backend_endpoint(b.url) for b in config.backends]
    hosts = [p[0] for p in places if p is not None] + [h for h, _ in config.gate.listen_addresses]
    addresses = resolver(hosts)
    where: list[frozenset[Address] | None] = [
        None if p is None or p[0] not in addresses else frozenset(_connects_to(a) for a in addresses[p[0]]) for p in places
    ]
    for i, (b, place, reached) in enumerate(zip(config.backends, places, where, strict=True)):
        if place is None or not reached:
            continue
        for listen_host, listen_port in config.gate.listen_addresses:
            bound = addresses.get(listen_host, frozenset())
            if listen_port != place[1] or not bound:
                continue
            # the gate on 0.0.0.0 (or ::) listens at every address of this host of that family
            anywhere = {a.version for a in bound if a.is_unspecified}
            itself = sorted(str(a) for a in reached if a in bound or (a.version in anywhere and _is_local(a)))
            if itself:
                listen = f"[{listen_host}]:{listen_port}" if ":" in listen_host else f"{listen_host}:{listen_port}"
                raise ConfigError(
                    source,
                    f"backends[{i}].url",
                    f"{_shown(b.url)} resolves to {itself[0]} port {place[1]}, where the gate itself listens ([gate] listen "
                    f'"{listen}"): the gate would forward each request to itself, round and round, and never learn '
                    "llama-server's capacity; point it at llama-server",
                )
        for k in range(i):
            other, other_place, other_reached = config.backends[k], places[k], where[k]
            if other_place is None or not other_reached or other_place[1] != place[1] or (b.models and other.models):
                continue
            shared = sorted(str(a) for a in reached & other_reached)
            if shared:
                raise ConfigError(
                    source,
                    f"backends[{i}].url",
                    f"{_shown(b.url)} and backends[{k}].url {_shown(other.url)} resolve to the same address, {shared[0]} "
                    f'port {place[1]}: one llama-server, whose capacity backends "{other.name}" and "{b.name}" would '
                    "count twice, so the gate would admit up to twice what its KV cache holds; give each backend a "
                    "llama-server of its own (only router-mode backends may share one: each with a `models` list, no "
                    "model in both)",
                )


def same_process(
    backends: Iterable[BackendConfig], args_of: Mapping[str, ServerArgs | None], routers: Iterable[str] = ()
) -> list[tuple[BackendConfig, BackendConfig, ServerArgs]]:
    """Pairs of backends whose local llama-server is one process (`args_of`: each backend's
    name to what /proc says of the llama-server on its port, None where none is known), but
    for two router-mode backends (`routers`: their names) that each list their models."""
    routers = set(routers)
    out = []
    seen: dict[int, BackendConfig] = {}
    for b in backends:
        args = args_of.get(b.name)
        if args is None:
            continue
        first = seen.get(args.pid)
        if first is None:
            seen[args.pid] = b
        elif not (b.models and first.models and {b.name, first.name} <= routers):
            out.append((first, b, args))
    return out


def same_process_problem(first: BackendConfig, second: BackendConfig, args: ServerArgs) -> str:
    return (
        f'backends "{first.name}" ({url_for_messages(first.url)}) and "{second.name}" ({url_for_messages(second.url)}) reach the same llama-server, '
        f"{args.describe()}: its capacity is counted twice, so the gate admits up to twice what its KV cache "
        "holds; give each backend a llama-server of its own"
    )
