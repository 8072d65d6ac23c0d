#!/usr/bin/env python3
"""Daemon benchmark (not a test): create-to-ready latency, exec round trip, create+exec+kill
throughput with concurrent clients, and host memory per idle sandbox.

Starts its own `corral serve` on a free loopback port with a scratch data dir, so it never
touches a daemon you run. Standard library only.

    python3 bench/daemon.py [--corral target/release/corral] [--iterations 200] [--idle 100,1000]
"""
import argparse
import http.client
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def percentile(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    pos = (len(values) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


class Client:
    """One keep-alive HTTP connection, like an SDK client holds."""

    def __init__(self, port, key):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body)
        self.conn.request(method, path, body=data, headers=self.headers)
        resp = self.conn.getresponse()
        payload = resp.read()
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path} -> {resp.status} {payload[:300]!r}")
        return json.loads(payload) if payload else None

    def create(self, **spec):
        return self.call("POST", "/v1/sandboxes", spec)["id"]

    def exec_true(self, sid):
        result = self.call("POST", f"/v1/sandboxes/{sid}/exec?wait=true", {"argv": ["true"]})
        if result.get("exit_code") != 0:
            raise RuntimeError(f"exec failed: {result}")

    def kill(self, sid):
        self.call("DELETE", f"/v1/sandboxes/{sid}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mem_available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable")


def start_daemon(corral, data_dir, port):
    key = "crl_bench_" + os.urandom(8).hex()
    env = dict(os.environ, CORRAL_API_KEY=key, RUST_LOG="warn")
    # A log file, not a pipe: an unread pipe fills up and blocks the daemon's logging.
    log = open(os.path.join(data_dir, "daemon.log"), "w")
    proc = subprocess.Popen(
        [corral, "serve", "--kill-sandboxes-on-exit", "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, key
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited: {open(os.path.join(data_dir, 'daemon.log')).read()}")
            time.sleep(0.05)
    raise RuntimeError("daemon did not start")


def bench_latency(client, iterations):
    create, exec_rtt, kill = [], [], []
    for _ in range(iterations):
        t0 = time.perf_counter()
        sid = client.create()
        t1 = time.perf_counter()
        client.exec_true(sid)  # warm the connection's path once
        t2 = time.perf_counter()
        client.exec_true(sid)
        t3 = time.perf_counter()
        client.kill(sid)
        t4 = time.perf_counter()
        create.append((t1 - t0) * 1000)
        exec_rtt.append((t3 - t2) * 1000)
        kill.append((t4 - t3) * 1000)
    return create, exec_rtt, kill


def bench_throughput(port, key, clients, seconds):
    done = [0] * clients
    errors = []
    stop = time.time() + seconds

    def worker(i):
        client = Client(port, key)
        try:
            while time.time() < stop:
                sid = client.create()
                client.exec_true(sid)
                client.kill(sid)
                done[i] += 1
        except Exception as exc:  # reported, not hidden
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return sum(done) / elapsed, errors


def bench_idle_memory(client, daemon_pid, count):
    before = mem_available_kib()
    ids = []
    t0 = time.perf_counter()
    for _ in range(count):
        ids.append(client.create(memory="64M", timeout=3600))
    elapsed = time.perf_counter() - t0
    time.sleep(2)
    after = mem_available_kib()
    for sid in ids[:5]:
        client.exec_true(sid)  # all still answer
    listed = len(client.call("GET", "/v1/sandboxes?state=running")["sandboxes"])
    per_sandbox_kib = (before - after) / count
    for sid in ids:
        client.kill(sid)
    return per_sandbox_kib, listed, elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corral", default="target/release/corral")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--idle", default="100,1000")
    parser.add_argument("--out", default="bench/out/daemon.md")
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="corral-bench-", dir="/tmp")
    os.chmod(data_dir, 0o711)
    port = free_port()
    daemon, key = start_daemon(args.corral, data_dir, port)
    lines = []
    try:
        client = Client(port, key)
        for _ in range(10):  # warm-up
            sid = client.create()
            client.exec_true(sid)
            client.kill(sid)
        create, exec_rtt, kill = bench_latency(client, args.iterations)
        rate, errors = bench_throughput(port, key, 2, args.seconds)
        lines.append(f"# corral daemon benchmark\n\n`{' '.join(sys.argv)}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                     f"load {os.getloadavg()[0]:.2f}, {args.iterations} iterations\n")
        lines.append("| metric | p50 | p99 | mean |\n|---|---:|---:|---:|")
        for name, values in [("create-to-ready (ms)", create), ("exec round trip of `true` (ms)", exec_rtt), ("kill (ms)", kill)]:
            lines.append(f"| {name} | {percentile(values, .5):.2f} | {percentile(values, .99):.2f} | {statistics.mean(values):.2f} |")
        lines.append(f"\ncreate+exec+kill with 2 concurrent clients: **{rate:.0f} per second** over {args.seconds:.0f} s"
                     + (f" ({len(errors)} errors: {errors[:3]})" if errors else ""))
        for count in [int(c) for c in args.idle.split(",") if c]:
            per_kib, listed, elapsed = bench_idle_memory(Client(port, key), daemon.pid, count)
            lines.append(f"\n{count} idle sandboxes: {per_kib / 1024:.2f} MiB of host memory each "
                         f"(MemAvailable drop / count), {listed} listed as running, created in {elapsed:.1f} s")
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(data_dir, ignore_errors=True)
    report = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
