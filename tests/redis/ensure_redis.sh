#!/usr/bin/env bash
# `make test` runs tests against a real redis-server (tests/redis/server.py): install the
# Debian package when it is missing. Quiet; sudo only when not root. Prints its path.
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    echo "installing redis-server (Debian package) for the tests" >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
command -v redis-server
