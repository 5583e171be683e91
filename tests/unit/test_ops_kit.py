"""The ops kit (deploy/): the alert rules checked and unit-tested by promtool, and every metric
name that the rules, the Grafana dashboard, the KEDA ScaledObject and the endpoint picker's
flags use read from the gate's own /metrics (a real GateService's route over ASGI).

promtool is never skipped: `make test` installs it (deploy/prometheus/ensure_promtool.sh).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gate.config import parse_config
from gate.service import GateService
from tests.fakes import GATE_CONFIG, fake_llama_transport

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "tokengate-rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "tokengate-rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "tokengate.json"
KEDA = DEPLOY / "kubernetes" / "keda-scaledobject.yaml"
POOL = DEPLOY / "kubernetes" / "llama-tokengate.yaml"

# What the issue asks the rules to cover, by alert name.
ALERTS = {
    "TokengateBackendDown",
    "TokengateUpstream5xx",
    "TokengateUpstreamFailure",
    "TokengateDenialsHigh",
    "TokengateQueueDrainSlow",
    "TokengateJournalDropping",
    "TokengateReaperFiring",
    "TokengateInteractiveTTFTOverSLO",
    "TokengateSharedLimitFallback",
    "TokengateSharedLimitPolicyApplied",
    "TokengateSharedLeasesExpired",
    "TokengateOperatorChannelDown",
    "TokengateClassPausedLong",
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run `bash deploy/prometheus/ensure_promtool.sh` (Debian package prometheus)")
    return path


# ---- PromQL: the metric names an expression reads ----------------------------------------------

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}
_STRIP = [
    re.compile(r'"(?:[^"\\]|\\.)*"'),  # strings
    re.compile(r"\{[^}]*\}"),  # label matchers
    re.compile(r"\[[^\]]*\]"),  # ranges
    re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"),  # label lists
    re.compile(r"#[^\n]*"),  # comments
]
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Every metric an expression selects (functions, keywords and label names left out)."""
    for pattern in _STRIP:
        expr = pattern.sub(" ", expr)
    names = set()
    for m in _IDENT.finditer(expr):
        rest = expr[m.end() :].lstrip()
        if rest.startswith("(") or m.group().lower() in _KEYWORDS:
            continue  # a function or aggregation, or a keyword
        names.add(m.group())
    return names


def test_metric_names_reads_selectors_not_functions_or_labels():
    expr = (
        'histogram_quantile(0.95, sum by (job, le) (rate(x_bucket{class="a",le!="1"}[5m]))) '
        "> on (job) group_left max by (job) (slo) and on (pod) (up == 1)  # comment words"
    )
    assert metric_names(expr) == {"x_bucket", "slo", "up"}


# ---- the gate's /metrics -------------------------------------------------------------------------


def scrape(path: str) -> str:
    """GET `path` from a real gate's app (its backend answers /health and /props)."""
    import asyncio

    async def get() -> str:
        gate = GateService(parse_config(GATE_CONFIG), environ={}, transport=fake_llama_transport())
        try:
            await gate.backends.probe_all()
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate.app), base_url="http://gate") as c:
                resp = await c.get(path)
            assert resp.status_code == 200, (path, resp.status_code)
            return resp.text
        finally:
            for b in gate.backends:
                if b.gatekeeper is not None:
                    b.gatekeeper.close()
            await gate.client.aclose()

    return asyncio.run(get())


def scrape_names(path: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(scrape(path)) for s in fam.samples}


@pytest.fixture(scope="module")
def exposed() -> set[str]:
    """Every sample name the gate's /metrics can carry: the samples it holds now and, for a family
    with no child yet (a labelled counter before its first event), the names its type gives."""
    text = scrape("/metrics")
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("_info",)}
    names = set()
    for fam in text_string_to_metric_families(text + router_mode_text()):
        names.update(s.name for s in fam.samples)
        names.update(fam.name + suffix for suffix in suffixes.get(fam.type, ()))
    return names


def router_mode_text() -> str:
    """The router-mode families (gate/fleet/model_metrics.py, on /metrics only with a router
    backend), from their collector holding one model, as a scrape would render them."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from gate.fleet.model_metrics import ModelMetrics

    view = SimpleNamespace(
        backend="local", name="tiny", status="loaded", last_load_s=0.5, loads=1, failures=0, evictions=0, slots_busy=0, queued=0
    )
    fleet = SimpleNamespace(views=lambda _: [view])
    registry = CollectorRegistry()
    ModelMetrics(registry, lambda: [fleet], ["tiny"]).rerouted("tiny", "tiny", "saturated")
    return generate_latest(registry).decode()


def test_the_inference_gateway_gauges_are_on_metrics(exposed):
    assert {"tokengate_num_requests_waiting", "tokengate_num_requests_running", "tokengate_kv_cache_usage_ratio"} <= exposed


# ---- alert rules ------------------------------------------------------------------------------------


def rules() -> list[dict]:
    return [r for group in yaml.safe_load(RULES.read_text())["groups"] for r in group["rules"]]


def test_promtool_checks_the_rules():
    out = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in out.stdout


def test_promtool_unit_tests_pass():
    out = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_the_rules_are_the_issues_list_and_each_is_unit_tested_firing():
    assert {r["alert"] for r in rules()} == ALERTS
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {t["alertname"] for case in tests for t in case.get("alert_rule_test", ()) if t.get("exp_alerts")}
    quiet = {t["alertname"] for case in tests for t in case.get("alert_rule_test", ()) if not t.get("exp_alerts")}
    assert fired == ALERTS  # each one fires in a test
    assert quiet == ALERTS  # and each one is shown not to fire too early or on the wrong series


def test_every_metric_the_rules_read_is_on_the_gates_metrics(exposed):
    used = set().union(*(metric_names(r["expr"]) for r in rules()))
    assert used and used <= exposed, sorted(used - exposed)


# ---- Grafana dashboard ------------------------------------------------------------------------------


def panels(items: list[dict]) -> list[dict]:
    out = []
    for p in items:
        out.append(p)
        out += panels(p.get("panels", []))
    return out


def test_every_metric_the_dashboard_queries_is_on_the_gates_metrics(exposed):
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in panels(dash["panels"]) for t in p.get("targets", [])]
    assert len(exprs) >= 20
    used = set().union(*(metric_names(e) for e in exprs))
    # Grafana's variables: label_values(METRIC, LABEL)
    for var in dash["templating"]["list"]:
        if isinstance(var.get("query"), dict):
            (metric,) = re.fullmatch(r"label_values\((\w+), *\w+\)", var["query"]["query"]).groups()
            used.add(metric)
    assert used <= exposed, sorted(used - exposed)
    # every series the alerts page on has a panel
    assert set().union(*(metric_names(r["expr"]) for r in rules())) <= used
    ids = [p["id"] for p in panels(dash["panels"])]
    assert len(ids) == len(set(ids))


# ---- Kubernetes: KEDA and the InferencePool example -------------------------------------------------


def test_keda_scales_the_example_deployment_on_the_queue_drain_time(exposed):
    scaled = yaml.safe_load(KEDA.read_text())
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    deployments = [d for d in yaml.safe_load_all(POOL.read_text()) if d["kind"] == "Deployment"]
    assert scaled["spec"]["scaleTargetRef"]["name"] in {d["metadata"]["name"] for d in deployments}
    triggers = scaled["spec"]["triggers"]
    assert all(t["type"] == "prometheus" for t in triggers)
    for t in triggers:
        meta = t["metadata"]
        assert float(meta["threshold"]) > 0 and meta["serverAddress"].startswith("http")
        assert metric_names(meta["query"]) <= exposed, meta["query"]
    assert "tokengate_queue_drain_seconds" in metric_names(triggers[0]["metadata"]["query"])


def test_the_inference_pool_example_routes_through_the_gate_on_its_gauges(exposed):
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(POOL.read_text())}
    pod = docs[("Deployment", "llama-tokengate")]["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert set(containers) == {"llama-server", "tokengate"}

    # the gate's config in the ConfigMap is valid, and the pool targets the gate's port
    toml = docs[("ConfigMap", "llama-tokengate")]["data"]["tokengate.toml"]
    config = parse_config(toml, "llama-tokengate.yaml")
    gate_port = containers["tokengate"]["ports"][0]["containerPort"]
    assert config.gate.listen_port == gate_port
    pool = docs[("InferencePool", "llama-tokengate")]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["targetPorts"] == [{"number": gate_port}]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()

    # llama-server listens on loopback only, where the gate's backend points
    llama_args = containers["llama-server"]["args"]
    assert "--host=127.0.0.1" in llama_args and "--kv-unified" in llama_args and "--metrics" in llama_args
    (backend,) = config.backends
    assert backend.url == "http://127.0.0.1:8080" and "--port=8080" in llama_args and backend.kv == "unified"

    # the endpoint picker reads tokengate's names, each of which the gate exports
    epp = docs[("Deployment", "llama-tokengate-epp")]["spec"]["template"]["spec"]["containers"][0]
    flags = dict(a.removeprefix("--").split("=", 1) for a in epp["args"] if "=" in a)
    assert flags["pool-name"] == pool["metadata"]["name"]
    wanted = {
        "total-queued-requests-metric": "tokengate_num_requests_waiting",
        "total-running-requests-metric": "tokengate_num_requests_running",
        "kv-cache-usage-percentage-metric": "tokengate_kv_cache_usage_ratio",
    }
    assert {k: flags[k] for k in wanted} == wanted
    assert set(wanted.values()) <= exposed
    # the path it scrapes serves exactly those three
    assert set(wanted.values()) == scrape_names(flags["model-server-metrics-path"])
    assert pool["spec"]["endpointPickerRef"]["name"] in {name for kind, name in docs if kind == "Service"}


def test_images_are_placeholders_without_a_registry_host():
    """Whoever deploys builds and pushes the images; a manifest names no registry."""
    images = []
    for path in (POOL, KEDA):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            images += [c["image"] for c in spec.get("containers", [])]
    assert len(images) == 3
    for image in images:
        first = image.split("/")[0]
        assert "/" not in image or not ("." in first or ":" in first or first == "localhost"), image


def test_the_systemd_unit_matches_what_the_gate_does_on_its_signals():
    """ExecReload is SIGHUP (a reload), the stop is SIGTERM (a drain) and outlasts the drain, and
    a gate ended by a SIGHUP is restarted: in a trial a `systemctl reload` in the first instant
    after start (Type=exec: started at exec) ended the process before Python could hold the
    signal, and systemd counts death by SIGHUP as clean, so Restart=on-failure left it down."""
    unit = (DEPLOY / "tokengate.service").read_text()
    keys = dict(re.findall(r"^(\w+)=(.*)$", unit, re.M))
    assert keys["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert keys["KillSignal"] == "SIGTERM"
    grace = float(re.search(r"--grace (\d+)", keys["ExecStart"]).group(1))
    assert float(keys["TimeoutStopSec"]) > grace + 5  # the drain, then the journal's flush (close_timeout_s 5)
    assert "SIGHUP" in keys.get("RestartForceExitStatus", "").split()
