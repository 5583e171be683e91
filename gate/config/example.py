"""The annotated example (`tokengate config example`): every key, what it does and its default."""

EXAMPLE_CONFIG = """\
# tokengate.toml: every key, what it does and its default (each comment's "Default:"). The
# values set here are a working start and some differ from the defaults (the classes' shares,
# for one). Every key is optional; delete what you do not need. Check a file with
# `tokengate config check FILE` (add --backends to ask the running llama-server too).
#
# Token counts below are KV-cache tokens: a request costs prompt tokens + max_tokens.

# Class used when a request names none (no tenant class, no X-Tokengate-Class header).
# Default: "interactive" when that class exists, else the highest-priority class.
default_class = "interactive"

[gate]
# Address the gate listens on, "host:port"; IPv6 as "[::1]:8081". Default "127.0.0.1:8081".
# A list listens on each, like llama-server's --host A,B: ["127.0.0.1:8081", "[::1]:8081"].
# Clients talk to this instead of llama-server.
listen = "127.0.0.1:8081"
# A path that is not one of llama-server's routes (the table in gate/data/endpoints.py):
# "forward" relays it with the tenant's authentication (counted in
# tokengate_forwarded_total{route="other"} and journaled), "refuse" answers 404.
# Default "forward".
unknown_routes = "forward"
# SQLite journal (decisions, audit, samples), relative to the working directory.
# Default "tokengate.db".
journal = "tokengate.db"
# Largest request body accepted, in bytes, on every route; bigger gets 413 body_too_large
# before the body is read (Content-Length), or as soon as a chunked body passes it.
# Default 8388608 (8 MiB).
max_body_bytes = 8388608
# Upper bound on one upstream request, in seconds (504 upstream_timeout after it). Default 600.
request_timeout_s = 600.0
# Shedding aborts a running request (503 shed_overrun, or an SSE error event once streaming)
# so it stops holding a slot and KV memory. It judges progress, never mere sharing of busy
# slots: a request is shed when no token came for shed_stall_s seconds (before the first
# token: since dispatch), or when it is older than shed_factor x (its time to first token +
# max_tokens / the per-slot decode rate the backend delivers NOW, at the current occupancy).
# shed_factor must be > 1. Default 2.5.
shed_factor = 2.5
# Seconds without a token before a running request counts as stuck. Default 60.
shed_stall_s = 60.0
# Slow clients. A connection that has not sent its complete request headers within
# header_timeout_s is closed; a body not received within body_timeout_s of the headers gets
# 408 client_stalled; a client that takes in no response bytes for write_stall_s seconds is
# cut off, its upstream request closed and its tokens released (journal: client_stalled).
# Default 10.
header_timeout_s = 10.0
# Default 30.
body_timeout_s = 30.0
# Default 30.
write_stall_s = 30.0
# Streams: the first token is relayed as soon as llama-server sends it; after it, llama-server
# is read at most every stream_batch_ms milliseconds and the tokens that came meanwhile go to
# the client in one write, so a token waits at most this much longer. llama-server sends each
# token on its own, and relayed one by one a fast stream costs the gate a wake-up and a write
# per token. 0: every token as it comes. Default 10.
stream_batch_ms = 10.0
# A request that would be admitted at once even if its prompt were as long as an upper bound of
# it (its JSON's bytes / 3, plus 64) is sent to llama-server while llama-server counts its
# tokens, instead of after: the count's round trip (1-3 ms) leaves the first token's path. The
# count then settles its reservation to the real size; a request whose count exceeds the bound
# and no longer fits is taken back (llama-server's connection closed; its bound held until the
# slot is free) and admitted, queued or refused as counted. false: count, then admit, then
# forward. Default true.
forward_beside_count = true
# Unix socket that consoles attach to (`tokengate console --attach`); never TCP.
# Default "": beside the journal, with .sock for its suffix (tokengate.db -> tokengate.sock).
control_socket = ""
# Group allowed to attach: "" keeps the socket at mode 0600 (only the gate's own user);
# a group name makes it 0660 and owned by that group. Default "".
control_socket_group = ""

# One [[backends]] table per llama-server. Default: one backend "default" at
# http://127.0.0.1:8080 (llama-server's own default address).
[[backends]]
# Unique name, shown in the console, metrics and journal. Default "default".
name = "default"
# Base URL, http(s)://host[:port], no path. Default "http://127.0.0.1:8080". Each backend its
# own llama-server (two on one would count its capacity twice), never the gate's own listen
# address; only router-mode backends (a models list each, no model in both) may share one.
url = "http://127.0.0.1:8080"
# Model names (the request's "model" field) routed to this backend. A model may be routed to
# one backend only. Default [] (no explicit routing).
models = []
# How llama-server shares its KV cache between slots: "auto" (learned from the server where it
# tells: a llama-server on this host, by its -c/-np/-kvu; else unified, with a warning in the log,
# /health and the console), "unified" (one shared pool: -np auto or -kvu; the ceiling is the pool)
# or "split" (-np N without -kvu: per-slot context; the ceiling
# is slots x per-slot context). A learned layout that disagrees overrides this, loudly. Default "auto".
kv = "auto"
# Override the budget ceiling (tokens) read from the backend; must be >= budget.min_tokens (when set).
# Default: unset (use the backend's physical capacity).
# token_budget = 16384
# Most prompt tokens that may be prefilling at once on this backend (a prompt alone may always
# start). Long prefills stall every running decode, so a burst of long prompts waits. Default:
# unset, which derives it from measurements: (budget.slo_ttft_p95_ms - one decode step) x the
# measured prefill rate, so a request behind the burst can still meet the TTFT objective.
# 0 means no cap.
# max_prefill_tokens = 8192
# A prompt longer than this (tokens) does not start while a request of a higher-priority class
# waits or is still prefilling: one long prefill stalls every slot for its whole length, so it
# goes between interactive requests, not in front of them. 0 = never yield. Default 512.
prefill_yield_tokens = 512
# Name of an environment variable holding the API key the gate sends upstream
# (llama-server --api-key). Without [[tenants]], clients must present this key too, as
# they would to llama-server itself. Default: unset (send none).
# api_key_env = "LLAMA_API_KEY"
# Router mode: llama-server started with --models-dir DIR or --models-preset FILE and no -m
# runs one child process per model, loaded on demand. The gate notices it (/props says
# "role": "router") and treats each name in `models` as its own capacity unit (slots, budget,
# queues); `models` must then list the models to serve. Requests for a model that is not loaded
# wait in the gate while it loads; a request must name its model, as llama-server asks.
#
# pin: models the gate keeps loaded and never evicts to make room for another (with
# --models-max N); pins that take every place leave the other models unservable (503
# model_unavailable; `config check --backends` warns). Default [] (none pinned).
pin = []
# What a cold start costs, in seconds: a loaded model idle for less than this is not evicted
# for another one (it would likely be needed again before the load paid off). Default: unset
# (each model's own measured load time).
# cold_start_s = 2.0

[budget]
# "adaptive": the controller moves the working budget between min_tokens and the backend's
# ceiling, steered by upstream latency against the SLOs below. "static": the budget stays at
# the ceiling (or token_budget). Default "adaptive".
mode = "adaptive"
# Smallest budget the controller may choose, in tokens. The classes' reserved_tokens must add
# up to no more than this. 0 = auto: a quarter of each backend's ceiling, never below the
# classes' reservations, so the controller has room on any pool. Default 0.
min_tokens = 0
# Target p95 time-to-first-token measured upstream (from dispatch, not queue time), in
# milliseconds; the controller steers by it. It is also the TTFT objective (from arrival) of
# every class that sets no ttft_objective_ms of its own. Default 2000.
slo_ttft_p95_ms = 2000.0
# Target p95 time per output token, in milliseconds. Default: unset (TTFT only).
# slo_tpot_p95_ms = 100.0
# Sliding window the p95 values are computed over, in seconds. Default 30.
window_s = 30.0
# Least time between two budget moves, in seconds. Default 5.
cooldown_s = 5.0
# Factor applied when latency is well under the SLO and there is demand. Must be > 1. Default 1.1.
increase = 1.1
# Factor applied when latency is over the SLO. Must be between 0 and 1. Default 0.8.
decrease = 0.8
# Fewest upstream samples in the window for a p95, before the controller closes the budget.
# With fewer (a quiet hour after an overload) it only reopens, and only while every sample is
# well under the SLO and requests wait. Default 20.
min_samples = 20
# No starvation: a request that has waited this long (seconds) gets a bounded share ahead of
# the higher classes: within its class's reserved_tokens, or one request per aging_s (the
# minimum rate), never more. The minimum rate needs no wait: a class that has started nothing
# for aging_s has its oldest request (or its next) take the next free slot, so a class whose
# requests are refused or served before they age (a TTFT objective) is not starved either.
# With its turn a request stops yielding its prefill, and no class borrows
# past its reserved_tokens until it has started. An operator's budget (static mode, or the
# controller frozen) still holds. The adaptive controller's budget is an estimate, not a
# limit: a request larger than it waits instead of a 429, and once aged (or with its class's
# minimum-rate turn, when its TTFT objective ends before it could age) it may start above
# it (never above the ceiling), so the controller at min_tokens cannot starve a class. Off
# with 0. Default 5.
aging_s = 5.0
# Priority when nobody waits: a lower class does not take the free slots that the higher
# classes' recent arrivals (their rate over the last ~10 s x their mean slot hold) say they will
# need beside what they hold, so a chat arriving finds a slot free instead of a batch job in
# it. The lower class keeps its bounded share (aging_s above). false: the first to arrive
# takes a free slot, whatever its class. Default true.
keep_slots = true

# One [classes.NAME] table per priority class; names use a-z 0-9 _ -. Without any [classes],
# these two are built in as written here, except that neither reserves nor limits tokens
# (interactive's reserved_tokens 0, batch's limit_tokens unset). Defining any class replaces both.
[classes.interactive]
# Higher is served first. Required for every class you define.
priority = 10
# Tokens guaranteed to this class: the other classes never use them, even while it is idle
# (they are held back for it, so its next request starts at once).
# On a backend whose ceiling is under twice the classes' reservations together, each is
# scaled down in proportion to half that ceiling, so the other classes and the controller keep
# room on any pool (a warning at start and in /health says what is in force).
# Default 0.
reserved_tokens = 1024
# Most tokens this class may hold in flight, borrowing included; >= reserved_tokens, and above
# default_max_tokens (else a request without max_tokens never fits: a warning).
# Default: unset (may borrow up to the whole budget).
# limit_tokens = 8192
# Most requests waiting in this class's queue; more are refused with 429 queue_full.
# At most 1,048,576 (each waiter holds an open connection). Default 64.
queue_depth = 64
# Longest wait in the queue, in seconds; then 429 queue_timeout. A backstop: the TTFT objective
# below refuses a request that cannot make it long before. Default 10.
queue_timeout_s = 10.0
# Time-to-first-token objective of this class, in ms from the request's arrival. A request that
# would have to wait is refused at once (429 queue_timeout, Retry-After = its expected wait)
# when its expected wait (from the measured slot hold times) plus its expected first-token time
# (the fitted prefill model, else the first-token time measured lately) passes it; a waiter is
# refused as soon as it is expected to miss. So what is admitted is served in time, and the
# rest is told at once. The console says when it is not in force (nothing measured yet).
# Default: unset, which uses budget.slo_ttft_p95_ms.
# ttft_objective_ms = 2000.0
# max_tokens assumed AND injected upstream when a request gives none (n_predict on /completion,
# max_output_tokens on the Responses API), so the worst case is bounded. Must be <= max_tokens_cap.
# Default 512.
default_max_tokens = 256
# Largest max_tokens (under any of its names) a request of this class may ask for. Default 4096.
max_tokens_cap = 4096
# Models to try, in order, when the requested model is saturated (would queue), still loading
# (router mode), or refuses the request; each must be in some backend's `models`, e.g.
# ["tiny2"]. The answer's X-Tokengate-Model header names the model that answered. Default [].
fallback = []

[classes.batch]
priority = 1
reserved_tokens = 0
# Keep batch work from taking the whole budget.
limit_tokens = 16384
queue_depth = 256
queue_timeout_s = 120.0
default_max_tokens = 512
max_tokens_cap = 4096

# Tenant limits shared by several gates (one per GPU host, behind a router). With redis_url
# set, each tenant's requests_per_minute, tokens_per_minute and max_tokens_in_flight hold
# across every gate that points at the same Redis and key_prefix; configure the same
# [[tenants]] on each of them. The token budget, classes and slots stay local to each gate.
[shared]
# Redis to share them through: "redis://[:password@]host[:port][/db]", "rediss://..." (TLS)
# or "unix:///path/to/redis.sock". Default "": off, every gate enforces its limits alone.
redis_url = ""
# Prefix of every key the gates write. Gates share limits only with gates using the same one.
# Default "tokengate:".
key_prefix = "tokengate:"
# What admission does while Redis is unreachable or does not answer within wait_ms:
# "fail_open" admits under local limits of 1/N of each tenant's limits (N = the most gates
# seen on Redis within 3 renewal intervals), counting what the gate already holds;
# "fail_closed" refuses limited tenants' requests with 429 shared_limit_unavailable and
# Retry-After. Counted in metrics, audited when it flips. Default "fail_open".
failure_policy = "fail_open"
# How often each gate renews its in-flight reservations (leases) and says it is alive, in
# seconds. A gate that dies holds its reservations for at most 3x this. Default 1.
renew_interval_s = 1.0
# How long Redis may take to answer one admission, in milliseconds; then the failure policy
# applies. Time the gate's own loop was busy elsewhere (a burst, a loaded host) is not
# counted: admission then waits longer instead. Redis's own time is counted, and a Redis
# starved of CPU on a loaded host can take tens of milliseconds: at 20, a trial's bursts
# (two gates and Redis on one loaded 2-core host) flipped a gate in 4 bursts of 4, at 100 in
# none of 3. A Redis that is down is noticed at once, whatever this says. Default 100.
wait_ms = 100.0

# One [[tenants]] table per client. With no tenants the gate is open: the class comes from the
# X-Tokengate-Class header or default_class, the tenant from the request's "user" field or the
# client address. With tenants, every request that reaches llama-server needs a tenant's API key
# (Authorization: Bearer KEY, or X-Api-Key: KEY as the Anthropic SDK sends it); /health and
# /metrics stay open for probes and scrapers. Uncomment to use:
#
# [[tenants]]
# # Unique name, shown in the console and journal.
# name = "team-a"
# # Environment variable holding this tenant's API key (read when the gate starts).
# # Give exactly one of api_key_env or api_key_sha256.
# api_key_env = "TOKENGATE_KEY_TEAM_A"
# # Class used when the request names none. Default: default_class.
# class = "interactive"
# # Classes this tenant may ask for (X-Tokengate-Class); must include its own class.
# # Default [] (only its own class).
# allowed_classes = ["interactive", "batch"]
# # Share of its class's capacity relative to other tenants (deficit round robin, in tokens).
# # Default 1.0.
# weight = 2.0
# # Most tokens this tenant may hold in flight; a larger single request gets 429 tenant_quota.
# # Default: unset (no quota).
# max_tokens_in_flight = 8192
# # Token-bucket rate limits, per minute; 429 rate_limited beyond them. Default: unset.
# requests_per_minute = 600
# tokens_per_minute = 200000
# # Replaces its class's fallback list of models when not empty. Default [].
# fallback = []
# # May call the routes that change llama-server: POST /props, POST /lora-adapters,
# # POST /slots/N?action=save|restore|erase, router POST /models/load|unload, POST and
# # DELETE /models. Each call is audited. Others get 403. Default false.
# operator = false
#
# [[tenants]]
# name = "nightly-batch"
# # sha256 of the API key as 64 lowercase hex characters: printf %s "$KEY" | sha256sum
# api_key_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
# class = "batch"

# Other gates, for the fleet console: `tokengate console --attach --config FILE` shows one row per
# [[fleet]] gate (budget, in flight, queued, denials/min, p95 TTFT vs SLO, shared limits) and
# Enter opens that gate's full console. A gate ignores this list. Uncomment to use:
#
# [[fleet]]
# # Name in the fleet's row and in every toast and dialog about that gate; unique.
# # Default: the socket file's name without .sock.
# name = "gpu-1"
# # That gate's control socket (see [gate] control_socket); a remote one forwarded over SSH:
# # ssh -N -L /tmp/gpu-2.sock:/run/tokengate/tokengate.sock gpu-2. Required.
# socket = "/run/tokengate/tokengate.sock"
#
# [[fleet]]
# name = "gpu-2"
# socket = "/tmp/gpu-2.sock"
"""
