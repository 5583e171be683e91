"""The conformance harness's pure parts: the suite's flags rewritten, the gate's config generated
from them (and valid), outcomes read from JUnit XML, and the comparison that fails the run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gate.config import parse_config
from tests.conformance.run import (
    BASELINE,
    DIFFERENCES,
    REFRESH,
    VERSION,
    BaselineMismatch,
    compare,
    load_baseline,
    load_differences,
    outcomes,
    report,
    write_baseline,
)
from tests.conformance.shim import default_max_tokens, gate_config, rewrite_model

SUITE = ["--port", "8080", "--host", "127.0.0.1", "--hf-repo", "ggml-org/models", "--hf-file", "bert-bge-small/ggml-model-f16.gguf"]


def test_hugging_face_models_are_swapped_for_the_tiny_model() -> None:
    args = rewrite_model([*SUITE, "--offline", "--embedding", "--ctx-size", "512"], "/m.gguf")
    assert "--hf-repo" not in args and "--hf-file" not in args and "--offline" not in args
    assert args[args.index("--model") + 1] == "/m.gguf"
    assert args[args.index("--pooling") + 1] == "mean"  # bert-bge-small's GGUF says mean pooling
    assert args[args.index("--ctx-size") + 1] == "512" and "--embedding" in args


def test_a_router_start_without_a_model_stays_without_one() -> None:
    args = rewrite_model(["--port", "8080", "--ctx-size", "1024"], "/m.gguf")
    assert "--model" not in args


def test_an_explicit_pooling_or_model_is_kept() -> None:
    args = rewrite_model([*SUITE, "--pooling", "none"], "/m.gguf")
    assert args.count("--pooling") == 1 and args[args.index("--pooling") + 1] == "none"
    assert rewrite_model(["--model", "/given.gguf"], "/m.gguf") == ["--model", "/given.gguf"]


def test_the_default_limit_is_llama_servers_own_or_a_quarter_of_a_slot() -> None:
    assert default_max_tokens(["--ctx-size", "512", "--parallel", "2", "--n-predict", "64"]) == 64
    assert default_max_tokens(["--ctx-size", "512", "--parallel", "2"]) == 64  # 256 per slot / 4
    assert default_max_tokens(["--ctx-size", "512", "--parallel", "2", "--kv-unified"]) == 128
    # a server limit that cannot fit one slot is not copied (every request would be refused)
    assert default_max_tokens(["--ctx-size", "256", "--parallel", "2", "--n-predict", "500"]) == 32


def test_the_generated_config_is_valid_open_mode_on_the_suites_addresses(tmp_path: Path) -> None:
    text, env = gate_config(["--port", "8080", "--host", "127.0.0.1,::1", "--ctx-size", "512"], 9999, tmp_path)
    config = parse_config(text, "gate.toml")
    assert not config.tenants and env == {}
    assert config.backends[0].url == "http://127.0.0.1:9999"
    assert text.count("8080") == 2 and '"[::1]:8080"' in text


def test_an_api_key_becomes_one_operator_tenant_and_the_upstream_key(tmp_path: Path) -> None:
    text, env = gate_config([*SUITE, "--api-key", "secret"], 9999, tmp_path)
    config = parse_config(text, "gate.toml")
    assert env == {"CONFORMANCE_API_KEY": "secret"}
    (tenant,) = config.tenants
    assert tenant.operator and tenant.api_key_env == "CONFORMANCE_API_KEY"
    assert config.backends[0].api_key_env == "CONFORMANCE_API_KEY"
    assert "secret" not in text  # the key lives in the environment only


def test_outcomes_read_from_junit_xml(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="unit.test_basic" name="test_a"/>'
        '<testcase classname="unit.test_basic" name="test_b[x]"><failure message="m"/></testcase>'
        '<testcase classname="unit.test_basic" name="test_c"><error message="e"/></testcase>'
        '<testcase classname="unit.test_metrics" name="test_d"><skipped message="s"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert outcomes(junit) == {
        "unit/test_basic.py::test_a": "passed",
        "unit/test_basic.py::test_b[x]": "failed",
        "unit/test_basic.py::test_c": "failed",
        "unit/test_metrics.py::test_d": "skipped",
    }
    assert outcomes(tmp_path / "missing.xml") == {}


def test_only_a_test_lost_through_the_gate_and_not_documented_fails_the_run() -> None:
    straight = {"a": "passed", "b": "passed", "c": "failed", "d": "passed", "e": "passed"}
    gate = {"a": "passed", "b": "failed", "c": "passed", "d": "failed"}  # e: never ran
    result = compare(straight, gate, {"d": "documented reason", "a": "old", "z": "not run"})
    assert result["passed_straight"] == 4 and result["passed_gate"] == 2
    assert result["undocumented"] == ["b", "e"]
    assert result["documented"] == {"d": "documented reason"}
    assert result["stale"] == ["a"] and result["gained"] == ["c"]  # z did not run: not stale
    text = report(result, {"straight": 1.0, "gate": 2.0})
    assert "REGRESSION  b" in text and "stale       a" in text and "passed straight 4, through the gate 2" in text


def test_every_documented_difference_names_a_test_and_an_accepted_reason() -> None:
    # The only accepted reasons (issue #21): documented admission behaviour, and the gate's own
    # /metrics answering when llama-server runs without --metrics.
    import tomllib

    data = tomllib.loads(DIFFERENCES.read_text())
    entries = data.get("difference", [])
    for entry in entries:
        assert set(entry) == {"test", "kind", "reason"}, entry
        assert entry["test"].startswith("unit/test_") and "::" in entry["test"]
        assert entry["kind"] in ("admission", "gate-metrics"), entry
        assert len(entry["reason"]) > 40, entry
    assert len(load_differences()) == len(entries)  # no test listed twice


def test_a_baseline_measured_for_another_setup_is_refused_with_the_refresh_command(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    key = {"llama_cpp_python": "0.3.36", "suite_sha256": "aa", "model": "tiny.gguf", "shim_sha256": "bb"}
    with pytest.raises(BaselineMismatch, match="--write-baseline"):
        load_baseline(key, path)  # none stored yet
    write_baseline(key, {"unit/test_a.py::test_x": "passed", "unit/test_a.py::test_y": "failed"}, 400.0, path)
    assert load_baseline(key, path) == {"unit/test_a.py::test_x": "passed", "unit/test_a.py::test_y": "failed"}
    with pytest.raises(BaselineMismatch, match=r"shim_sha256: stored 'bb', now 'cc'.*--write-baseline"):
        load_baseline({**key, "shim_sha256": "cc"}, path)


def test_the_stored_baseline_matches_this_checkout() -> None:
    # an edit to the shim (or a llama.cpp upgrade) must come with a re-measured baseline
    stored = json.loads(BASELINE.read_text())
    assert stored["key"]["shim_sha256"] == hashlib.sha256((BASELINE.parent / "shim.py").read_bytes()).hexdigest(), REFRESH
    assert stored["key"]["llama_cpp_python"] == VERSION, REFRESH
    assert stored["passed"] == sum(1 for s in stored["outcomes"].values() if s == "passed")
