# Egress latency/throughput client. Runs either on the host ("direct", straight to the
# upstream) or inside a sandbox ("proxy", through the loopback egress proxy). Prints JSON.
#   egress_client.py MODE N HTTP_PORT HTTPS_PORT CA_FILE
import http.client, json, os, socket, ssl, sys, time

mode, n, http_port, https_port, ca = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
proxy = mode == "proxy"
PROXY = ("127.0.0.1", 3128)


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return (xs[f] + (xs[c] - xs[f]) * (k - f)) * 1000


def summary(xs):
    return {"p50_ms": round(pct(xs, 0.5), 3), "p99_ms": round(pct(xs, 0.99), 3), "n": len(xs)}


def plain_http():
    # A new connection per request, as most HTTP clients do through a proxy.
    times = []
    for _ in range(n):
        t = time.perf_counter()
        if proxy:
            c = http.client.HTTPConnection(*PROXY)
            c.request("GET", "http://plain.corral.test/hello.txt")
        else:
            c = http.client.HTTPConnection("127.0.0.1", http_port)
            c.request("GET", "/hello.txt", headers={"Host": "plain.corral.test"})
        c.getresponse().read()
        c.close()
        times.append(time.perf_counter() - t)
    return summary(times)


def tls_keepalive(host, headers):
    # One TLS connection (through CONNECT when proxied), then N requests on it.
    ctx = ssl.create_default_context(cafile=ca)
    if proxy:
        c = http.client.HTTPSConnection(*PROXY, context=ctx)
        c.set_tunnel(host, 443)
    else:
        c = http.client.HTTPSConnection("127.0.0.1", https_port, context=ctx)
        c.sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", https_port)), server_hostname=host)
    c.request("GET", "/hello.txt", headers=headers)
    c.getresponse().read()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        c.request("GET", "/auth", headers=headers)
        c.getresponse().read()
        times.append(time.perf_counter() - t)
    return summary(times)


def connect_throughput(mb):
    # Plain HTTP inside a CONNECT tunnel, so the proxy relays and no TLS bounds the rate.
    if proxy:
        s = socket.create_connection(PROXY)
        s.sendall(b"CONNECT plain.corral.test:80 HTTP/1.1\r\nHost: plain.corral.test:80\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    else:
        s = socket.create_connection(("127.0.0.1", http_port))
    s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: plain.corral.test\r\nConnection: close\r\n\r\n")
    buf = bytearray(1 << 20)
    total, t = 0, time.perf_counter()
    while True:
        k = s.recv_into(buf)
        if not k:
            break
        total += k
    secs = time.perf_counter() - t
    return {"bytes": total, "seconds": round(secs, 3), "gbit_per_s": round(total * 8 / secs / 1e9, 2)}


auth = {"Authorization": "Bearer " + os.environ.get("API_KEY", "none")}
measures = {
    "plain_http_new_connection": plain_http,
    "connect_passthrough_keepalive": lambda: tls_keepalive("other.corral.test", {}),
    "tls_injected_keepalive": lambda: tls_keepalive("api.corral.test", auth),
    "connect_throughput": lambda: connect_throughput(int(os.environ.get("MB", "1024"))),
}
wanted = os.environ.get("MEASURE", ",".join(measures)).split(",")
print(json.dumps({k: measures[k]() for k in wanted}))
