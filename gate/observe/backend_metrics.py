"""llama-server's own ``llamacpp:*`` series, scraped through the gate's ``GET /metrics``.

After the gate's own series, ``/metrics`` carries each backend's ``llamacpp:*`` series, read from
that llama-server's ``/metrics`` at scrape time (all backends at once, each bounded by
``SCRAPE_TIMEOUT_S``), so a scraper needs one target per gate:

* **One plain backend**: its series exactly as llama-server sends them (no label added), so a
  dashboard or alert written against llama-server keeps working when pointed at the gate.
* **Several backends, or a router's models**: each sample gets ``backend="NAME"`` (and, in
  router mode, ``model="MODEL"``; only the configured names, so the label set is bounded by the
  config), and each family's ``# HELP``/``# TYPE`` appears once.

``llamacpp:prompt_tokens_seconds`` and ``llamacpp:predicted_tokens_seconds`` are the one change:
llama-server averages them since the previous read of its /metrics, which the gate's telemetry
makes every second; they are recomposed over the scraper's own window
(:mod:`gate.backend.rate_window`).

Only families named ``llamacpp:*`` are relayed (they never collide with the gate's
``tokengate_*``), and only samples the parser accepts, so a backend cannot make the answer
invalid. ``tokengate_backend_metrics_up{backend}`` says per backend whether its series are in this
answer: 0 when llama-server runs without ``--metrics`` (it answers 501), is unreachable, slow, or
a router's model is not loaded. The gate's own series are there either way.

``Process-Start-Time-Unix`` (llama-server's header: when its counters started) is the one plain
backend's own, as it sent it; otherwise the gate's start (Unix seconds).

Names are llama-server's: ``promtool check metrics`` reports its own naming (``:`` in names,
``llamacpp:n_tokens_max`` a counter without ``_total``) as lint, never a syntax error.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from gate.backend.rate_window import START_HEADER, RateWindows, rewrite, window_key
from gate.backend.telemetry import parse_metrics

if TYPE_CHECKING:
    from gate.backend.pool import Backend

PREFIX = "llamacpp:"
#: per backend, all at once: a scrape never waits longer for llama-server (a Prometheus scrape
#: times out after 10 s by default)
SCRAPE_TIMEOUT_S = 2.0
UP = "tokengate_backend_metrics_up"
#: when this gate's counters started (the module is imported once, as the gate starts)
GATE_START = int(time.time())

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_VALUE = re.compile(r"[ \t]+([^ \t]+)([ \t]+-?[0-9]+)?[ \t]*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*(,|(?=\}))')


@dataclass
class Family:
    name: str
    help: str | None = None
    type: str | None = None
    samples: list[str] = field(default_factory=list)


def _family_of(sample: str, families: dict[str, Family], current: Family | None) -> Family | None:
    """The declared family a sample belongs to: its own name, the current family's (histogram and
    summary parts), or the name without a known suffix."""
    if sample in families:
        return families[sample]
    if current is not None and sample.startswith(current.name):
        return current
    for suffix in ("_total", "_bucket", "_sum", "_count", "_created", "_info"):
        base = sample.removesuffix(suffix)
        if base != sample and base in families:
            return families[base]
    return None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample(line: str, extra: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """(name, the sample line with `extra` labels first), or None for a line that is not a valid sample."""
    m = _NAME.match(line)
    if m is None:
        return None
    name, rest = m.group(0), line[m.end() :]
    labels: list[str] = [f'{k}="{_escape(v)}"' for k, v in extra]
    taken = {k for k, _ in extra}
    if rest.startswith("{"):
        pos = 1
        while True:
            while pos < len(rest) and rest[pos] in " \t":
                pos += 1
            if pos < len(rest) and rest[pos] == "}":
                pos += 1
                break
            lm = _LABEL.match(rest, pos)
            if lm is None:
                return None
            if lm.group(1) in taken:  # the backend's own label of that name cannot be kept
                return None
            labels.append(f'{lm.group(1)}="{lm.group(2)}"')
            pos = lm.end()
        rest = rest[pos:]
    vm = _VALUE.fullmatch(rest)
    if vm is None:
        return None
    try:
        float(vm.group(1))
    except ValueError:
        return None
    label_text = "{" + ",".join(labels) + "}" if labels else ""
    return name, f"{name}{label_text} {vm.group(1)}{vm.group(2) or ''}"


def merge(texts: Iterable[tuple[Sequence[tuple[str, str]], str]]) -> str:
    """The ``llamacpp:*`` families of several llama-server answers as one exposition: each
    (labels to add, text) in order, each family's HELP and TYPE once, its samples together.
    Lines that are not valid (or not ``llamacpp:*``) are dropped. Pure."""
    families: dict[str, Family] = {}
    for extra, text in texts:
        current: Family | None = None
        for raw in text.splitlines():
            line = raw.rstrip("\r")
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2].startswith(PREFIX) and _NAME.fullmatch(parts[2]):
                    fam = families.setdefault(parts[2], Family(parts[2]))
                    value = parts[3] if len(parts) > 3 else ""
                    if parts[1] == "HELP" and fam.help is None:
                        fam.help = value
                    elif parts[1] == "TYPE" and fam.type is None and value in ("counter", "gauge", "histogram", "summary", "untyped"):
                        fam.type = value
                    current = fam
                continue
            if not line.startswith(PREFIX):
                continue
            parsed = _sample(line, extra)
            if parsed is None:
                continue
            name, sample = parsed
            owner = _family_of(name, families, current) or families.setdefault(name, Family(name))
            owner.samples.append(sample)
    out: list[str] = []
    for fam in families.values():
        if not fam.samples:
            continue
        if fam.help is not None:
            out.append(f"# HELP {fam.name} {fam.help}".rstrip())
        if fam.type is not None:
            out.append(f"# TYPE {fam.name} {fam.type}")
        out.extend(fam.samples)
    return "\n".join(out) + "\n" if out else ""


def up_series(up: Sequence[tuple[Sequence[tuple[str, str]], bool]]) -> str:
    """``tokengate_backend_metrics_up``: one sample per backend (labels, relayed or not)."""
    lines = [
        f"# HELP {UP} 1 when this answer carries the backend's llamacpp:* series (0: llama-server runs "
        "without --metrics, is unreachable or slow, or a router's model is not loaded)",
        f"# TYPE {UP} gauge",
    ]
    for labels, ok in up:
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        lines.append(f"{UP}{{{text}}} {1 if ok else 0}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Scraped:
    """One backend's answer: the labels added to its samples, its `up` labels, its text (None:
    not relayed) and its ``Process-Start-Time-Unix``."""

    extra: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    text: str | None
    start: str | None


async def _scrape(
    b: Backend, extra: tuple[tuple[str, str], ...], labels: tuple[tuple[str, str], ...], windows: RateWindows | None
) -> Scraped:
    routed = b.model is not None
    try:
        resp = await b.get("/metrics", timeout=SCRAPE_TIMEOUT_S, routed=routed)
    except httpx.HTTPError:
        return Scraped(extra, labels, None, None)
    if resp.status_code != 200:
        return Scraped(extra, labels, None, None)
    start = resp.headers.get(START_HEADER, "")
    text = resp.text
    if windows is not None:  # the throughput gauges over the client's window, not the gate's last second
        try:
            metrics = parse_metrics(text)
        except ValueError:
            pass  # relayed as sent; merge() drops what is not a valid sample
        else:
            key = window_key(b.url, b.query if routed else "")
            text = rewrite(text, windows.take(key, metrics, resp.headers.get(START_HEADER)))
    return Scraped(extra, labels, text, start if start.isdigit() else None)


def _loaded(b: Backend) -> bool:
    """A router's model answers /metrics only while loaded (asking would load it otherwise)."""
    if b.fleet is None or b.model is None:
        return True
    info = b.fleet.info.get(b.model)
    return info is not None and info.status == "loaded"


async def backend_series(configured: Sequence[Backend], units: Sequence[Backend], windows: RateWindows | None = None) -> tuple[bytes, str]:
    """What follows the gate's own series in ``/metrics``, and its ``Process-Start-Time-Unix``.
    ``windows``: the throughput gauges recomposed over the scraper's window (rate_window.py)."""
    plain_single = len(configured) == 1 and configured[0].fleet is None
    jobs = []
    up: list[tuple[tuple[tuple[str, str], ...], bool]] = []
    for b in units:
        if b.fleet is not None and b.model is not None:
            labels: tuple[tuple[str, str], ...] = (("backend", b.fleet.parent.name), ("model", b.model))
        else:
            labels = (("backend", b.name),)
        if _loaded(b):
            jobs.append(_scrape(b, () if plain_single else labels, labels, windows))
        else:
            up.append((labels, False))
    scraped = list(await asyncio.gather(*jobs))
    up = [(s.labels, s.text is not None) for s in scraped] + up
    body = up_series(up) + merge((s.extra, s.text) for s in scraped if s.text is not None)
    # One plain backend: its own header (its counters' start), as llama-server sends it.
    start = scraped[0].start if plain_single and scraped and scraped[0].start else str(GATE_START)
    return body.encode(), start
