#!/usr/bin/env bash
# Startup-latency benchmark: corral against bubblewrap, crun, runc and gVisor.
#
# Every competitor starts `/usr/bin/true` in the same kind of sandbox that
# corral's built-in `base` template builds (read-only host /usr, merged-usr
# symlinks, /proc, a minimal /dev, tmpfs /tmp, all namespaces, memory 512M
# and pids 256 where the runtime can do cgroups), and hyperfine measures the
# whole launch-to-exit time. See bench/README.md.
#
# Environment:
#   CORRAL  corral binary        (default: ./target/release/corral)
#   RUNS    timed runs per row   (default: 60)
#   WARMUP  warm-up runs per row (default: 5)
#   ONLY    space-separated subset of rows: baseline corral bwrap crun runc runsc
#
# Must run as root: the OCI runtimes need it for cgroup v1, and crun needs a
# private mount namespace (see the crun row).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$BENCH_DIR")
OUT_DIR="$BENCH_DIR/out"
RUNS=${RUNS:-60}
WARMUP=${WARMUP:-5}
ONLY=${ONLY:-baseline corral bwrap crun runc runsc}

cd "$REPO_DIR" # so the default CORRAL path is relative to the repository
CORRAL=${CORRAL:-./target/release/corral}

# Cgroups go under /corral-bench/<row> in every v1 hierarchy. This machine's
# supervisor owns the memory cgroup our shell lives in, so we never create
# anything inside it or touch any other group.
CGROUP_PARENT=corral-bench

log() { printf '==> %s\n' "$*" >&2; }
want() { [[ " $ONLY " == *" $1 "* ]]; }

if [[ $(id -u) -ne 0 ]]; then
    echo "startup.sh must run as root (OCI runtimes + cgroup v1 limits)" >&2
    exit 1
fi

# --- 1. tools -----------------------------------------------------------------
# Debian bookworm names; gVisor's runsc is the package `runsc`, not `gvisor`.
install_tools() {
    local pkgs=(bubblewrap crun runc runsc hyperfine python3 util-linux)
    local missing=() p
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "installing: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}
install_tools

# --- 2. scratch space -------------------------------------------------------------
WORK=$(mktemp -d /tmp/corral-bench.XXXXXX)
cleanup() {
    # Runtimes delete their own per-container group on exit; only the
    # (empty) parents we created are left. rmdir refuses non-empty groups,
    # so this can never remove anything that still holds a process.
    local d
    for d in /sys/fs/cgroup/*/"$CGROUP_PARENT"; do
        [[ -d $d ]] || continue
        rmdir "$d"/*/ 2>/dev/null || true
        rmdir "$d" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$OUT_DIR"

# The container root: an almost empty, read-only directory with mount points
# and the merged-usr symlinks; the host /usr is bind-mounted over usr/ by the
# runtime (see lib/make_oci_config.py). That is exactly corral's `base`
# layout, and avoids copying a rootfs (a busybox tree would exercise a
# different binary and different libraries than corral/bwrap do).
make_rootfs() {
    local root=$1 d
    mkdir -p "$root"/{usr,proc,dev,tmp}
    for d in bin lib lib64 sbin; do ln -s "usr/$d" "$root/$d"; done
}

# One OCI bundle per runtime so that the cgroup path names the runtime.
make_bundle() {
    local name=$1; shift
    local bundle="$WORK/bundle-$name"
    mkdir -p "$bundle" "$WORK/state-$name"
    make_rootfs "$bundle/rootfs"
    (cd "$bundle" && runc spec)
    python3 "$BENCH_DIR/lib/make_oci_config.py" "$bundle/config.json" "$name" "$@"
    cp "$bundle/config.json" "$OUT_DIR/oci-config-$name.json" # bundle is temporary
    echo "$bundle"
}

# An untimed hyperfine --prepare hook. `run` deletes the container on exit in
# all three OCI runtimes, so a fixed container id is reused run after run;
# this only force-deletes leftovers of a run that crashed. Any leftover the
# hook could not remove makes the next `run` fail with "already exists", and
# hyperfine aborts on a non-zero exit, so a dirty run cannot go unnoticed.
make_prepare() {
    local name=$1 state=$2 id=$3; shift 3
    local f="$WORK/prepare-$name.sh"
    cat >"$f" <<EOF
#!/bin/sh
if [ -n "\$(ls -A '$state')" ]; then
    echo "prepare: leftover $name state, deleting" >&2
    $* --root '$state' delete -f '$id' >/dev/null 2>&1 || true
fi
exit 0
EOF
    chmod +x "$f"
    echo "$f"
}

# Load before we start, not after: the benchmark itself raises it.
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# Manifest for the summary: key, label, json, notes, command (tab-separated).
MANIFEST="$WORK/manifest.tsv"
: >"$MANIFEST"

# bench KEY LABEL NOTES [hyperfine options…] -- COMMAND…
# Runs hyperfine without a shell (-N) so no shell start-up is in the numbers.
bench() {
    local key=$1 label=$2 notes=$3; shift 3
    local hf_opts=()
    while [[ $1 != -- ]]; do hf_opts+=("$1"); shift; done
    shift
    local cmd="$*" json="$OUT_DIR/startup-$key.json"
    rm -f "$json" # never let a stale export from an earlier run into the table
    log "$label: $cmd"
    # Fail here, with the runtime's own error message, rather than inside
    # hyperfine, which only reports a non-zero exit code.
    if ! "${HF_PREFIX[@]}" "$@" >"$WORK/probe-$key.log" 2>&1; then
        echo "!! $label does not run; skipping. Output:" >&2
        sed 's/^/   /' "$WORK/probe-$key.log" >&2
        printf '%s\t%s\t\t%s\t%s\n' "$key" "$label" "FAILED: $(head -c 200 "$WORK/probe-$key.log" | tr '\t\n' '  ')" "$cmd" >>"$MANIFEST"
        return 0
    fi
    # A run failing half-way (hyperfine stops at the first non-zero exit)
    # loses this row only, not the rows after it.
    if ! "${HF_PREFIX[@]}" hyperfine -N --warmup "$WARMUP" --runs "$RUNS" --style basic \
        "${hf_opts[@]}" --export-json "$json" --command-name "$label" "$cmd" >&2; then
        echo "!! $label failed during the benchmark; row dropped" >&2
        rm -f "$json"
        printf '%s\t%s\t\t%s\t%s\n' "$key" "$label" "FAILED during hyperfine (see stderr)" "$cmd" >>"$MANIFEST"
        return 0
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$key" "$label" "$json" "$notes" "$cmd" >>"$MANIFEST"
}
HF_PREFIX=()

# --- 3. the rows --------------------------------------------------------------------

if want baseline; then
    bench baseline "exec /usr/bin/true (no sandbox)" "floor: fork+exec cost" -- /usr/bin/true
fi

if want corral; then
    if [[ -x $CORRAL ]]; then
        bench corral "corral run" "all namespaces, memory 512M, pids 256" \
            -- "$CORRAL" run --memory 512M --pids 256 -- /usr/bin/true
    else
        log "corral: $CORRAL not found (build with 'cargo build --release'); skipping row"
        rm -f "$OUT_DIR/startup-corral.json"
        printf '%s\t%s\t\t%s\t%s\n' corral "corral run" "SKIPPED: $CORRAL not built" \
            "$CORRAL run --memory 512M --pids 256 -- /usr/bin/true" >>"$MANIFEST"
    fi
fi

if want bwrap; then
    # --unshare-all only *tries* the user namespace; --unshare-user makes it
    # mandatory so the row never silently drops it. bwrap's root is a tmpfs,
    # hence --remount-ro / to match the read-only root of the others.
    bench bwrap "bwrap" "all namespaces except time; no cgroup support, so no memory/pids limits" -- \
        bwrap --unshare-all --unshare-user --die-with-parent \
        --ro-bind /usr /usr \
        --symlink usr/bin /bin --symlink usr/lib /lib \
        --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin \
        --proc /proc --dev /dev --tmpfs /tmp --remount-ro / \
        --hostname sandbox /usr/bin/true
fi

if want crun; then
    # crun 1.8.1 refuses hybrid cgroups ("cgroups in hybrid mode not
    # supported, drop all controllers from cgroupv2") because the unified
    # mount lists hugetlb. In a private mount namespace without that mount it
    # sees plain cgroup v1. The whole hyperfine runs inside that namespace, so
    # the per-run cost of unshare+umount is not in the crun numbers; corral
    # and runc pay nothing equivalent either.
    b=$(make_bundle crun)
    p=$(make_prepare crun "$WORK/state-crun" bench-crun crun)
    HF_PREFIX=(unshare -m --propagation private -- sh -c 'umount /sys/fs/cgroup/unified && exec "$@"' sh)
    bench crun "crun run" "OCI; user+all namespaces; cgroup v1 memory 512M, pids 256; private mntns without /sys/fs/cgroup/unified" \
        --prepare "$p" -- \
        crun --root "$WORK/state-crun" run --bundle "$b" bench-crun
    HF_PREFIX=()
fi

if want runc; then
    b=$(make_bundle runc)
    p=$(make_prepare runc "$WORK/state-runc" bench-runc runc)
    bench runc "runc run" "OCI; user+all namespaces; cgroup v1 memory 512M, pids 256" \
        --prepare "$p" -- \
        runc --root "$WORK/state-runc" run --bundle "$b" bench-runc
fi

if want runsc; then
    # The KVM platform hangs on this machine and systrap does not exist in
    # the 2022 Debian release, so ptrace is the only usable platform.
    b=$(make_bundle runsc)
    p=$(make_prepare runsc "$WORK/state-runsc" bench-runsc runsc)
    bench runsc "runsc run (ptrace)" "gVisor: user+all namespaces inside the sentry; cgroup v1 memory 512M, pids 256" \
        --prepare "$p" -- \
        runsc --root "$WORK/state-runsc" --platform=ptrace --network=none run --bundle "$b" bench-runsc
fi

# Every runtime must have removed its container state; a leftover means the
# numbers above did not include full cleanup.
for s in "$WORK"/state-*; do
    [[ -d $s ]] || continue
    if [[ -n $(ls -A "$s") ]]; then
        echo "!! leftover runtime state in $s: $(ls -A "$s")" >&2
        exit 1
    fi
done
for d in /sys/fs/cgroup/*/"$CGROUP_PARENT"/*/; do
    if [[ -d $d ]]; then
        echo "!! leftover cgroup $d" >&2
        exit 1
    fi
done

# --- 4. report ----------------------------------------------------------------------
VERSIONS="$(bwrap --version); $(crun --version | head -1); $(runc --version | head -1); runsc $(runsc --version | sed -n 's/^runsc version //p' | head -1); $(hyperfine --version)"
python3 "$BENCH_DIR/lib/summarize.py" "$MANIFEST" "$OUT_DIR/startup.md" \
    "runs=$RUNS warmup=$WARMUP; $(uname -sr); $(nproc) CPUs; load before run $LOAD_BEFORE; $VERSIONS"
log "wrote $OUT_DIR/startup.md"
