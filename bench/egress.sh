#!/bin/sh
# Egress proxy benchmark (not a test): added latency per request through the sandbox's
# loopback proxy versus the same client on the host talking to the upstream directly, for
# plain HTTP, CONNECT passthrough and TLS with secret injection; and CONNECT throughput.
# Everything stays on 127.0.0.1. Run as root:  bench/egress.sh   (N=2000 MB=2048 to tune)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
CORRAL=${CORRAL:-$here/../target/release/corral}
# A release binary older than the egress flags is no use; fall back to the debug build.
"$CORRAL" run --help 2>/dev/null | grep -q egress-resolve || CORRAL=$here/../target/debug/corral
echo "corral binary: $CORRAL"
N=${N:-1000}
MB=${MB:-1024}
work=$(mktemp -d /tmp/corral-egress-bench.XXXXXX)
chmod 755 "$work"
trap 'kill $up_pid 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/www" "$work/ca" "$work/data"
chmod 755 "$work/www" "$work/ca"; chmod 711 "$work/data"

# Test CA and leaf (the sandbox trusts the CA through /testca; the proxy through --egress-trust).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=bench-ca \
  -keyout "$work/ca.key" -out "$work/ca/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=bench -keyout "$work/leaf.key" -out "$work/leaf.csr" 2>/dev/null
printf 'subjectAltName=DNS:api.corral.test,DNS:other.corral.test,DNS:plain.corral.test\n' > "$work/ext"
openssl x509 -req -in "$work/leaf.csr" -CA "$work/ca/ca.pem" -CAkey "$work/ca.key" -CAcreateserial -days 2 \
  -extfile "$work/ext" -out "$work/leaf.pem" 2>/dev/null
head -c $((MB * 1024 * 1024)) /dev/zero > "$work/www/big.bin"

export REAL_SECRET=bench-secret-value BENCH_SECRET=bench-secret-value
mkfifo "$work/ports" "$work/hold"
exec 3<>"$work/hold"  # the upstream runs until its stdin closes or it is killed
python3 "$here/../crates/corral/tests/egress_support/upstream.py" "$work/www" "$work/leaf.pem" "$work/leaf.key" \
  < "$work/hold" > "$work/ports" 2>"$work/upstream.log" &
up_pid=$!
read http_port https_port < "$work/ports"
cp "$here/lib/egress_client.py" "$work/ca/"

echo "direct (host -> upstream):"
direct=$(API_KEY=$REAL_SECRET MB=$MB python3 "$work/ca/egress_client.py" direct "$N" "$http_port" "$https_port" "$work/ca/ca.pem")
echo "$direct"
echo "through the egress proxy (sandbox -> agent relay -> proxy -> upstream):"
common="--memory 1G --egress-resolve api.corral.test=127.0.0.1:$https_port --egress-resolve other.corral.test=127.0.0.1:$https_port
  --egress-resolve plain.corral.test=127.0.0.1:$http_port --egress-trust $work/ca/ca.pem -e MB=$MB -v $work/ca:/testca:ro"
# Without secrets TLS passes through untouched (the sandbox verifies the upstream itself).
p1=$(CORRAL_DATA_DIR=$work/data "$CORRAL" run $common --allow-host plain.corral.test --allow-host other.corral.test \
  -e MEASURE=plain_http_new_connection,connect_passthrough_keepalive,connect_throughput \
  -- python3 /testca/egress_client.py proxy "$N" 0 0 /testca/ca.pem)
# With a secret every TLS connection is terminated by the proxy (corral CA inside).
p2=$(CORRAL_DATA_DIR=$work/data "$CORRAL" run $common --secret API_KEY=BENCH_SECRET@api.corral.test \
  -e MEASURE=tls_injected_keepalive -- python3 /testca/egress_client.py proxy "$N" 0 0 /etc/corral/ca-bundle.pem)
proxied=$(python3 -c 'import json,sys; a=json.loads(sys.argv[1]); a.update(json.loads(sys.argv[2])); print(json.dumps(a))' "$p1" "$p2")
echo "$proxied"
python3 - "$direct" "$proxied" <<'PY'
import json, sys
d, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print("\n| path | direct p50 | proxy p50 | added p50 | direct p99 | proxy p99 | added p99 |\n|---|---|---|---|---|---|---|")
for k in ["plain_http_new_connection", "connect_passthrough_keepalive", "tls_injected_keepalive"]:
    a, b = d[k], p[k]
    print(f"| {k} | {a['p50_ms']:.3f} ms | {b['p50_ms']:.3f} ms | {b['p50_ms']-a['p50_ms']:+.3f} ms | {a['p99_ms']:.3f} ms | {b['p99_ms']:.3f} ms | {b['p99_ms']-a['p99_ms']:+.3f} ms |")
print(f"\nCONNECT throughput ({d['connect_throughput']['bytes']>>20} MiB): direct {d['connect_throughput']['gbit_per_s']} Gbit/s, "
      f"through the proxy {p['connect_throughput']['gbit_per_s']} Gbit/s")
PY
