"""The thresholds in force, as the journal keeps them (for ``tokengate replay``).

At start and after each reload the gate writes one audit row ``config_in_force`` whose
``new_value`` is :func:`thresholds_json` of its effective config: everything admission reads
(``[budget]``, the classes, each backend's budget and prefill limits, each tenant's class,
weight and quota) in the TOML file's own shape, and nothing else: no API key, no hash of one,
no address. :func:`config_from_thresholds` reads it back into a validated :class:`Config`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gate.config.reader import config_from_dict
from gate.config.schema import Config

#: the audit row's action (target "gate"; note: the config digest)
CONFIG_IN_FORCE = "config_in_force"

_BACKEND_KEYS = ("name", "kv", "token_budget", "max_prefill_tokens", "prefill_yield_tokens")
_TENANT_KEYS = ("name", "class_name", "allowed_classes", "weight", "max_tokens_in_flight")


def _plain(obj: Any, keys: tuple[str, ...] | None = None, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if (keys is not None and f.name not in keys) or f.name in skip:
            continue
        value = getattr(obj, f.name)
        if value is None:
            continue  # TOML has no null: an absent key is the default
        out["class" if f.name == "class_name" else f.name] = list(value) if isinstance(value, tuple) else value
    return out


def thresholds_of(config: Config) -> dict[str, Any]:
    """The admission-relevant part of `config`, TOML-shaped (``config_from_dict`` reads it)."""
    return {
        "default_class": config.default_class,
        "budget": _plain(config.budget),
        "classes": {c.name: _plain(c, skip=("name", "fallback")) for c in config.classes},
        "backends": [_plain(b, _BACKEND_KEYS) for b in config.backends],
        "tenants": [_plain(t, _TENANT_KEYS) for t in config.tenants],
    }


def thresholds_json(config: Config) -> str:
    return json.dumps(thresholds_of(config), sort_keys=True, separators=(",", ":"))


def without_credentials(data: dict[str, Any]) -> dict[str, Any]:
    """The row's TOML-shaped dict made readable as a file: no empty tenants list, and each
    tenant a key nobody holds (a trial's journal of a gate with tenants failed to replay:
    "tenants[0]: a tenant needs exactly one of api_key_sha256 or api_key_env")."""
    if not data.get("tenants"):
        data.pop("tenants", None)
    for i, tenant in enumerate(data.get("tenants", ())):
        if isinstance(tenant, dict) and "api_key_env" not in tenant:
            # one each (the rules want them apart); no key is known to hash to these, and a
            # replay authenticates nobody
            tenant.setdefault("api_key_sha256", f"{i:064x}")
    return data


def config_from_thresholds(text: str, source: str = "<config_in_force>") -> Config:
    """A ``config_in_force`` row's value back into a Config (ConfigError when it does not parse)."""
    return config_from_dict(without_credentials(json.loads(text)), source)
