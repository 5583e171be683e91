"""``tokengate crunch``: measure a llama-server before choosing a token budget.

Run it against llama-server itself, never through the gate. It sweeps a grid of cells,
concurrency (1, 2, 4, ... up to twice the server's slots) x context length (512, 1K, 2K, 4K
that fit the per-slot context), and in each cell keeps ``concurrency`` streaming requests in
flight: a prompt of about ctx/2 tokens (plain words, measured with ``/tokenize``) and
``max_tokens`` = min(ctx/4, --max-tokens) with ``ignore_eos`` so every request generates exactly
that many tokens. Per request it measures the time to the first SSE data chunk (TTFT) and the
time per output token after it ((last - first) / (tokens - 1)); per cell it reports the p95 of
both (nearest rank, the same percentile the adaptive controller uses) and the tokens the cell
holds in flight: concurrency x (prompt + max_tokens), the quantity the gate budgets. Above the
slot count the extra requests only wait in llama-server's queue, holding no KV cache (and the
gate never lets llama-server queue), so the recommendation counts at most ``slots`` of them.

A cell breaches when its p95 TTFT or p95 time per token is over the objective, or when any of
its requests failed (an HTTP error, a 500 "Context size has been exceeded", an error event in
the stream, a timeout; a 500 "Context size has been exceeded" is named as an overfilled KV
cache). The recommended budget is 75% of the largest in-flight count among the cells that did
not breach (in flight counted as above), never below one slot's context (split: per slot;
unified: the pool): token_budget is the gate's ceiling and caps one request, so less refuses
(400) requests llama-server serves; a lower latency figure becomes ``min_tokens``, the adaptive
controller's floor, and the report says so. Raised further, within what the server holds, so
every class of the config reaches a slot beside the others' reservations; a reservation is
never changed without a note saying why, and never cut to 0. Printed as config edits and a
snippet.

One module per concept; the flow is inputs -> plan -> runner (I/O) -> report:

``inputs``
    pure: parsing the --ctx and --concurrency lists and the server URL, and the plain-word
    prompt text (:func:`word_sequence`, :func:`rotated_text`).
``plan``
    pure: the defaults, the grid of cells, the percentile, a cell's evaluation and breach
    reasons (:func:`evaluate_cell`), and the recommended budget (:func:`recommend`).
``runner``
    the async I/O on httpx: :func:`run_crunch` with :class:`CrunchSettings` reads
    ``/props``, sizes the prompts with ``/tokenize`` and measures each cell's requests.
``report``
    pure: :class:`ServerInfo`, :class:`CrunchReport`, the per-cell line, the human report,
    the tokengate.toml snippet and the JSON form.
``progress``
    :class:`Progress`, the progress bar on stderr.
``errors``
    :class:`CrunchError` and its subclasses, with the CLI's exit codes.

Import from ``gate.crunch``, as before the split; the submodules are its layout, not its
interface.
"""

from __future__ import annotations

from gate.tools.crunch.errors import CrunchError, CrunchUnreachable, CrunchUsageError
from gate.tools.crunch.inputs import normalize_url, parse_ctx_list, parse_int_list, rotated_text, word_sequence
from gate.tools.crunch.plan import (
    DEFAULT_CTX,
    DEFAULT_MAX_TOKENS,
    DEFAULT_SLO_TTFT_MS,
    ENDPOINT_PATHS,
    RECOMMEND_FRACTION,
    Cell,
    CellResult,
    Endpoint,
    PrefillAdvice,
    Recommendation,
    RequestResult,
    Slo,
    breach_reasons,
    build_grid,
    concurrency_levels,
    ctx_levels,
    evaluate_cell,
    max_tokens_for,
    percentile,
    prefill_advice,
    prompt_target,
    recommend,
    requests_for,
)
from gate.tools.crunch.progress import Progress
from gate.tools.crunch.report import (
    CrunchReport,
    ServerInfo,
    cell_line,
    config_snippet,
    ctx_label,
    format_report,
    report_to_json,
)
from gate.tools.crunch.runner import CrunchSettings, run_crunch, write_json

# The old module's __all__, unchanged. Also public and re-exported above, but not listed:
# DEFAULT_SLO_TTFT_MS, ENDPOINT_PATHS, Endpoint, breach_reasons, rotated_text, write_json.
__all__ = [
    "DEFAULT_CTX",
    "DEFAULT_MAX_TOKENS",
    "RECOMMEND_FRACTION",
    "Cell",
    "CellResult",
    "CrunchError",
    "CrunchReport",
    "CrunchSettings",
    "CrunchUnreachable",
    "CrunchUsageError",
    "Progress",
    "Recommendation",
    "RequestResult",
    "ServerInfo",
    "Slo",
    "build_grid",
    "cell_line",
    "concurrency_levels",
    "config_snippet",
    "ctx_label",
    "ctx_levels",
    "evaluate_cell",
    "format_report",
    "max_tokens_for",
    "normalize_url",
    "parse_ctx_list",
    "parse_int_list",
    "percentile",
    "prompt_target",
    "recommend",
    "report_to_json",
    "requests_for",
    "run_crunch",
    "word_sequence",
]
