#!/bin/sh
# `make test` checks and unit-tests the alert rules with promtool: install it when it is missing
# (Debian/Ubuntu package `prometheus`, which ships promtool). Prints promtool's path.
set -eu

if command -v promtool >/dev/null 2>&1; then
    command -v promtool
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_promtool: promtool is missing and there is no apt-get here; install promtool (it comes with Prometheus) and run again" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
echo "ensure_promtool: installing the Debian package prometheus (for promtool)" >&2
# A fresh machine may have no package lists yet: update once if the first try cannot find it.
if ! $SUDO apt-get install -y --no-install-recommends prometheus >&2; then
    $SUDO apt-get update >&2
    $SUDO apt-get install -y --no-install-recommends prometheus >&2
fi
command -v promtool
