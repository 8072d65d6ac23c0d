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
# The real E2B SDKs (Python sync/async and JS) against a local daemon; creates its own venv.
./scripts/e2b-tests.sh
# Unit, integration and escape tests last, so their summary closes the output.
cargo test --workspace --locked -- --test-threads=2
