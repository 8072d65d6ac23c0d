#!/usr/bin/env bash
# Runs corral's whole test suite: unit tests, agent and server tests, and the escape suite
# (which starts real sandboxes, so it needs root on Linux with user namespaces and cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "the test suite starts real sandboxes and must run as root" >&2
  exit 1
fi
# Debian's python3 runs inside sandboxes (the base template binds the host's /usr).
if ! [ -x /usr/bin/python3 ]; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends python3
fi

cargo build --workspace --all-targets --locked
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# From here on errors are collected, not fatal: both suites always run, a grep that finds
# nothing is not a failure, and the statuses decide the exit code at the end.
set +e
# The real E2B SDKs (Python sync/async and JS) against a local daemon; creates its own venv.
./scripts/e2b-tests.sh 2>&1 | tee "$log"
e2b_status=${PIPESTATUS[0]}
# Unit, integration and escape tests.
cargo test --workspace --locked --no-fail-fast -- --test-threads=2 2>&1 | tee -a "$log"
cargo_status=${PIPESTATUS[0]}

# One closing line for the whole suite: cargo's per-binary results plus pytest's summary.
passed=$(grep -E '^test result:' "$log" | awk '{n += $4} END {print n + 0}')
failed=$(grep -E '^test result:' "$log" | awk '{n += $6} END {print n + 0}')
py_passed=$(grep -Eo '^[0-9]+ passed' "$log" | awk '{n += $1} END {print n + 0}')
py_failed=$(grep -Eo '[0-9]+ failed' "$log" | grep -v '^0' | awk '{n += $1} END {print n + 0}')
if [ "$e2b_status" != 0 ] || [ "$cargo_status" != 0 ]; then
  failed=$((failed + py_failed + 1))
fi
echo "total: $((passed + py_passed)) passed, $((failed)) failed"
[ "$e2b_status" = 0 ] && [ "$cargo_status" = 0 ]
