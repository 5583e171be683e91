"""Tests for gate/http/tenants.py: who is calling and which class they get."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from gate.config import ConfigError, parse_config
from gate.core.errors import GateError
from gate.core.reasons import Reason
from gate.http.tenants import Caller, TenantDirectory, header_value

KEY_A = "sk-team-a-0123456789"
KEY_B = "sk-batch-abcdef"
KEY_C = "sk-ops-zzz"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


OPEN_TOML = """
default_class = "interactive"
[classes.interactive]
priority = 10
[classes.batch]
priority = 1
"""

TENANTS_TOML = f"""
default_class = "interactive"
[classes.interactive]
priority = 10
[classes.batch]
priority = 1
[classes.bulk]
priority = 0

[[tenants]]
name = "team-a"
api_key_env = "KEY_TEAM_A"
allowed_classes = ["interactive", "batch"]

[[tenants]]
name = "nightly"
api_key_sha256 = "{sha(KEY_B)}"
class = "batch"

[[tenants]]
name = "ops"
api_key_sha256 = "{sha(KEY_C)}"
"""

ENV = {"KEY_TEAM_A": KEY_A}


@pytest.fixture
def open_dir() -> TenantDirectory:
    return TenantDirectory.from_config(parse_config(OPEN_TOML), {})


@pytest.fixture
def tenants() -> TenantDirectory:
    return TenantDirectory.from_config(parse_config(TENANTS_TOML), ENV)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def refused(fn, *args) -> GateError:
    with pytest.raises(GateError) as info:
        fn(*args)
    return info.value


# -- open mode ---------------------------------------------------------------------------------


def test_open_directory_without_tenants(open_dir: TenantDirectory) -> None:
    assert open_dir.open
    assert len(open_dir) == 0


def test_open_mode_tenant_is_the_user_field(open_dir: TenantDirectory) -> None:
    c = open_dir.identify({}, "10.0.0.7", "alice")
    assert c == Caller(tenant="alice", cls="interactive", tenant_config=None)


def test_open_mode_user_is_cut_to_64_characters(open_dir: TenantDirectory) -> None:
    assert open_dir.identify({}, "10.0.0.7", "u" * 200).tenant == "u" * 64


@pytest.mark.parametrize("user", [None, "", "   "])
def test_open_mode_falls_back_to_the_client_address(open_dir: TenantDirectory, user) -> None:
    assert open_dir.identify({}, "10.0.0.7", user).tenant == "10.0.0.7"


def test_open_mode_without_user_or_address_is_anonymous(open_dir: TenantDirectory) -> None:
    assert open_dir.identify({}, None, None).tenant == "anonymous"
    assert open_dir.identify({}, "", None).tenant == "anonymous"


def test_open_mode_class_from_header_any_case(open_dir: TenantDirectory) -> None:
    assert open_dir.identify({"x-tokengate-class": "batch"}, "h", None).cls == "batch"
    assert open_dir.identify({"X-TOKENGATE-CLASS": " batch "}, "h", None).cls == "batch"


def test_open_mode_ignores_authorization(open_dir: TenantDirectory) -> None:
    assert open_dir.identify(bearer("whatever"), "h", None).tenant == "h"


def test_open_mode_unknown_class_is_400_naming_the_header(open_dir: TenantDirectory) -> None:
    e = refused(open_dir.identify, {"X-Tokengate-Class": "vip"}, "h", None)
    assert e.reason is Reason.INVALID_REQUEST and e.status == 400
    assert e.param == "X-Tokengate-Class"
    assert "vip" in e.message and "interactive, batch" in e.message


def test_repeated_class_header_is_400_even_with_the_same_value(open_dir: TenantDirectory) -> None:
    for second in ("interactive", "batch"):
        e = refused(open_dir.identify, {"X-Tokengate-Class": "batch", "x-tokengate-class": second}, "h", None)
        assert e.reason is Reason.INVALID_REQUEST and e.param == "X-Tokengate-Class"


# -- bearer authentication ---------------------------------------------------------------------


def test_tenants_directory_is_not_open(tenants: TenantDirectory) -> None:
    assert not tenants.open
    assert len(tenants) == 3


def test_env_key_authenticates_and_takes_default_class(tenants: TenantDirectory) -> None:
    c = tenants.identify(bearer(KEY_A), "10.0.0.7", "mallory")
    assert c.tenant == "team-a"  # the body's user field does not matter with tenants
    assert c.cls == "interactive"
    assert c.tenant_config is not None and c.tenant_config.name == "team-a"


def test_sha256_key_authenticates_with_its_own_class(tenants: TenantDirectory) -> None:
    c = tenants.identify(bearer(KEY_B), None, None)
    assert (c.tenant, c.cls) == ("nightly", "batch")


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": f"bearer {KEY_C}"},
        {"AUTHORIZATION": f"BEARER   {KEY_C}  "},
        {"Authorization": f"Bearer\t{KEY_C}"},
    ],
)
def test_header_name_and_scheme_are_case_insensitive(tenants: TenantDirectory, headers) -> None:
    assert tenants.identify(headers, None, None).tenant == "ops"


@pytest.mark.parametrize(
    "headers",
    [{"X-Api-Key": KEY_B}, {"x-api-key": f"  {KEY_B} "}, {"X-Api-Key": KEY_B, "Authorization": f"Bearer {KEY_B}"}],
)
def test_x_api_key_authenticates_like_authorization(tenants: TenantDirectory, headers) -> None:
    assert tenants.identify(headers, "h", None).tenant == "nightly"


@pytest.mark.parametrize(
    "headers, fragment",
    [
        ({}, "missing API key"),
        ({"Authorization": ""}, "malformed"),
        ({"Authorization": "Bearer"}, "malformed"),
        ({"Authorization": "Bearer "}, "malformed"),
        ({"Authorization": KEY_A}, "malformed"),
        ({"Authorization": f"Basic {KEY_A}"}, "malformed"),
        ({"Authorization": f"Bearer {KEY_A} extra"}, "malformed"),
        ({"Authorization": "Bearer clé-non-ascii"}, "malformed"),
        ({"Authorization": "Bearer sk-wrong-key"}, "invalid API key"),
        ({"Authorization": f"Bearer {KEY_A}x"}, "invalid API key"),
        ({"Authorization": f"Bearer {sha(KEY_B)}"}, "invalid API key"),  # the digest is not the key
        ({"Authorization": f"Bearer {KEY_A}", "authorization": f"Bearer {KEY_B}"}, "more than one"),
        ({"X-Api-Key": KEY_A, "x-api-key": KEY_A}, "more than one X-Api-Key"),
        ({"X-Api-Key": "sk-wrong-key"}, "invalid API key"),
        ({"X-Api-Key": "clé-non-ascii"}, "malformed"),
        ({"X-Api-Key": ""}, "malformed"),
        ({"Authorization": f"Bearer {KEY_A}", "X-Api-Key": KEY_B}, "different keys"),
        ({"Authorization": f"Bearer {KEY_A}", "X-Api-Key": "sk-wrong-key"}, "different keys"),
        ({"Authorization": "Basic x", "X-Api-Key": KEY_A}, "malformed"),
    ],
)
def test_bad_or_unknown_keys_are_401(tenants: TenantDirectory, headers, fragment) -> None:
    e = refused(tenants.identify, headers, "h", "alice")
    assert e.reason is Reason.INVALID_API_KEY and e.status == 401
    assert fragment in e.message
    assert e.param is None
    for secret in (KEY_A, KEY_B, "sk-wrong-key", "clé-non-ascii"):
        assert secret not in e.message  # never echo the key


def test_every_tenant_digest_is_compared_in_constant_time(tenants: TenantDirectory, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    # a match on the first tenant still compares against all three
    assert tenants.identify(bearer(KEY_A), None, None).tenant == "team-a"
    assert len(calls) == 3
    assert all(a == hashlib.sha256(KEY_A.encode()).digest() for a, _ in calls)
    calls.clear()
    refused(tenants.identify, bearer("sk-nobody"), None, None)
    assert len(calls) == 3


# -- classes for tenants ------------------------------------------------------------------------


def test_tenant_may_choose_an_allowed_class(tenants: TenantDirectory) -> None:
    c = tenants.identify({**bearer(KEY_A), "X-Tokengate-Class": "batch"}, None, None)
    assert (c.tenant, c.cls) == ("team-a", "batch")


def test_tenant_may_name_its_own_class(tenants: TenantDirectory) -> None:
    c = tenants.identify({**bearer(KEY_B), "x-tokengate-class": "batch"}, None, None)
    assert c.cls == "batch"
    # ops has no class of its own: default_class is its own
    c = tenants.identify({**bearer(KEY_C), "x-tokengate-class": "interactive"}, None, None)
    assert c.cls == "interactive"


@pytest.mark.parametrize(
    "key, cls",
    [(KEY_A, "bulk"), (KEY_B, "interactive"), (KEY_C, "batch")],
)
def test_class_outside_allowed_classes_is_403(tenants: TenantDirectory, key, cls) -> None:
    e = refused(tenants.identify, {**bearer(key), "X-Tokengate-Class": cls}, None, None)
    assert e.reason is Reason.CLASS_NOT_ALLOWED and e.status == 403
    assert e.param == "X-Tokengate-Class"
    assert repr(cls) in e.message


def test_unknown_class_is_400_even_for_a_tenant(tenants: TenantDirectory) -> None:
    e = refused(tenants.identify, {**bearer(KEY_A), "X-Tokengate-Class": "nope"}, None, None)
    assert e.reason is Reason.INVALID_REQUEST and e.status == 400
    assert e.param == "X-Tokengate-Class"


def test_authentication_comes_before_the_class_check(tenants: TenantDirectory) -> None:
    e = refused(tenants.identify, {"X-Tokengate-Class": "nope"}, None, None)
    assert e.reason is Reason.INVALID_API_KEY


# -- environment keys ---------------------------------------------------------------------------


def test_env_key_is_read_once_at_build_time() -> None:
    env = dict(ENV)
    d = TenantDirectory.from_config(parse_config(TENANTS_TOML), env)
    env["KEY_TEAM_A"] = "sk-rotated"
    assert d.identify(bearer(KEY_A), None, None).tenant == "team-a"
    refused(d.identify, bearer("sk-rotated"), None, None)


@pytest.mark.parametrize(
    "env, problem",
    [
        ({}, "is not set"),
        ({"KEY_TEAM_A": ""}, "is empty"),
        ({"KEY_TEAM_A": "sk-key\n"}, "printable ASCII"),
        ({"KEY_TEAM_A": "two words"}, "printable ASCII"),
    ],
)
def test_missing_or_unusable_env_key_is_a_config_error(env, problem) -> None:
    with pytest.raises(ConfigError) as info:
        TenantDirectory.from_config(parse_config(TENANTS_TOML), env)
    e = info.value
    assert e.key == "tenants[0].api_key_env"
    assert "KEY_TEAM_A" in e.problem and "team-a" in e.problem and problem in e.problem
    assert "sk-key" not in str(e)


def test_config_error_source_can_be_named() -> None:
    with pytest.raises(ConfigError) as info:
        TenantDirectory.from_config(parse_config(TENANTS_TOML), {}, source="tokengate.toml")
    assert str(info.value).startswith("tokengate.toml: tenants[0].api_key_env: ")


# -- header lookup ------------------------------------------------------------------------------


def test_header_value_is_case_insensitive_on_any_mapping() -> None:
    assert header_value({"Content-Type": "x"}, "content-type") == "x"
    assert header_value({"content-type": "x"}, "Content-Type") == "x"
    assert header_value({}, "content-type") is None


def test_open_mode_tenant_from_user_has_no_control_characters(open_dir: TenantDirectory) -> None:
    assert open_dir.identify({}, "h", "bob\x1b[2J\x00").tenant == "bob?[2J?"


# -- open mode in front of a backend with a key ------------------------------------------------

KEYED_TOML = (
    OPEN_TOML
    + """
[[backends]]
name = "a"
url = "http://127.0.0.1:18080"
api_key_env = "UP_A"
[[backends]]
name = "b"
url = "http://127.0.0.1:18081"
api_key_env = "UP_B"
"""
)


def test_open_mode_before_a_keyed_backend_asks_for_one_of_its_keys() -> None:
    # the gate forwards every request with the backend's key: without this check a key-protected
    # llama-server behind an open gate answered anyone (a trial)
    d = TenantDirectory.from_config(parse_config(KEYED_TOML), {"UP_A": "key-a", "UP_B": "key-b"})
    assert d.open and d.keyed
    for headers in ({}, bearer("key-c"), {"X-Api-Key": "key-"}, bearer("key-a key-b"), {"Authorization": "key-a"}):
        err = refused(d.identify, headers, "10.0.0.7", "alice")
        assert err.reason is Reason.INVALID_API_KEY and "key-a" not in str(err), (headers, err)
        assert refused(d.check_key, headers).reason is Reason.INVALID_API_KEY
    # either backend's key, either header; the tenant is still open mode's
    assert d.identify(bearer("key-a"), "10.0.0.7", "alice") == Caller(tenant="alice", cls="interactive", tenant_config=None)
    assert d.identify({"X-Api-Key": "key-b"}, "10.0.0.7", None).tenant == "10.0.0.7"
    d.check_key(bearer("key-b"))


def test_backend_keys_ask_nothing_more_where_tenants_authenticate_or_no_key_is_set() -> None:
    tenants = TenantDirectory.from_config(parse_config(TENANTS_TOML + KEYED_TOML.replace(OPEN_TOML, "")), {**ENV, "UP_A": "key-a"})
    assert not tenants.keyed
    tenants.check_key({})  # tenants: identify authenticates the tenant's key, not the backend's
    assert tenants.identify(bearer(KEY_A), "h", None).tenant == "team-a"
    assert refused(tenants.identify, bearer("key-a"), "h", None).reason is Reason.INVALID_API_KEY
    unset = TenantDirectory.from_config(parse_config(KEYED_TOML), {})  # the pool says the backend refuses the gate
    assert unset.open and not unset.keyed
    assert unset.identify({}, "h", None).tenant == "h"
