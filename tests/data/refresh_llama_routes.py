"""Refresh tests/data/llama_server_routes.txt from a llama.cpp source tree.

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/sdist
    tar xzf /tmp/sdist/llama_cpp_python-0.3.36.tar.gz -C /tmp/sdist
    python tests/data/refresh_llama_routes.py /tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp \
        > tests/data/llama_server_routes.txt

It reads every literal route registration: `ctx_http.get|post|del("...")` in
tools/server/server.cpp, and the web UI's own `srv->Get(params.api_prefix + "/...")` in
tools/server/server-http.cpp (the UI's bundled assets have computed names; the gate forwards
them as the UI's `GET /*` entry). The Google Cloud `/predict` route (only with AIP_MODE set)
is registered under a name from the environment and is listed by hand.
tests/unit/test_endpoints.py then checks gate/data/endpoints.py against the list.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_CTX = re.compile(r'ctx_http\.(get|post|del)\s*\(\s*"([^"]+)"')
_UI = re.compile(r'srv->Get\(params\.api_prefix \+ "([^"]+)"')
_METHOD = {"get": "GET", "post": "POST", "del": "DELETE"}


def routes(root: Path) -> list[str]:
    server = root / "tools/server/server.cpp"
    found = {f"{_METHOD[m]} {p}" for m, p in _CTX.findall(server.read_text())}
    found |= {f"GET {p}" for p in _UI.findall((root / "tools/server/server-http.cpp").read_text())}
    found.add("POST /predict")  # server-http.cpp register_gcp_compat: AIP_PREDICT_ROUTE, default /predict
    return sorted(found, key=lambda r: (r.split()[1], r.split()[0]))


def main() -> None:
    root = Path(sys.argv[1])
    print(f"# llama-server's routes, from {root.name}/tools/server/server.cpp and server-http.cpp")
    print("# of llama.cpp commit 0c1e570 (vendored in the llama-cpp-python==0.3.36 sdist).")
    print("# Refresh: python tests/data/refresh_llama_routes.py <llama.cpp dir> (see its docstring).")
    for r in routes(root):
        print(r)


if __name__ == "__main__":
    main()
