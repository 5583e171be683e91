"""gate.config: TOML -> frozen dataclasses, strict validation with key-path errors."""

from __future__ import annotations

import dataclasses
import pickle
import re
import tomllib
from pathlib import Path

import pytest

from gate.config import (
    EXAMPLE_CONFIG,
    BackendConfig,
    BudgetConfig,
    ClassConfig,
    Config,
    ConfigError,
    FleetGateConfig,
    GateConfig,
    SharedConfig,
    TenantConfig,
    config_from_dict,
    load_config,
    parse_config,
    validate_config,
)

SHA_A = "a" * 64
SHA_B = "0123456789abcdef" * 4

_COMMENTED_KEY = re.compile(r"^# ((?:[a-z0-9_]+ = .*)|\[\[(?:tenants|fleet)\]\])$")


def uncommented_example() -> str:
    """EXAMPLE_CONFIG with every commented-out key (and tenant) switched on."""
    return "\n".join(_COMMENTED_KEY.sub(r"\1", line) for line in EXAMPLE_CONFIG.splitlines())


def error_of(text: str, source: str = "t.toml") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source)
    return info.value


# ---------------------------------------------------------------------------- defaults


def test_defaults_without_a_file() -> None:
    c = load_config(None)
    assert c == Config()
    assert c == parse_config("")
    assert (c.gate.listen_host, c.gate.listen_port) == ("127.0.0.1", 8081)
    assert c.gate.journal == "tokengate.db"
    assert c.gate.max_body_bytes == 8 * 1024 * 1024
    assert c.gate.request_timeout_s == 600.0
    assert c.gate.shed_factor == 2.5
    assert (c.gate.shed_stall_s, c.gate.header_timeout_s, c.gate.body_timeout_s, c.gate.write_stall_s) == (60, 10, 30, 30)
    assert c.gate.stream_batch_ms == 10  # streams batched after the first token unless set to 0
    assert c.backends == (BackendConfig(name="default", url="http://127.0.0.1:8080", kv="auto"),)
    assert c.budget == BudgetConfig(
        mode="adaptive",
        min_tokens=0,
        slo_ttft_p95_ms=2000.0,
        slo_tpot_p95_ms=None,
        window_s=30.0,
        cooldown_s=5.0,
        increase=1.1,
        decrease=0.8,
        min_samples=20,
    )
    assert c.classes == (
        ClassConfig("interactive", 10, 0, None, 64, 10.0, 256, 4096),
        ClassConfig("batch", 1, 0, None, 256, 120.0, 512, 4096),
    )
    assert c.default_class == "interactive"
    assert c.tenants == ()


def test_defaults_per_section_when_sections_are_partial() -> None:
    c = parse_config('[gate]\nshed_factor = 3\n[budget]\nmode = "static"\n')
    assert c.gate == GateConfig(shed_factor=3.0)
    assert isinstance(c.gate.shed_factor, float)
    assert c.budget == BudgetConfig(mode="static")
    assert c.classes == Config().classes


def test_defined_classes_replace_the_defaults_and_get_field_defaults() -> None:
    c = parse_config("[classes.bulk]\npriority = 3\n")
    assert c.classes == (ClassConfig(name="bulk", priority=3),)
    assert c.classes[0].queue_depth == 64 and c.classes[0].queue_timeout_s == 10.0
    # no "interactive" class and no default_class: the highest-priority class
    assert c.default_class == "bulk"


def test_classes_sorted_by_priority_highest_first() -> None:
    c = parse_config("[classes.low]\npriority = 1\n[classes.high]\npriority = 50\n[classes.mid]\npriority = 7\n")
    assert [x.name for x in c.classes] == ["high", "mid", "low"]
    assert c.default_class == "high"
    assert c.class_by_name("mid").priority == 7
    with pytest.raises(KeyError):
        c.class_by_name("nope")


def test_lookup_helpers() -> None:
    c = parse_config(
        '[[backends]]\nname = "a"\nurl = "http://10.0.0.1:8080"\n'
        '[[backends]]\nname = "b"\nurl = "https://gpu-2:443/"\nmodels = ["m1"]\nkv = "split"\n'
    )
    assert c.backend_by_name("b").kv == "split"
    assert c.backend_by_name("b").url == "https://gpu-2:443"  # trailing "/" dropped
    assert c.backend_by_name("a").models == ()
    with pytest.raises(KeyError):
        c.backend_by_name("default")


# ---------------------------------------------------------------------------- example


def test_example_parses_to_the_documented_values() -> None:
    c = parse_config(EXAMPLE_CONFIG, "example")
    assert c.gate == GateConfig()
    assert c.budget == BudgetConfig()
    assert c.backends == (BackendConfig(),)
    assert [x.name for x in c.classes] == ["interactive", "batch"]
    assert c.class_by_name("interactive").reserved_tokens == 1024
    assert c.class_by_name("batch").limit_tokens == 16384
    assert c.tenants == ()  # the tenant examples are commented out: the gate stays open
    assert c.default_class == "interactive"
    assert c.shared == SharedConfig() and not c.shared.enabled  # off: every gate on its own


def test_the_example_and_the_built_in_defaults_agree_and_give_the_controller_room() -> None:
    """#25: the example showed queue_timeout_s = 10.0 where its comment said 30 (a class one
    writes got 30 s queues), and min_tokens 2048 equalled a 2,048-token pool."""
    from gate.backend.pool import budget_floor

    c = parse_config(EXAMPLE_CONFIG, "example")
    written = parse_config("[classes.mine]\npriority = 5\n").classes[0]
    assert c.class_by_name("interactive").queue_timeout_s == written.queue_timeout_s == 10.0
    assert (
        "Default 10." in EXAMPLE_CONFIG
        and "Default 30." not in EXAMPLE_CONFIG.split("[classes.interactive]")[1].split("[classes.batch]")[0]
    )
    reserved = sum(x.reserved_tokens for x in c.classes)
    for ceiling in (2048, 4096, 65536):
        floor = budget_floor(c.budget, ceiling, reserved)
        assert reserved <= floor < ceiling, ceiling  # room to move, reservations kept
    assert budget_floor(BudgetConfig(min_tokens=1500), 4096) == 1500  # an operator's floor holds
    assert budget_floor(BudgetConfig(min_tokens=8192), 4096) == 4096


def test_example_with_every_commented_key_switched_on_is_valid_and_complete() -> None:
    c = parse_config(uncommented_example(), "example")
    be = c.backends[0]
    assert (be.token_budget, be.max_prefill_tokens, be.api_key_env) == (16384, 8192, "LLAMA_API_KEY")
    assert c.budget.slo_tpot_p95_ms == 100.0
    assert c.class_by_name("interactive").limit_tokens == 8192
    assert [t.name for t in c.tenants] == ["team-a", "nightly-batch"]
    a, b = c.tenants
    assert a == TenantConfig(
        name="team-a",
        api_key_env="TOKENGATE_KEY_TEAM_A",
        class_name="interactive",
        allowed_classes=("interactive", "batch"),
        weight=2.0,
        max_tokens_in_flight=8192,
        requests_per_minute=600,
        tokens_per_minute=200000,
    )
    assert b.api_key_sha256 is not None and b.class_name == "batch"


@pytest.mark.parametrize(
    ("section", "cls", "exclude"),
    [
        ("gate", GateConfig, {"listen_host", "listen_port", "listen_also"}),
        ("backends", BackendConfig, set()),
        ("budget", BudgetConfig, set()),
        ("classes", ClassConfig, {"name"}),
        ("tenants", TenantConfig, {"class_name"}),
        ("fleet", FleetGateConfig, set()),
        ("shared", SharedConfig, set()),
    ],
)
def test_example_lists_every_key(section: str, cls: type, exclude: set[str]) -> None:
    keys = {f.name for f in dataclasses.fields(cls)} - exclude
    if section == "gate":
        keys.add("listen")
    if section == "tenants":
        keys.add("class")
    written = set(re.findall(r"^(?:# )?([a-z0-9_]+) = ", EXAMPLE_CONFIG, flags=re.M))
    assert keys - written == set()
    assert "default_class" in written


def test_example_keys_each_have_a_comment_above() -> None:
    lines = EXAMPLE_CONFIG.splitlines()
    seen_first: set[str] = set()
    for i, line in enumerate(lines):
        m = re.match(r"^(?:# )?([a-z0-9_]+) = ", line)
        if not m or m.group(1) in seen_first:
            continue
        seen_first.add(m.group(1))
        # the first occurrence of each key is explained by a comment right above it
        # (possibly above other commented-out keys of the same block)
        assert lines[i - 1].startswith("#"), f"key {m.group(1)!r} has no comment above it"


def test_example_round_trips_through_tomllib_and_config_from_dict() -> None:
    data = tomllib.loads(uncommented_example())
    assert config_from_dict(data, "d") == parse_config(uncommented_example())


# ---------------------------------------------------------------------------- immutability


def test_config_objects_are_frozen_and_slotted() -> None:
    c = parse_config(uncommented_example())
    for obj in (c, c.gate, c.backends[0], c.budget, c.classes[0], c.tenants[0]):
        first = dataclasses.fields(obj)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, first, "x")
        assert not hasattr(obj, "__dict__")
    assert isinstance(c.backends, tuple) and isinstance(c.classes, tuple)
    assert isinstance(c.tenants, tuple) and isinstance(c.backends[0].models, tuple)
    assert isinstance(c.tenants[0].allowed_classes, tuple)
    hash(c)  # frozen all the way down: usable as a dict key / in sets


# ---------------------------------------------------------------------------- listen


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        ("127.0.0.1:8081", "127.0.0.1", 8081),
        ("0.0.0.0:1", "0.0.0.0", 1),
        ("localhost:65535", "localhost", 65535),
        ("[::1]:8081", "::1", 8081),
        ("[::]:9000", "::", 9000),
        ("[fe80::1%eth0]:80", "fe80::1%eth0", 80),
    ],
)
def test_listen_parsing(listen: str, host: str, port: int) -> None:
    g = parse_config(f'[gate]\nlisten = "{listen}"\n').gate
    assert (g.listen_host, g.listen_port) == (host, port)
    assert g.listen == listen


@pytest.mark.parametrize(
    "listen",
    ["8081", ":8081", "host:", "host:0", "host:65536", "host:80a", "::1:8081", "[::1]8081", "[::1]", "[127.0.0.1]:80", "ho st:80"],
)
def test_bad_listen(listen: str) -> None:
    e = error_of(f'[gate]\nlisten = "{listen}"\n')
    assert e.key == "gate.listen"
    assert f'"{listen}"' in e.problem


def test_listen_list_listens_on_each_address_first_one_primary() -> None:
    g = parse_config('[gate]\nlisten = ["127.0.0.1:8081", "[::1]:8082", "0.0.0.0:9000"]\n').gate
    assert (g.listen_host, g.listen_port) == ("127.0.0.1", 8081)
    assert g.listen_also == ("[::1]:8082", "0.0.0.0:9000")
    assert g.listen_addresses == (("127.0.0.1", 8081), ("::1", 8082), ("0.0.0.0", 9000))


@pytest.mark.parametrize(
    ("listen", "key", "fragment"),
    [
        ("[]", "gate.listen", "at least one address"),
        ('["127.0.0.1:1", "127.0.0.1:1"]', "gate.listen[1]", "listed twice"),
        ('["127.0.0.1:1", 2]', "gate.listen[1]", "must be a string"),
        ('["127.0.0.1:1", "::1:80"]', "gate.listen[1]", "needs brackets"),
    ],
)
def test_bad_listen_list(listen: str, key: str, fragment: str) -> None:
    e = error_of(f"[gate]\nlisten = {listen}\n")
    assert e.key == key
    assert fragment in e.problem


def test_unknown_routes_policy_defaults_to_forward_and_is_checked() -> None:
    assert parse_config("").gate.unknown_routes == "forward"
    assert parse_config('[gate]\nunknown_routes = "refuse"\n').gate.unknown_routes == "refuse"
    e = error_of('[gate]\nunknown_routes = "drop"\n')
    assert e.key == "gate.unknown_routes"


def test_tenant_operator_flag_is_a_boolean() -> None:
    base = '[[tenants]]\nname = "ops"\napi_key_sha256 = "' + "a" * 64 + '"\n'
    assert parse_config(base).tenants[0].operator is False
    assert parse_config(base + "operator = true\n").tenants[0].operator is True
    e = error_of(base + 'operator = "yes"\n')
    assert e.key == "tenants[0].operator"


# ---------------------------------------------------------------------------- errors

TENANT = '[[tenants]]\nname = "t"\napi_key_env = "K"\n'

BAD_CONFIGS = [
    # (id, toml, exact key path, fragment of the problem)
    ("neg-depth", "[classes.batch]\npriority = 1\nqueue_depth = -3\n", "classes.batch.queue_depth", "must be a positive integer, got -3"),
    ("zero-depth", "[classes.batch]\npriority = 1\nqueue_depth = 0\n", "classes.batch.queue_depth", "positive integer, got 0"),
    # a first-day trial's queue_depth = 99999999999999999999 passed: TOML's integers are 64-bit
    (
        "depth-past-64-bit",
        "[classes.batch]\npriority = 1\nqueue_depth = 99999999999999999999\n",
        "classes.batch.queue_depth",
        "must be a 64-bit integer, as TOML's are (-9223372036854775808 to 9223372036854775807), got 99999999999999999999",
    ),
    ("budget-past-64-bit", "[[backends]]\ntoken_budget = 9223372036854775808\n", "backends[0].token_budget", "64-bit integer"),
    ("depth-past-open-files", "[classes.batch]\npriority = 1\nqueue_depth = 1048577\n", "classes.batch.queue_depth", "at most 1,048,576"),
    ("bool-not-int", "[budget]\nmin_tokens = true\n", "budget.min_tokens", "integer, got boolean true"),
    ("float-not-int", "[gate]\nmax_body_bytes = 1.5\n", "gate.max_body_bytes", "integer, got float 1.5"),
    ("string-not-number", '[gate]\nshed_factor = "2"\n', "gate.shed_factor", 'number, got string "2"'),
    ("shed-factor-1", "[gate]\nshed_factor = 1\n", "gate.shed_factor", "greater than 1"),
    ("timeout-zero", "[gate]\nrequest_timeout_s = 0\n", "gate.request_timeout_s", "positive"),
    ("stall-zero", "[gate]\nshed_stall_s = 0\n", "gate.shed_stall_s", "positive"),
    ("header-timeout-negative", "[gate]\nheader_timeout_s = -1\n", "gate.header_timeout_s", "positive"),
    ("body-timeout-string", '[gate]\nbody_timeout_s = "30"\n', "gate.body_timeout_s", 'number, got string "30"'),
    ("write-stall-zero", "[gate]\nwrite_stall_s = 0\n", "gate.write_stall_s", "positive"),
    ("stream-batch-negative", "[gate]\nstream_batch_ms = -1\n", "gate.stream_batch_ms", "0 (every token as it comes) to 1000"),
    ("stream-batch-a-second", "[gate]\nstream_batch_ms = 1500\n", "gate.stream_batch_ms", "0 (every token as it comes) to 1000"),
    ("port-range", '[gate]\nlisten = "h:70000"\n', "gate.listen", "65535"),
    ("empty-journal", '[gate]\njournal = ""\n', "gate.journal", "empty"),
    ("reserved-neg", "[classes.a]\npriority = 1\nreserved_tokens = -1\n", "classes.a.reserved_tokens", "got -1"),
    (
        "limit-below-reserved",
        "[classes.a]\npriority = 1\nreserved_tokens = 100\nlimit_tokens = 50\n",
        "classes.a.limit_tokens",
        "at least reserved_tokens (100), got 50",
    ),
    ("limit-zero", "[classes.a]\npriority = 1\nlimit_tokens = 0\n", "classes.a.limit_tokens", "got 0"),
    (
        "default-over-cap",
        "[classes.a]\npriority = 1\ndefault_max_tokens = 5000\nmax_tokens_cap = 4096\n",
        "classes.a.default_max_tokens",
        "at most max_tokens_cap (4096), got 5000",
    ),
    ("queue-timeout-zero", "[classes.a]\npriority = 1\nqueue_timeout_s = 0\n", "classes.a.queue_timeout_s", "got 0"),
    ("missing-priority", "[classes.a]\nqueue_depth = 3\n", "classes.a.priority", "missing"),
    ("bad-class-name", '[classes."Batch Jobs"]\npriority = 1\n', 'classes."Batch Jobs"', "a-z 0-9 _ -"),
    ("class-not-table", "[classes]\nbatch = 3\n", "classes.batch", "must be a table"),
    (
        "reserved-over-min",
        "[budget]\nmin_tokens = 1000\n[classes.a]\npriority = 2\nreserved_tokens = 600\n[classes.b]\npriority = 1\nreserved_tokens = 600\n",
        "classes",
        "add up to 1200 (a 600 + b 600), more than budget.min_tokens (1000)",
    ),
    ("increase-le-1", "[budget]\nincrease = 1.0\n", "budget.increase", "greater than 1"),
    ("increase-overflows", "[budget]\nincrease = 1e308\n", "budget.increase", "at most 10"),
    ("decrease-ge-1", "[budget]\ndecrease = 1\n", "budget.decrease", "between 0 and 1"),
    ("decrease-zero", "[budget]\ndecrease = 0.0\n", "budget.decrease", "between 0 and 1"),
    ("mode-typo", '[budget]\nmode = "adaptiv"\n', "budget.mode", 'did you mean "adaptive"?'),
    ("tpot-negative", "[budget]\nslo_tpot_p95_ms = -5\n", "budget.slo_tpot_p95_ms", "got -5"),
    ("min-samples-zero", "[budget]\nmin_samples = 0\n", "budget.min_samples", "got 0"),
    # more than the controller's window keeps: the file passed and its backend stayed down
    ("min-samples-over-window", "[budget]\nmin_samples = 20000\n", "budget.min_samples", "at most 10000"),
    ("cooldown-negative", "[budget]\ncooldown_s = -1\n", "budget.cooldown_s", "got -1"),
    # 1e308 passed, and `tokengate replay` stopped at OverflowError (the prefill cap from it)
    ("slo-over-a-day", "[budget]\nslo_ttft_p95_ms = 1e308\n", "budget.slo_ttft_p95_ms", "at most a day (86,400,000 ms)"),
    ("aging-over-a-day", "[budget]\naging_s = 100000\n", "budget.aging_s", "zero (off) or more, at most a day (86,400 s)"),
    ("objective-over-a-day", "[classes.a]\npriority = 1\nttft_objective_ms = 1e12\n", "classes.a.ttft_objective_ms", "at most a day"),
    ("timeout-over-a-day", "[classes.a]\npriority = 1\nqueue_timeout_s = 1e9\n", "classes.a.queue_timeout_s", "at most a day"),
    ("kv-bad", '[[backends]]\nkv = "shared"\n', "backends[0].kv", '"unified" or "split"'),
    (
        "url-path",
        '[[backends]]\nname = "a"\n[[backends]]\nname = "b"\nurl = "http://h:8080/v1"\n',
        "backends[1].url",
        "must not have a path",
    ),
    ("url-scheme", '[[backends]]\nurl = "ftp://h:8080"\n', "backends[0].url", "http://host[:port]"),
    ("url-no-host", '[[backends]]\nurl = "http://:8080"\n', "backends[0].url", "host"),
    ("url-query", '[[backends]]\nurl = "http://h:8080?x=1"\n', "backends[0].url", "query"),
    ("url-port", '[[backends]]\nurl = "http://h:99999"\n', "backends[0].url", "valid URL"),
    (
        "dup-backend",
        '[[backends]]\nurl = "http://a:1"\n[[backends]]\nurl = "http://b:1"\n',
        "backends[1].name",
        'duplicate backend name "default"',
    ),
    (
        "model-two-backends",
        '[[backends]]\nname = "a"\nmodels = ["x", "qwen"]\n[[backends]]\nname = "b"\nmodels = ["qwen"]\n',
        "backends[1].models[0]",
        '"qwen" is already routed to backends[0] (a)',
    ),
    ("model-not-string", '[[backends]]\nmodels = ["a", 3]\n', "backends[0].models[1]", "got integer 3"),
    ("token-budget-zero", "[[backends]]\ntoken_budget = 0\n", "backends[0].token_budget", "got 0"),
    (
        "token-budget-below-min",
        "[budget]\nmin_tokens = 2048\n[[backends]]\ntoken_budget = 1000\n",
        "backends[0].token_budget",
        "at least budget.min_tokens (2048), got 1000",
    ),
    ("prefill-neg", "[[backends]]\nmax_prefill_tokens = -1\n", "backends[0].max_prefill_tokens", "got -1"),
    ("backend-env-bad", '[[backends]]\napi_key_env = "1KEY"\n', "backends[0].api_key_env", "environment variable name"),
    ("backends-not-array", '[backends]\nurl = "http://h:1"\n', "backends", "[[backends]]"),
    ("no-backends", "backends = []\n", "backends", "at least one backend"),
    ("no-classes", "[classes]\n", "classes", "at least one class"),
    ("default-class-unknown", 'default_class = "interactiv"\n', "default_class", 'did you mean "interactive"?'),
    ("tenant-class-unknown", TENANT + 'class = "bulk"\n', "tenants[0].class", 'got "bulk"'),
    ("tenant-allowed-unknown", TENANT + 'allowed_classes = ["interactive", "gold"]\n', "tenants[0].allowed_classes[1]", 'got "gold"'),
    (
        "tenant-allowed-misses-own",
        TENANT + 'class = "batch"\nallowed_classes = ["interactive"]\n',
        "tenants[0].allowed_classes",
        'must include the tenant\'s class "batch"',
    ),
    ("tenant-dup-name", TENANT + '[[tenants]]\nname = "t"\napi_key_env = "K2"\n', "tenants[1].name", 'duplicate tenant name "t"'),
    ("tenant-no-key", '[[tenants]]\nname = "t"\n', "tenants[0]", "exactly one of api_key_sha256 or api_key_env"),
    ("tenant-both-keys", TENANT + f'api_key_sha256 = "{SHA_A}"\n', "tenants[0].api_key_sha256", "not both"),
    ("tenant-sha-upper", f'[[tenants]]\nname = "t"\napi_key_sha256 = "{SHA_A.upper()}"\n', "tenants[0].api_key_sha256", "64 lowercase hex"),
    ("tenant-sha-short", '[[tenants]]\nname = "t"\napi_key_sha256 = "abc"\n', "tenants[0].api_key_sha256", "not shown"),
    (
        "tenant-dup-sha",
        f'[[tenants]]\nname = "a"\napi_key_sha256 = "{SHA_B}"\n[[tenants]]\nname = "b"\napi_key_sha256 = "{SHA_B}"\n',
        "tenants[1].api_key_sha256",
        "already used by tenants[0] (a)",
    ),
    (
        "tenant-dup-env",
        TENANT + '[[tenants]]\nname = "u"\napi_key_env = "K"\n',
        "tenants[1].api_key_env",
        "already the key of tenants[0] (t)",
    ),
    ("tenant-weight-zero", TENANT + "weight = 0\n", "tenants[0].weight", "positive number, got 0"),
    ("tenant-rpm-zero", TENANT + "requests_per_minute = 0\n", "tenants[0].requests_per_minute", "got 0"),
    ("tenant-tpm-bool", TENANT + "tokens_per_minute = false\n", "tenants[0].tokens_per_minute", "boolean false"),
    ("tenant-quota-neg", TENANT + "max_tokens_in_flight = -9\n", "tenants[0].max_tokens_in_flight", "-9"),
    ("tenant-missing-name", '[[tenants]]\napi_key_env = "K"\n', "tenants[0].name", "missing"),
    ("tenants-not-array", '[tenants]\nname = "t"\n', "tenants", "[[tenants]]"),
    ("allowed-not-array", TENANT + 'allowed_classes = "batch"\n', "tenants[0].allowed_classes", 'array of strings, got string "batch"'),
    ("gate-not-table", "gate = 3\n", "gate", "must be a table, got integer 3"),
]


@pytest.mark.parametrize(("toml", "key", "fragment"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_names_the_key(toml: str, key: str, fragment: str) -> None:
    e = error_of(toml)
    assert e.source == "t.toml"
    assert e.key == key, str(e)
    assert fragment in e.problem, str(e)
    assert str(e) == f"t.toml: {key}: {e.problem}"


def test_error_string_format() -> None:
    e = error_of("[classes.batch]\npriority = 1\nqueue_depth = -3\n", "tokengate.toml")
    assert str(e) == "tokengate.toml: classes.batch.queue_depth: must be a positive integer, got -3"
    assert isinstance(e, Exception)
    copy = pickle.loads(pickle.dumps(e))
    assert (copy.source, copy.key, copy.problem) == (e.source, e.key, e.problem)


@pytest.mark.parametrize(
    ("toml", "key", "suggestion"),
    [
        ("[gate]\nlistn = 1\n", "gate.listn", "listen"),
        ("[budget]\nslo_ttft_ms = 1\n", "budget.slo_ttft_ms", "slo_ttft_p95_ms"),
        ("[classes.batch]\npriority = 1\nqueue_dept = 3\n", "classes.batch.queue_dept", "queue_depth"),
        ('[[backends]]\nmodel = ["a"]\n', "backends[0].model", "models"),
        ('[[tenants]]\nname = "t"\napi_key_env = "K"\nclass_name = "batch"\n', "tenants[0].class_name", "class"),
        ('defaultclass = "batch"\n', "defaultclass", "default_class"),
        ("[backend]\nurl = 1\n", "backend", "backends"),
    ],
)
def test_unknown_key_suggests_the_nearest(toml: str, key: str, suggestion: str) -> None:
    e = error_of(toml)
    assert e.key == key
    assert e.problem.startswith("unknown key")
    assert f'did you mean "{suggestion}"?' in e.problem


def test_unknown_key_without_a_near_match_lists_the_valid_keys() -> None:
    e = error_of("[gate]\nzzzzzz = 1\n")
    assert e.key == "gate.zzzzzz"
    assert "did you mean" not in e.problem
    assert "listen" in e.problem and "shed_factor" in e.problem


def test_toml_syntax_error_is_a_config_error_with_the_line() -> None:
    e = error_of("[gate]\nlisten = \n", "bad.toml")
    assert e.source == "bad.toml"
    assert e.key.startswith("line 2")
    assert "invalid TOML" in e.problem
    assert str(e).startswith("bad.toml: line 2")


def test_ints_are_accepted_for_floats_and_become_floats() -> None:
    c = parse_config("[budget]\nslo_ttft_p95_ms = 500\nincrease = 2\n[gate]\nrequest_timeout_s = 5\n")
    assert c.budget.slo_ttft_p95_ms == 500.0 and isinstance(c.budget.slo_ttft_p95_ms, float)
    assert c.budget.increase == 2.0 and isinstance(c.budget.increase, float)
    assert isinstance(c.gate.request_timeout_s, float)


def test_nan_and_inf_are_refused() -> None:
    assert error_of("[gate]\nshed_factor = inf\n").key == "gate.shed_factor"
    assert error_of("[budget]\nwindow_s = nan\n").key == "budget.window_s"


def test_reservations_that_fit_min_tokens_exactly_are_fine() -> None:
    c = parse_config(
        "[budget]\nmin_tokens = 1000\n[classes.a]\npriority = 2\nreserved_tokens = 600\n[classes.b]\npriority = 1\nreserved_tokens = 400\n"
    )
    assert sum(x.reserved_tokens for x in c.classes) == 1000
    assert (
        "smallest budget"
        in error_of(
            "[budget]\nmin_tokens = 999\n[classes.a]\npriority = 2\nreserved_tokens = 600\n"
            "[classes.b]\npriority = 1\nreserved_tokens = 400\n"
        ).problem
    )


def test_tenant_defaults_and_class_mapping() -> None:
    c = parse_config(TENANT + f'[[tenants]]\nname = "u"\napi_key_sha256 = "{SHA_A}"\nclass = "batch"\n')
    t, u = c.tenants
    assert t == TenantConfig(name="t", api_key_env="K")
    assert t.class_name is None and t.allowed_classes == () and t.weight == 1.0
    assert u.class_name == "batch" and u.api_key_sha256 == SHA_A


def test_tenant_without_class_must_allow_the_default_class() -> None:
    e = error_of(TENANT + 'allowed_classes = ["batch"]\n')
    assert e.key == "tenants[0].allowed_classes"
    assert 'default_class "interactive"' in e.problem


def test_load_config_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "gate.toml"
    p.write_text("[classes.batch]\npriority = 1\nqueue_depth = -3\n")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert info.value.source == str(p)
    assert info.value.key == "classes.batch.queue_depth"
    p.write_text('[gate]\nlisten = "[::1]:9000"\n')
    assert load_config(str(p)).gate.listen_host == "::1"


def test_load_config_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert info.value.source == str(missing)
    assert "cannot read" in info.value.problem
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_config(binary)


def test_validate_config_checks_hand_built_configs() -> None:
    good = parse_config(uncommented_example())
    validate_config(good)
    batch = good.class_by_name("batch")
    retuned = dataclasses.replace(
        good,
        classes=tuple(dataclasses.replace(c, queue_depth=0) if c is batch else c for c in good.classes),
    )
    with pytest.raises(ConfigError) as info:
        validate_config(retuned, "<retune>")
    assert str(info.value) == "<retune>: classes.batch.queue_depth: must be a positive integer, got 0"

    bad_type = dataclasses.replace(good, gate=dataclasses.replace(good.gate, listen_port=True))
    with pytest.raises(ConfigError) as info:
        validate_config(bad_type)
    assert info.value.key == "gate.listen_port"

    bad_tenant = dataclasses.replace(good, tenants=(dataclasses.replace(good.tenants[0], class_name="nope"),))
    with pytest.raises(ConfigError) as info:
        validate_config(bad_tenant)
    assert info.value.key == "tenants[0].class"


# ---------------------------------------------------------------------------- [[fleet]]


def test_the_example_fleet_switched_on_lists_two_gates() -> None:
    c = parse_config(uncommented_example(), "example")
    assert c.fleet == (
        FleetGateConfig(name="gpu-1", socket="/run/tokengate/tokengate.sock"),
        FleetGateConfig(name="gpu-2", socket="/tmp/gpu-2.sock"),
    )
    assert parse_config(EXAMPLE_CONFIG).fleet == ()  # commented out: no fleet


def test_a_fleet_gate_needs_only_its_socket() -> None:
    c = parse_config('[[fleet]]\nsocket = "/tmp/a.sock"\n')
    assert c.fleet == (FleetGateConfig(socket="/tmp/a.sock", name=""),)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ('[[fleet]]\nname = "a"\n', "fleet[0].socket", "missing; every [[fleet]] gate needs its control socket's path"),
        ('[[fleet]]\nsocket = "/a.sock"\nhost = "x"\n', "fleet[0].host", "unknown key"),
        ('[fleet]\nsocket = "/a.sock"\n', "fleet", "must be an array of tables (write [[fleet]], not [fleet]), got a table"),
        ('[[fleet]]\nsocket = ""\n', "fleet[0].socket", "must be the path of a gate's control socket"),
        ('[[fleet]]\nsocket = "/a.sock"\nname = "has space"\n', "fleet[0].name", "must be 1 to 64 characters"),
        (
            '[[fleet]]\nsocket = "/a.sock"\nname = "a"\n[[fleet]]\nsocket = "/b.sock"\nname = "a"\n',
            "fleet[1].name",
            'duplicate fleet gate name "a" (fleet[0] has it too)',
        ),
        ('[[fleet]]\nsocket = "/a.sock"\n[[fleet]]\nsocket = "/a.sock"\n', "fleet[1].socket", "is already fleet[0]'s socket"),
        ('[[fleet]]\nsocket = "/' + "s" * 120 + '"\n', "fleet[0].socket", "a Unix socket path must be at most 107 bytes"),
    ],
)
def test_fleet_errors_name_the_key(text: str, key: str, problem: str) -> None:
    err = error_of(text)
    assert err.key == key
    assert problem in err.problem


# ---------------------------------------------------------------------------- [shared]


def test_shared_defaults_are_off_fail_open_one_second_renewal_and_a_100_ms_bound() -> None:
    """100 ms, not 20: at 20 a trial's bursts on a loaded host flipped a gate in 4 of 4, since a
    Redis starved of CPU on that host missed the bound (gate/config/schema.py says the figures)."""
    c = parse_config("")
    assert c.shared == SharedConfig(redis_url="", key_prefix="tokengate:", failure_policy="fail_open", renew_interval_s=1.0, wait_ms=100.0)
    assert c.shared.lease_ttl_s == 3.0


def test_shared_table_is_read_whole() -> None:
    c = parse_config(
        '[shared]\nredis_url = "rediss://:pw@redis.internal:6380/2"\nkey_prefix = "fleet-a:"\n'
        'failure_policy = "fail_closed"\nrenew_interval_s = 0.5\nwait_ms = 15\n'
    )
    assert c.shared == SharedConfig("rediss://:pw@redis.internal:6380/2", "fleet-a:", "fail_closed", 0.5, 15.0)
    assert c.shared.enabled and c.shared.lease_ttl_s == 1.5
    assert parse_config('[shared]\nredis_url = "unix:///run/redis/redis.sock"').shared.enabled


@pytest.mark.parametrize(
    ("text", "key", "needle"),
    [
        ('redis_url = "http://127.0.0.1:6379"', "shared.redis_url", 'must be "redis://'),
        ('redis_url = "redis:///0"', "shared.redis_url", "must name a host"),
        ('redis_url = "redis://h:6379/zero"', "shared.redis_url", "database number"),
        ('redis_url = "unix://"', "shared.redis_url", "socket's path"),
        ('key_prefix = ""', "shared.key_prefix", "1 to 64 printable"),
        ('key_prefix = "a{b}:"', "shared.key_prefix", "braces"),
        ('failure_policy = "open"', "shared.failure_policy", 'did you mean "fail_open"'),
        ("renew_interval_s = 0", "shared.renew_interval_s", "from 0.05 to 60"),
        ("wait_ms = 0", "shared.wait_ms", "more than 0"),
        ("wait_ms = 2000", "shared.wait_ms", "at most renew_interval_s"),
        ("redis = 1", "shared.redis", 'did you mean "redis_url"'),
        ('wait_ms = "20"', "shared.wait_ms", "must be a number"),
    ],
)
def test_shared_mistakes_name_the_key(text: str, key: str, needle: str) -> None:
    err = error_of("[shared]\n" + text)
    assert err.key == key and needle in err.problem, str(err)


def test_a_redis_password_is_never_echoed_in_an_error() -> None:
    err = error_of('[shared]\nredis_url = "redis://:hunter2@h:6379/x"')
    assert "hunter2" not in str(err) and err.key == "shared.redis_url"


# ---------------------------------------------------------------------------- router mode


ROUTER = '[[backends]]\nname = "r"\nurl = "http://127.0.0.1:8080"\nmodels = ["tiny", "tiny2"]\n'


def test_router_keys_read_pin_cold_start_and_fallbacks() -> None:
    c = parse_config(
        ROUTER + 'pin = ["tiny"]\ncold_start_s = 2.5\n'
        '[classes.interactive]\npriority = 10\nfallback = ["tiny2"]\n'
        '[[tenants]]\nname = "t"\napi_key_env = "K"\nclass = "interactive"\nfallback = ["tiny", "tiny2"]\n'
    )
    assert c.backends[0].pin == ("tiny",) and c.backends[0].cold_start_s == 2.5
    assert c.class_by_name("interactive").fallback == ("tiny2",)
    assert c.tenants[0].fallback == ("tiny", "tiny2")


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        (ROUTER + 'pin = ["tiny3"]\n', "backends[0].pin[0]", 'must be this backend\'s models (tiny, tiny2), got "tiny3"'),
        (ROUTER + 'pin = ["tiny", "tiny"]\n', "backends[0].pin[1]", '"tiny" is listed twice'),
        (ROUTER + "cold_start_s = -1\n", "backends[0].cold_start_s", "must be zero or more seconds"),
        (ROUTER + '[classes.interactive]\npriority = 1\nfallback = ["tiny9"]\n', "classes.interactive.fallback[0]", "did you mean"),
        ('[classes.interactive]\npriority = 1\nfallback = ["x"]\n', "classes.interactive.fallback[0]", "none is configured"),
        (ROUTER + '[[tenants]]\nname = "t"\napi_key_env = "K"\nfallback = "tiny"\n', "tenants[0].fallback", "must be an array of strings"),
    ],
)
def test_router_keys_are_checked_with_file_and_key(text: str, key: str, problem: str) -> None:
    err = error_of(text)
    assert err.key == key and problem in err.problem, str(err)


# Keys the example explains without a "Default" (required, or one of two that must be given).
_NO_DEFAULT = {("classes", "priority"), ("tenants", "name"), ("tenants", "api_key_env"), ("tenants", "api_key_sha256"), ("fleet", "socket")}
_EXAMPLE_SECTIONS = {
    "gate": GateConfig,
    "backends": BackendConfig,
    "budget": BudgetConfig,
    "classes": ClassConfig,
    "tenants": TenantConfig,
    "fleet": FleetGateConfig,
    "shared": SharedConfig,
}


def _documented_default(comment: str) -> object:
    """The value a comment's last "Default" names: a string, number, bool, [] or unset (None);
    the text itself when it is a phrase ("the socket file's name ...")."""
    m = re.match(r'Default:? ("[^"]*"|\[\]|true|false|unset|-?[0-9][0-9.]*[0-9]|[0-9])?(.*)$', comment[comment.rindex("Default") :])
    assert m, comment
    token = m.group(1)
    if token is None:
        return m.group(2).strip()
    if token.startswith('"'):
        return token.strip('"')
    return {"[]": (), "true": True, "false": False, "unset": None}.get(
        token, float(token) if token[0].isdigit() or token[0] == "-" else token
    )


def test_every_default_the_example_states_is_the_built_in_default() -> None:
    """`tokengate config example` says each key's default in words ("Default 10."): an on-call
    engineer deletes the lines they do not need and trusts the comment. Every stated default
    must be what the gate uses when the key is left out (no test held them together: a default
    changed in gate/config/schema.py left the example's word behind)."""
    section, comment, seen, checked = "", "", set(), 0
    for line in uncommented_example().splitlines():
        header = re.match(r"^\[\[?([a-z_]+)", line)
        key = re.match(r"^([a-z0-9_]+) = ", line)
        if header:
            section, comment = header.group(1), ""
        elif line.startswith("#"):
            comment += " " + line.lstrip("# ")
        elif key:
            name = key.group(1)
            if (section, name) not in seen:
                seen.add((section, name))
                if (section, name) in _NO_DEFAULT or (section == "tenants" and name == "tokens_per_minute"):
                    pass  # explained with requests_per_minute, one comment for both
                elif not section:
                    assert name == "default_class" and 'Default: "interactive"' in comment
                    assert Config().default_class == "interactive"
                else:
                    assert "Default" in comment, f"{section}.{name}: its comment states no default"
                    stated = _documented_default(comment)
                    cls = _EXAMPLE_SECTIONS[section]
                    if (section, name) == ("gate", "listen"):
                        real: object = GateConfig().listen
                    else:
                        field_name = {"class": "class_name"}.get(name, name)
                        real = next(f.default for f in dataclasses.fields(cls) if f.name == field_name)
                    if (
                        isinstance(stated, str)
                        and isinstance(real, str | type(None))
                        and (section, name)
                        in {
                            ("tenants", "class"),
                            ("fleet", "name"),
                        }
                    ):
                        assert real in (None, ""), f"{section}.{name}"  # a phrase: the class's, the socket's name
                    else:
                        assert stated == real, f"{section}.{name}: the example says Default {stated!r}, the gate uses {real!r}"
                    checked += 1
            comment = ""
        elif not line.strip():
            continue
    assert checked >= 50  # every documented key of every table was compared


def test_the_example_names_both_tenant_key_headers_and_the_open_probe_routes() -> None:
    """The example said "With tenants, every request needs a tenant's API key (Authorization:
    Bearer)": the gate also takes X-Api-Key (the Anthropic SDK's header; a real gate answered
    200 to it) and leaves /health and /metrics open for probes (200 without a key), as the
    README says. An operator wiring a probe or an Anthropic client read the opposite."""
    block = " ".join(EXAMPLE_CONFIG.split("# One [[tenants]] table per client.")[1].split("[[tenants]]")[0].replace("#", " ").split())
    assert "Authorization: Bearer" in block and "X-Api-Key" in block
    assert "/health and /metrics stay open" in block


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[[backends]]\nurl = "http://admin:s3cret-PW@10.0.0.5:8080"\n', "backends[0].url"),
        ('[[backends]]\nurl = "http://10.0.0.5:8080?api_key=s3cret-PW"\n', "backends[0].url"),
        ('[[backends]]\nurl = "ftp://admin:s3cret-PW@10.0.0.5:8080"\n', "backends[0].url"),
        ('[[backends]]\nurl = "http://10.0.0.5:8080"\napi_key_env = "sk-s3cret-PW"\n', "backends[0].api_key_env"),
        ('[[tenants]]\nname = "a"\napi_key_env = "sk-s3cret-PW"\n', "tenants[0].api_key_env"),
        ('[[tenants]]\nname = "a"\napi_key_sha256 = "sk-s3cret-PW"\n', "tenants[0].api_key_sha256"),
    ],
    ids=["url-password", "url-query", "url-scheme-password", "backend-key-in-env-name", "tenant-key-in-env-name", "tenant-key-as-hash"],
)
def test_a_secret_in_the_wrong_place_is_never_echoed(text: str, key: str) -> None:
    # These messages reach the log, and a refused SIGHUP reload writes them into the journal's
    # audit row (reload_refused): a password in a backend url, or a key pasted where its
    # variable's name or its hash belongs, was quoted there in clear.
    err = error_of(text)
    assert err.key == key, str(err)
    assert "s3cret" not in str(err), str(err)


def test_the_example_says_how_its_classes_differ_from_the_built_in_ones() -> None:
    """#25 (a user's evaluation): the example said "Without any [classes], these two are the
    defaults", but a config with only a backend got interactive without its 1,024 reserved tokens
    and batch without its 16,384 limit. The comment now names exactly those differences."""
    from dataclasses import replace

    example = parse_config(EXAMPLE_CONFIG, "example")
    built_in = parse_config('[[backends]]\nurl = "http://127.0.0.1:8080"\n', "only a backend")
    comment = EXAMPLE_CONFIG.split("[classes.interactive]")[0]
    assert "interactive's reserved_tokens 0" in comment and "batch's limit_tokens unset" in comment
    unreserved = {c.name: replace(c, reserved_tokens=0, limit_tokens=None) for c in example.classes}
    assert {c.name: c for c in built_in.classes} == unreserved
    assert example.class_by_name("interactive").reserved_tokens != 0
    assert example.class_by_name("batch").limit_tokens is not None


# ---------------------------------------------------------------------------- backends' places


def two_backends(url_a: str, url_b: str, more_a: str = "", more_b: str = "") -> str:
    return f'[[backends]]\nurl = "{url_a}"\n{more_a}[[backends]]\nname = "b2"\nurl = "{url_b}"\n{more_b}'


@pytest.mark.parametrize(
    ("url_a", "url_b"),
    [
        ("http://127.0.0.1:18510", "http://127.0.0.1:18510"),  # a first-day trial's, before localhost
        ("http://127.0.0.1:18510", "http://127.0.0.1:18510/"),
        ("http://LLAMA.example:8080", "http://llama.example.:8080/"),  # case, the root's dot
        ("http://llama", "http://llama:80"),  # the scheme's default port
        ("https://llama", "http://llama:443"),
        ("http://[::1]:8080", "http://[0:0::1]:8080"),
    ],
)
def test_two_backends_at_one_llama_server_are_refused_naming_both(url_a: str, url_b: str) -> None:
    """A first-day trial: two [[backends]] on one llama-server were accepted, so its capacity
    counted twice (2 x 2,048 tokens admitted into its 4 slots)."""
    e = error_of(two_backends(url_a, url_b))
    assert e.key == "backends[1].url"
    assert "backends[0] (default" in e.problem and 'backends "default" and "b2" would count its capacity twice' in e.problem


def test_router_backends_may_share_a_router_with_disjoint_models_only() -> None:
    # each model of a router runs in a child process of its own: separate capacity
    url = "http://127.0.0.1:18510"
    config = parse_config(two_backends(url, url, 'models = ["a"]\n', 'models = ["b", "c"]\n'))
    assert [b.models for b in config.backends] == [("a",), ("b", "c")]
    e = error_of(two_backends(url, url, 'models = ["a"]\n', 'models = ["b", "a"]\n'))
    assert (e.key, e.problem) == (
        "backends[1].models[1]",
        'model "a" is already routed to backends[0] (default); a model name may be routed to one backend only',
    )
    e = error_of(two_backends(url, url, 'models = ["a"]\n'))  # one without models: the whole server
    assert e.key == "backends[1].url" and "would count its capacity twice" in e.problem


def test_backends_that_differ_as_written_pass_the_textual_check() -> None:
    # localhost and 127.0.0.1 are told apart by resolving (`serve`, `config check --backends`)
    parse_config(two_backends("http://127.0.0.1:18510", "http://localhost:18510"))
    parse_config(two_backends("http://127.0.0.1:18510", "http://127.0.0.1:18511"))


@pytest.mark.parametrize(
    ("listen", "url"),
    [
        ('"127.0.0.1:8081"', "http://127.0.0.1:8081"),
        ('"127.0.0.1:8081"', "http://localhost:8081/"),
        ('"0.0.0.0:8081"', "http://127.0.0.1:8081"),
        ('"0.0.0.0:8081"', "http://localhost:8081"),
        ('"localhost:8081"', "http://[::1]:8081"),
        ('["127.0.0.1:9000", "[::]:8081"]', "http://[::1]:8081"),
    ],
)
def test_a_backend_at_the_gate_s_own_listen_address_is_refused(listen: str, url: str) -> None:
    """A first-day trial: the gate then forwarded to itself forever ("loading ... capacity not
    known yet")."""
    e = error_of(f'[gate]\nlisten = {listen}\n[[backends]]\nurl = "{url}"\n')
    assert e.key == "backends[0].url"
    assert "is the gate's own address ([gate] listen" in e.problem and "forward each request to itself" in e.problem


@pytest.mark.parametrize(
    ("listen", "url"),
    [('"127.0.0.1:8081"', "http://127.0.0.1:8080"), ('"0.0.0.0:8081"', "http://[::1]:8081"), ('"127.0.0.1:8081"', "http://10.0.0.7:8081")],
)
def test_a_backend_elsewhere_than_the_listen_address_passes(listen: str, url: str) -> None:
    parse_config(f'[gate]\nlisten = {listen}\n[[backends]]\nurl = "{url}"\n')
