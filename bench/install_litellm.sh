#!/usr/bin/env bash
# The LiteLLM proxy, bench/overhead.py's Python peer, in a venv of its own: it pins
# many packages (fastapi, pydantic, httpx, ...) that would fight the gate's, so it
# never goes into the project's .venv. Reused when already there; no network then.
# Prints the litellm executable's path on the last line of stdout.
set -euo pipefail

LITELLM_VERSION=1.108.7  # keep in step with LITELLM_VERSION in bench/overhead.py
PYTHON="${PYTHON:-python3}"
cache_root="${TOKENGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tokengate}"
dest="$cache_root/litellm-$LITELLM_VERSION"
bin="$dest/bin/litellm"

if [[ -x "$bin" ]]; then
  echo "litellm: cached at $bin" >&2
  echo "$bin"
  exit 0
fi

echo "litellm: installing litellm[proxy]==$LITELLM_VERSION into $dest" >&2
# A venv left half-made by an interrupted run is reused: pip finishes the job.
"$PYTHON" -m venv "$dest"
"$dest/bin/python" -m pip install --quiet --upgrade pip >&2
"$dest/bin/python" -m pip install --quiet "litellm[proxy]==$LITELLM_VERSION" >&2
echo "$bin"
