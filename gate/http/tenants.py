"""Who is calling, and which class their request runs in.

Pure: no I/O. The environment is read once, by :meth:`TenantDirectory.from_config`, from a
mapping the caller passes in (``os.environ`` in the service, a dict in tests).

Two modes (DESIGN.md "Outside contracts", Config):

* **Tenants configured**: every request needs ``Authorization: Bearer <key>`` or ``X-Api-Key: <key>``
  (the Anthropic SDK's header; each sent at most once, and when both are sent they must agree). The sha256 of the
  key is compared in constant time (``hmac.compare_digest``) against EVERY tenant's digest, with
  no early exit, so response timing reveals neither whether nor where a key matched. A missing,
  malformed or unknown key is 401 ``invalid_api_key``; the message never echoes the key.
* **Open** (no tenants): the tenant is the request body's ``user`` field when it is a non-empty
  string (cut to 64 characters, control characters as ``?``), else the client's address, else
  ``"anonymous"``. When a backend has a key (``[[backends]] api_key_env``: its ``--api-key``),
  a request must present that key, as llama-server itself would ask (401 ``invalid_api_key``
  otherwise; any configured backend's key is accepted): the gate sends the key upstream for
  its own calls and the clients' alike, so without this check a key-protected llama-server
  behind an open gate answered anyone (a trial).

The class is the ``X-Tokengate-Class`` header when present, else the tenant's ``class``, else
``default_class``. A class that does not exist is 400 ``invalid_request`` (param
``X-Tokengate-Class``); a tenant may use only its own class and its ``allowed_classes``, anything
else is 403 ``class_not_allowed``. Authentication is checked before the class.

API keys, whether presented or read from the environment, must be printable ASCII without
spaces (RFC 6750 tokens are narrower still); anything else can never match and is refused as
malformed.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gate.config import Config, ConfigError, TenantConfig
from gate.core.admission import TenantPolicy
from gate.core.errors import GateError
from gate.core.ratelimit import TenantLimits
from gate.core.reasons import Reason

__all__ = ["API_KEY_HEADER", "CLASS_HEADER", "Caller", "TenantDirectory", "header_value"]

CLASS_HEADER = "X-Tokengate-Class"
API_KEY_HEADER = "X-Api-Key"  # the Anthropic SDK's credential header, accepted like Authorization
USER_MAX_CHARS = 64
ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True)
class Caller:
    """The identified caller: tenant name, the class the request runs in, and the tenant's
    config (None in open mode)."""

    tenant: str
    cls: str
    tenant_config: TenantConfig | None


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header ``name``, looked up case-insensitively in any mapping.

    A header sent more than once is ambiguous (proxies and parsers differ on which copy wins)
    and raises :class:`ValueError`, whatever the values; the caller maps it to its own error.
    Starlette's ``Headers`` yields every raw pair from ``items()``, so repeats are seen.
    """
    want = name.lower()
    found: str | None = None
    for key, value in headers.items():
        if key.lower() == want:
            if found is not None:
                raise ValueError(f"the {name} header is sent more than once; send it once")
            found = value
    return found


def _is_key_text(key: str) -> bool:
    return bool(key) and all("\x21" <= ch <= "\x7e" for ch in key)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("ascii")).digest()


def _presented_key(headers: Mapping[str, str]) -> str:
    """The key from ``Authorization: Bearer`` or ``X-Api-Key`` (Anthropic's header); 401 when
    missing, malformed, sent twice, or sent in both with different values."""
    try:
        auth = header_value(headers, "Authorization")
    except ValueError:
        raise GateError(Reason.INVALID_API_KEY, "more than one Authorization header was sent") from None
    try:
        x_api_key = header_value(headers, API_KEY_HEADER)
    except ValueError:
        raise GateError(Reason.INVALID_API_KEY, f"more than one {API_KEY_HEADER} header was sent") from None
    if auth is None and x_api_key is None:
        raise GateError(
            Reason.INVALID_API_KEY,
            f"missing API key: send it as 'Authorization: Bearer <key>' (or {API_KEY_HEADER}: <key>)",
        )
    bearer: str | None = None
    if auth is not None:
        parts = auth.strip().split(None, 1)
        if len(parts) != 2 or parts[0].lower() != "bearer":
            raise GateError(Reason.INVALID_API_KEY, "malformed Authorization header: expected 'Bearer <key>'")
        bearer = parts[1].strip()
        if not _is_key_text(bearer):
            raise GateError(
                Reason.INVALID_API_KEY,
                "malformed API key: expected printable ASCII without spaces after 'Bearer '",
            )
    if x_api_key is not None:
        x_api_key = x_api_key.strip()
        if not _is_key_text(x_api_key):
            raise GateError(Reason.INVALID_API_KEY, f"malformed API key in {API_KEY_HEADER}: expected printable ASCII without spaces")
        if bearer is not None and not hmac.compare_digest(bearer.encode(), x_api_key.encode()):
            raise GateError(Reason.INVALID_API_KEY, f"Authorization and {API_KEY_HEADER} carry different keys; send one")
    key = bearer if bearer is not None else x_api_key
    assert key is not None
    return key


class TenantDirectory:
    """The tenants and their key digests; answers :meth:`identify` for each request."""

    __slots__ = ("_config", "_class_names", "_entries", "_backend_keys")

    def __init__(self, config: Config, entries: tuple[tuple[bytes, TenantConfig], ...], backend_keys: tuple[bytes, ...] = ()) -> None:
        self._config = config
        self._class_names = frozenset(config.class_names)
        self._entries = entries
        #: open mode: the digests of the backends' own keys, one of which a request must present
        self._backend_keys = () if entries else backend_keys

    @classmethod
    def from_config(cls, config: Config, environ: Mapping[str, str], *, source: str = "environment") -> TenantDirectory:
        """Build the directory; ``api_key_env`` keys are read from ``environ`` and hashed here,
        once. A variable that is unset, empty or not a usable key raises :class:`ConfigError`
        (key ``tenants[i].api_key_env``) naming the tenant and the variable, never the value.
        """
        entries: list[tuple[bytes, TenantConfig]] = []
        for i, t in enumerate(config.tenants):
            if t.api_key_env is not None:
                key = f"tenants[{i}].api_key_env"
                what = f"environment variable {t.api_key_env} (tenant {t.name!r}'s API key)"
                value = environ.get(t.api_key_env)
                if value is None:
                    raise ConfigError(source, key, f"{what} is not set")
                if value == "":
                    raise ConfigError(source, key, f"{what} is empty")
                if not _is_key_text(value):
                    raise ConfigError(
                        source,
                        key,
                        f"{what} must be printable ASCII without spaces (check for a trailing newline)",
                    )
                entries.append((_digest(value), t))
            elif t.api_key_sha256 is not None:
                entries.append((bytes.fromhex(t.api_key_sha256), t))
            else:  # validate_config forbids this; keep the directory safe if it is bypassed
                raise ConfigError(source, f"tenants[{i}]", "needs api_key_sha256 or api_key_env")
        # a backend's variable unset or unusable: the backend refuses the gate's own calls, and
        # the pool says so (that key is no client's either)
        backend_keys = {
            _digest(value)
            for b in config.backends
            if b.api_key_env and (value := environ.get(b.api_key_env)) is not None and _is_key_text(value)
        }
        return cls(config, tuple(entries), tuple(sorted(backend_keys)))

    @property
    def open(self) -> bool:
        """True when no tenants are configured: tenant from ``user``/address, every caller an
        operator; a request still presents the backends' key when they have one (:attr:`keyed`)."""
        return not self._entries

    @property
    def keyed(self) -> bool:
        """Open mode in front of a backend with a key: a request must present one of the
        backends' keys (:meth:`check_key`), as it would to llama-server straight."""
        return bool(self._backend_keys)

    def check_key(self, headers: Mapping[str, str]) -> None:
        """Open mode with backend keys: 401 unless the request presents one of them (compared in
        constant time, every one, as tenants' keys are). Otherwise nothing: tenants are
        authenticated by :meth:`identify`, an open gate before a keyless backend asks nothing."""
        if not self._backend_keys:
            return
        presented = _digest(_presented_key(headers))
        found = False
        for digest in self._backend_keys:
            found |= hmac.compare_digest(presented, digest)
        if not found:
            raise GateError(Reason.INVALID_API_KEY, "invalid API key")

    def __len__(self) -> int:
        return len(self._entries)

    def is_operator(self, caller: Caller | None) -> bool:
        """May `caller` use the operator routes: every caller of an open gate, else a tenant
        with ``operator = true``."""
        return self.open or (caller is not None and caller.tenant_config is not None and caller.tenant_config.operator)

    def identify(self, headers: Mapping[str, str], client_host: str | None, body_user: str | None, *, key_checked: bool = False) -> Caller:
        """Who is calling and in which class; raises :class:`GateError` (401, 400 or 403).

        ``body_user`` is the request's ``user`` field, used only in open mode. ``key_checked``:
        open mode's :meth:`check_key` already passed for these headers (before the body was read).
        """
        if self.open:
            if not key_checked:
                self.check_key(headers)
            if isinstance(body_user, str) and body_user.strip():
                # Shown in the console, the log and the journal: no control characters
                # (escape sequences) from a client.
                tenant = "".join(ch if ch.isprintable() else "?" for ch in body_user[:USER_MAX_CHARS])
            elif client_host:
                tenant = client_host
            else:
                tenant = ANONYMOUS
            cls_name = self._class_from_header(headers, None)
            return Caller(tenant=tenant, cls=cls_name, tenant_config=None)

        tenant_config = self._authenticate(headers)
        cls_name = self._class_from_header(headers, tenant_config)
        return Caller(tenant=tenant_config.name, cls=cls_name, tenant_config=tenant_config)

    # -- internals ----------------------------------------------------------------------------

    def _authenticate(self, headers: Mapping[str, str]) -> TenantConfig:
        key = _presented_key(headers)
        presented = _digest(key)
        match: TenantConfig | None = None
        for digest, tenant in self._entries:
            # Every digest is compared, even after a match: no early exit.
            if hmac.compare_digest(presented, digest):
                match = tenant
        if match is None:
            raise GateError(Reason.INVALID_API_KEY, "invalid API key")
        return match

    def _class_from_header(self, headers: Mapping[str, str], tenant: TenantConfig | None) -> str:
        try:
            asked = header_value(headers, CLASS_HEADER)
        except ValueError as e:
            raise GateError(Reason.INVALID_REQUEST, str(e), CLASS_HEADER) from None
        known = self._config.class_names
        if asked is not None:
            name = asked.strip()
            if name not in self._class_names:
                shown = name if len(name) <= 64 else name[:64] + "..."
                raise GateError(
                    Reason.INVALID_REQUEST,
                    f"unknown class {shown!r} in {CLASS_HEADER}; classes: {', '.join(known)}",
                    CLASS_HEADER,
                )
        elif tenant is not None and tenant.class_name is not None:
            return tenant.class_name
        else:
            return self._config.default_class

        if tenant is not None:
            own = tenant.class_name if tenant.class_name is not None else self._config.default_class
            if name != own and name not in tenant.allowed_classes:
                allowed = [own] + [c for c in tenant.allowed_classes if c != own]
                raise GateError(
                    Reason.CLASS_NOT_ALLOWED,
                    f"tenant {tenant.name!r} may not use class {name!r}; allowed: {', '.join(allowed)}",
                    CLASS_HEADER,
                )
        return name


class TenantQuotas:
    """Each tenant's limits as this gate enforces them: its rate limits and its admission policy
    (weight, tokens in flight), each limit passed through `share` (whole, or this gate's 1/N of
    a fleet-wide limit under [shared] fail_open)."""

    def __init__(self, config: Config, share: Callable[[int | None], int | None]) -> None:
        self._tenants = {t.name: t for t in config.tenants}
        self._share = share

    def limits(self, name: str) -> TenantLimits:
        t = self._tenants.get(name)
        if t is None:
            return TenantLimits(None, None)
        return TenantLimits(self._share(t.requests_per_minute), self._share(t.tokens_per_minute))

    def policy(self, name: str) -> TenantPolicy:
        t = self._tenants.get(name)
        return TenantPolicy() if t is None else TenantPolicy(t.weight, self._share(t.max_tokens_in_flight))
