#!/usr/bin/env bash
# E2B compatibility suite: the real `e2b` and `e2b-code-interpreter` Python SDKs (sync and
# async) and the JS SDK `@e2b/code-interpreter`, unmodified, against a local corral daemon
# that they reach only through E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.
#
# Needs root (sandboxes), python3 with venv, and network access to PyPI/npm the first time
# (the venv in target/e2b-venv and node_modules in target/e2b-node are reused afterwards).
# Set E2B_SKIP_JS=1 to skip the JS SDK. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if [ "$(id -u)" != 0 ]; then
  echo "the E2B suite starts real sandboxes and must run as root" >&2
  exit 1
fi

# Sandboxes run the host's Debian python3; the rich-output test plots with its matplotlib.
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  echo "== installing python3-matplotlib"
  apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-matplotlib >/dev/null
fi

venv=target/e2b-venv
python_deps=("e2b==2.63.0" "e2b-code-interpreter==2.11.5" "pytest" "pytest-asyncio")
if ! "$venv/bin/python" - <<'EOF' 2>/dev/null; then
import importlib.metadata as m
assert m.version("e2b") == "2.63.0" and m.version("e2b-code-interpreter") == "2.11.5"
import pytest, pytest_asyncio  # noqa: F401
EOF
  echo "== creating $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${python_deps[@]}"
fi

echo "== building the daemon"
cargo build -p corral

data=$(mktemp -d /tmp/corral-e2b.XXXXXX)
chmod 0711 "$data"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Shaped like an E2B key (older SDKs check the format); corral accepts whatever it is given.
key="e2b_$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')"

CORRAL_API_KEY="$key" target/debug/corral serve --kill-sandboxes-on-exit --listen "127.0.0.1:$port" --data-dir "$data" >"$data/daemon.log" 2>&1 &
daemon=$!
stop_daemon() {
  if kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$daemon" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$daemon" 2>/dev/null || true
  fi
  wait "$daemon" 2>/dev/null || true
  if [ "${status:-1}" != 0 ] && [ -f "$data/daemon.log" ]; then
    echo "== last daemon log lines"
    tail -n 40 "$data/daemon.log" || true
  fi
  rm -rf "$data"
}
trap stop_daemon EXIT

for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$port/v1/health" >/dev/null 2>&1 && break
  kill -0 "$daemon" 2>/dev/null || { echo "the daemon exited:"; cat "$data/daemon.log"; exit 1; }
  sleep 0.1
done

export E2B_API_URL="http://127.0.0.1:$port" E2B_SANDBOX_URL="http://127.0.0.1:$port" E2B_API_KEY="$key"
status=0

echo "== Python SDK scenarios"
"$venv/bin/python" -m pytest -c tests/e2b/pytest.ini tests/e2b -q -rfE "$@" || status=$?

if [ "${E2B_SKIP_JS:-0}" != 1 ]; then
  echo "== JS SDK scenario"
  if ! command -v node >/dev/null || [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
    echo "node 20 or later is required for the JS SDK scenario" >&2
    status=1
  else
    mkdir -p target/e2b-node
    if ! [ -d target/e2b-node/node_modules/@e2b/code-interpreter ]; then
      (cd target/e2b-node && { [ -f package.json ] || echo '{"private": true, "type": "module"}' >package.json; } \
        && npm install --silent --no-audit --no-fund @e2b/code-interpreter@2.8.0)
    fi
    # ESM resolves packages next to the script, so it runs from there.
    cp tests/e2b/js/smoke.mjs target/e2b-node/smoke.mjs
    node target/e2b-node/smoke.mjs || status=$?
  fi
fi

cd "$root"
if [ "$status" = 0 ]; then echo "== E2B suite passed"; else echo "== E2B suite FAILED"; fi
exit "$status"
