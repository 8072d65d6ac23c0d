#!/usr/bin/env python3
"""Turn hyperfine JSON exports into the startup table (markdown).

usage: summarize.py MANIFEST_TSV OUT_MD CONTEXT_LINE

MANIFEST_TSV rows: key, label, json path (empty if the row did not run),
notes, command. Percentiles come from hyperfine's raw `times` array, not its
mean/median summary, so p99 reflects the slow tail we actually saw.
"""
import json
import sys


def percentile(sorted_xs, q):
    """Linear interpolation between closest ranks (numpy's default method)."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def load(json_path):
    with open(json_path) as f:
        times = sorted(json.load(f)["results"][0]["times"])
    ms = [t * 1000 for t in times]
    return {
        "p50": percentile(ms, 0.50),
        "p99": percentile(ms, 0.99),
        "mean": sum(ms) / len(ms),
        "min": ms[0],
        "max": ms[-1],
        "n": len(ms),
    }


def main():
    manifest, out_md, context = sys.argv[1], sys.argv[2], sys.argv[3]
    rows = []
    with open(manifest) as f:
        for line in f:
            key, label, json_path, notes, cmd = line.rstrip("\n").split("\t")
            stats = load(json_path) if json_path else None
            rows.append((key, label, stats, notes, cmd))

    out = ["# Sandbox startup latency: `/usr/bin/true`", "",
           f"_{context}_", "",
           "| runtime | p50 ms | p99 ms | mean ms | min ms | max ms | runs | notes |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for _key, label, s, notes, _cmd in rows:
        if s:
            out.append(f"| {label} | {s['p50']:.2f} | {s['p99']:.2f} | {s['mean']:.2f} "
                       f"| {s['min']:.2f} | {s['max']:.2f} | {s['n']} | {notes} |")
        else:
            out.append(f"| {label} | – | – | – | – | – | 0 | {notes} |")

    by_key = {key: s for key, _l, s, _n, _c in rows}
    out += ["", "## Ratios (lower is better for corral)", ""]
    for other in ("bwrap", "crun"):
        c, o = by_key.get("corral"), by_key.get(other)
        if c and o:
            out.append(f"- corral / {other}: p50 **{c['p50'] / o['p50']:.2f}x**, "
                       f"p99 **{c['p99'] / o['p99']:.2f}x**")
        else:
            out.append(f"- corral / {other}: n/a (a row is missing)")

    out += ["", "## Commands", ""]
    for _key, label, _s, _n, cmd in rows:
        out.append(f"- {label}: `{cmd}`")
    out += ["", "p50/p99 are computed from hyperfine's per-run `times` (linear interpolation "
            "between ranks; with n runs p99 sits at rank 0.99*(n-1), i.e. between the two slowest runs for n < 100). "
            "Wall-clock from launch to exit, including the runtime's own teardown. "
            "The OCI bundles lived in a scratch directory that is removed after the run; "
            "their config.json files are kept as `bench/out/oci-config-<runtime>.json`."]

    text = "\n".join(out) + "\n"
    with open(out_md, "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
