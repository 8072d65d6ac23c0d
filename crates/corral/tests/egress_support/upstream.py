# Upstream servers for the egress tests, on 127.0.0.1 only: plain HTTP and HTTPS (test CA),
# both serving ROOT (hello.txt, a pip simple index) and /auth, which reports whether the
# real secret arrived without ever sending it back.
import http.server, os, socket, ssl, sys, threading, zipfile

root, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
real = os.environ["REAL_SECRET"]

os.makedirs(os.path.join(root, "simple", "corraltestpkg"), exist_ok=True)
with open(os.path.join(root, "hello.txt"), "w") as f:
    f.write("hello-corral\n")
wheel = "corraltestpkg-1.0-py3-none-any.whl"
with zipfile.ZipFile(os.path.join(root, "simple", "corraltestpkg", wheel), "w") as z:
    z.writestr("corraltestpkg/__init__.py", "VALUE = 42\n")
    z.writestr("corraltestpkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: corraltestpkg\nVersion: 1.0\n")
    z.writestr("corraltestpkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: corral-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("corraltestpkg-1.0.dist-info/RECORD", "corraltestpkg/__init__.py,,\ncorraltestpkg-1.0.dist-info/METADATA,,\ncorraltestpkg-1.0.dist-info/WHEEL,,\ncorraltestpkg-1.0.dist-info/RECORD,,\n")
with open(os.path.join(root, "simple", "corraltestpkg", "index.html"), "w") as f:
    f.write('<html><body><a href="%s">%s</a></body></html>\n' % (wheel, wheel))


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def __init__(self, *a, **k):
        super().__init__(*a, directory=root, **k)

    def log_message(self, *a):
        pass

    def setup(self):
        super().setup()
        # Headers and body go out in separate writes; without this, Nagle and delayed ACKs
        # add 40 ms to every keep-alive request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def answer(self, text):
        body = text.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.startswith("/auth"):
            auth = self.headers.get("Authorization", "")
            verdict = "ok" if auth == "Bearer " + real else ("none" if not auth else "wrong")
            return self.answer("auth=%s\n" % verdict)
        return super().do_GET()

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        data = self.rfile.read(n)
        return self.answer("posted=%d real=%s\n" % (len(data), real.encode() in data))


plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
tls = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
tls.socket = ctx.wrap_socket(tls.socket, server_side=True, do_handshake_on_connect=False)
for server in (plain, tls):
    threading.Thread(target=server.serve_forever, daemon=True).start()
print(plain.server_address[1], tls.server_address[1], flush=True)
sys.stdin.read()  # exit with the test
