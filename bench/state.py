#!/usr/bin/env python3
"""State benchmark (not a test): snapshot of a sandbox with 100 MB of changed files, create from
that snapshot, fork into 10, pause and resume, warm-pool create versus cold create.

Starts its own `corral serve` on a free loopback port with a scratch data dir (log in a file),
so it never touches a daemon you run. Standard library only.

    python3 bench/state.py [--corral target/release/corral] [--iterations 100] [--mb 100]

The in-daemon time of a create is read from the `Server-Timing: create;dur=<ms>;desc="pool"|"cold"`
header the daemon sets: time spent in the manager, without HTTP parsing and serialization.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import Client, free_port, percentile, start_daemon  # noqa: E402

TIMING = re.compile(r'dur=([0-9.]+);desc="(\w+)"')


class StateClient(Client):
    def timed(self, method, path, body=None):
        """(answer, ms through HTTP, response headers)."""
        data = None if body is None else json.dumps(body)
        t0 = time.perf_counter()
        self.conn.request(method, path, body=data, headers=self.headers)
        resp = self.conn.getresponse()
        payload = resp.read()
        ms = (time.perf_counter() - t0) * 1000
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path} -> {resp.status} {payload[:300]!r}")
        return (json.loads(payload) if payload else None), ms, resp.headers

    def sh(self, sid, cmd):
        result = self.call("POST", f"/v1/sandboxes/{sid}/exec?wait=true", {"cmd": cmd, "timeout": 300})
        if result.get("exit_code") != 0:
            raise RuntimeError(f"exec {cmd!r} failed: {result}")
        return result["stdout"]

    def pool(self, template="base"):
        for p in self.call("GET", "/v1/pools")["pools"]:
            if p["template"] == template:
                return p
        return None

    def wait_pool_quiet(self, want_ready=1, timeout=60):
        """Until the pool has `want_ready` ready and is starting none: the daemon is idle."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = self.pool()
            if p and p["ready"] >= want_ready and p["starting"] == 0:
                return p
            time.sleep(0.005)
        raise RuntimeError(f"pool did not fill: {self.pool()}")


def stats(values):
    return f"{percentile(values, .5):.2f} | {percentile(values, .99):.2f} | {statistics.mean(values):.2f}"


def bench_snapshots(c, mb):
    sid = c.create(memory="1G", disk="2G", timeout=3600)
    files = 10
    c.sh(sid, f"mkdir -p /home/user/data && for i in $(seq {files}); do head -c {mb // files}M /dev/urandom > /home/user/data/f$i; done")
    c.sh(sid, "python3 -c 'import os; os.makedirs(\"/home/user/small\", exist_ok=True)' && "
              "for i in $(seq 200); do echo $i > /home/user/small/$i.txt; done")
    snaps, snap_ms, frozen_ms = [], [], []
    for i in range(3):
        info, ms, _ = c.timed("POST", f"/v1/sandboxes/{sid}/snapshots", {"name": f"bench-{i}"})
        snaps.append(info)
        snap_ms.append(ms)
        frozen_ms.append(info.get("frozen_ms", 0))
    snap = snaps[0]
    restore_ms = []
    for _ in range(5):
        info, ms, _ = c.timed("POST", "/v1/sandboxes", {"from_snapshot": snap["id"], "memory": "1G", "disk": "2G"})
        restore_ms.append(ms)
        # The files are there (checked once, outside the timing).
        if len(restore_ms) == 1:
            size = c.sh(info["id"], "du -sm /home/user/data | cut -f1").strip()
            if int(size) < mb * 0.95:
                raise RuntimeError(f"restored sandbox holds {size} MB")
        c.kill(info["id"])
    fork_ms = []
    for _ in range(2):
        answer, ms, _ = c.timed("POST", f"/v1/sandboxes/{sid}/fork", {"count": 10})
        fork_ms.append(ms)
        for s in answer["sandboxes"]:
            c.kill(s["id"])
    small = c.create(timeout=3600)
    c.sh(small, "echo hi > /home/user/note")
    fork_small_ms = []
    for _ in range(3):
        answer, ms, _ = c.timed("POST", f"/v1/sandboxes/{small}/fork", {"count": 10})
        fork_small_ms.append(ms)
        for s in answer["sandboxes"]:
            c.kill(s["id"])
    c.kill(small)
    c.kill(sid)
    return {"snap": snap, "snap_ms": snap_ms, "frozen_ms": frozen_ms, "restore_ms": restore_ms,
            "fork_ms": fork_ms, "fork_small_ms": fork_small_ms}


def bench_pause(c, rounds):
    sid = c.create(timeout=3600)
    c.call("POST", f"/v1/sandboxes/{sid}/exec?wait=true", {"cmd": "sleep 3600", "background": True})
    pause, resume = [], []
    for _ in range(rounds):
        _, ms, _ = c.timed("POST", f"/v1/sandboxes/{sid}/pause")
        pause.append(ms)
        _, ms, _ = c.timed("POST", f"/v1/sandboxes/{sid}/resume")
        resume.append(ms)
    c.sh(sid, "true")  # still answers
    c.kill(sid)
    return pause, resume


def bench_creates(c, iterations, pooled):
    http_ms, daemon_ms, sources = [], [], []
    for _ in range(iterations):
        if pooled:
            c.wait_pool_quiet()
        body = {"env": {"BENCH": "1"}, "metadata": {"bench": "state"}, "memory": "256M", "timeout": 600}
        info, ms, headers = c.timed("POST", "/v1/sandboxes", body)
        m = TIMING.search(headers.get("server-timing", ""))
        http_ms.append(ms)
        if m:
            daemon_ms.append(float(m.group(1)))
            sources.append(m.group(2))
        c.kill(info["id"])
    return http_ms, daemon_ms, sources


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corral", default="target/release/corral")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--pause-rounds", type=int, default=50)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--out", default="bench/out/state.md")
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="corral-bench-", dir="/tmp")
    os.chmod(data_dir, 0o711)
    port = free_port()
    daemon, key = start_daemon(args.corral, data_dir, port)
    lines = []
    try:
        c = StateClient(port, key)
        for _ in range(5):  # warm-up
            c.kill(c.create())
        snap = bench_snapshots(c, args.mb)
        pause, resume = bench_pause(c, args.pause_rounds)
        cold_http, cold_daemon, cold_src = bench_creates(c, args.iterations, pooled=False)
        c.call("PUT", "/v1/pools/base", {"min": 2, "max": 4, "idle_secs": 600})
        bench_creates(c, 5, pooled=True)  # warm-up
        warm_http, warm_daemon, warm_src = bench_creates(c, args.iterations, pooled=True)
        pool = c.pool()

        s = snap["snap"]
        lines.append(f"# corral state benchmark\n\n`{' '.join(sys.argv)}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                     f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs\n")
        lines.append("| operation | p50 (ms) | p99 (ms) | mean (ms) | n | target |\n|---|---:|---:|---:|---:|---|")
        lines.append(f"| snapshot, {s['file_bytes'] / 2**20:.0f} MiB of changed files ({s['layer_bytes'] / 2**20:.0f} MiB stored, zstd) | {stats(snap['snap_ms'])} | {len(snap['snap_ms'])} | ≤ 1000 |")
        lines.append(f"| … of which the sandbox was frozen | {stats(snap['frozen_ms'])} | {len(snap['frozen_ms'])} | |")
        lines.append(f"| create from that snapshot (until ready) | {stats(snap['restore_ms'])} | {len(snap['restore_ms'])} | ≤ 300 |")
        lines.append(f"| fork the {args.mb} MiB sandbox into 10 | {stats(snap['fork_ms'])} | {len(snap['fork_ms'])} | ≤ 2000 |")
        lines.append(f"| fork a sandbox with one small file into 10 | {stats(snap['fork_small_ms'])} | {len(snap['fork_small_ms'])} | ≤ 2000 |")
        lines.append(f"| pause (HTTP) | {stats(pause)} | {len(pause)} | ≤ 10 |")
        lines.append(f"| resume (HTTP) | {stats(resume)} | {len(resume)} | ≤ 10 |")
        lines.append(f"| cold create (HTTP) | {stats(cold_http)} | {len(cold_http)} | |")
        lines.append(f"| cold create (in daemon) | {stats(cold_daemon)} | {len(cold_daemon)} | |")
        lines.append(f"| warm-pool create (HTTP) | {stats(warm_http)} | {len(warm_http)} | p50 ≤ 3 |")
        lines.append(f"| warm-pool create (in daemon) | {stats(warm_daemon)} | {len(warm_daemon)} | p50 ≤ 1 |")
        hits = sum(1 for x in warm_src if x == "pool")
        lines.append(f"\nWarm-pool creates served from the pool: {hits} of {len(warm_src)} (cold run: "
                     f"{sum(1 for x in cold_src if x == 'cold')} of {len(cold_src)} cold). Creates set env, metadata, "
                     f"memory and timeout. Pool after the run: ready {pool['ready']}, hits {pool['hits']}, misses {pool['misses']}, "
                     f"refill p50 {pool.get('refill_p50_ms')} ms.")
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
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
