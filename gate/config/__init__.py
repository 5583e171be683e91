"""tokengate configuration: TOML -> frozen, validated dataclasses.

Every key is optional; a missing file section gets the defaults below. Validation is strict:
unknown keys, wrong types and out-of-range values are refused with a :class:`ConfigError` that
names the source, the dotted key path and the problem, e.g.::

    tokengate.toml: classes.batch.queue_depth: must be a positive integer, got -3

Two layers do the work. ``config_from_dict`` turns the TOML document into dataclasses, checking
structure and types only; ``validate_config`` then checks every value and every cross-field rule
on the dataclasses themselves, so code that builds a changed ``Config`` (a retune, a reload) can
run the same checks and get the same messages.

This package is pure: it reads no environment variables and opens no sockets. Whether the
``api_key_env`` variables exist is checked by whoever starts the gate, not here, so that
``tokengate config check`` gives the same answer on any machine.

The data flow, TOML text -> reader -> schema dataclasses -> checks, one module each:

- ``schema``: the frozen dataclasses, their defaults, the name rules and ``ConfigError``.
- ``reader``: ``load_config`` / ``parse_config`` / ``config_from_dict``, TOML into the
  dataclasses (structure and types), ending with ``validate_config``.
- ``checks``: ``validate_config``, values and cross-field rules on any ``Config``.
- ``terms``: how both write keys and values in error messages, as the user wrote them in TOML.
- ``example``: ``EXAMPLE_CONFIG``, the annotated example (`tokengate config example`).

May know: the standard library and `gate.core`; nothing that runs (no I/O beyond reading
the file it is given).

Import from ``gate.config``; the submodules are its layout, not its interface.
"""

from __future__ import annotations

import hashlib

from gate.config.checks import _url_for_messages as url_for_messages
from gate.config.checks import backend_endpoint, validate_config
from gate.config.example import EXAMPLE_CONFIG
from gate.config.reader import config_from_dict, load_config, parse_config
from gate.config.schema import (
    CLASS_NAME_RE,
    DEFAULT_CLASS_NAME,
    DEFAULT_CLASSES,
    ENV_NAME_RE,
    NAME_RE,
    SHA256_RE,
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

__all__ = [
    "backend_endpoint",
    "config_digest",
    "BackendConfig",
    "BudgetConfig",
    "ClassConfig",
    "Config",
    "ConfigError",
    "DEFAULT_CLASSES",
    "EXAMPLE_CONFIG",
    "FleetGateConfig",
    "GateConfig",
    "KvMode",
    "BudgetMode",
    "FailurePolicy",
    "SharedConfig",
    "TenantConfig",
    "config_from_dict",
    "load_config",
    "parse_config",
    "url_for_messages",
    "validate_config",
    # The name rules and the fallback class name: public names of the module before the split.
    "CLASS_NAME_RE",
    "DEFAULT_CLASS_NAME",
    "ENV_NAME_RE",
    "NAME_RE",
    "SHA256_RE",
]


def config_digest(config: Config) -> str:
    """A short digest of the effective config (frozen dataclasses have a stable repr)."""
    return "sha256:" + hashlib.sha256(repr(config).encode()).hexdigest()[:16]
