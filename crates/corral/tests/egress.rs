//! Egress through real sandboxes: the loopback proxy, policy, refusals, brokered secrets and
//! audit. Upstreams are HTTP/HTTPS servers on 127.0.0.1 in this test process's tree; names
//! point at them through the resolve override. Nothing here connects anywhere but loopback:
//! refused destinations are refused before any connection is made.

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::{json, Value};
use support::{corral, data_dir, Run};

/// The real secret value: must never be seen inside a sandbox.
const REAL: &str = "sk-real-4c0ffee-never-inside";
const SECRET_ENV: &str = "CORRAL_TEST_REAL_SECRET";

struct Upstreams {
    http: u16,
    https: u16,
    /// Holds `ca.pem` (the test CA), mounted read-only at /testca in sandboxes.
    ca_dir: PathBuf,
    _child: Child,
}

fn upstreams() -> &'static Upstreams {
    static UP: OnceLock<Upstreams> = OnceLock::new();
    UP.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("corral-egress-test-{}", std::process::id()));
        let (ca_dir, root) = (dir.join("ca"), dir.join("www"));
        std::fs::create_dir_all(&ca_dir).expect("ca dir");
        std::fs::create_dir_all(&root).expect("www dir");
        for d in [&dir, &ca_dir, &root] {
            std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        }
        // A test CA and one leaf for every test name, made with rcgen.
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name.push(DnType::CommonName, "corral egress test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
        let leaf_key = KeyPair::generate().expect("leaf key");
        let names = ["api.corral.test", "other.corral.test", "plain.corral.test", "pypi.corral.test"];
        let leaf_params = CertificateParams::new(names.map(String::from).to_vec()).expect("leaf params");
        let leaf = leaf_params.signed_by(&leaf_key, &Issuer::from_params(&ca_params, &ca_key)).expect("leaf");
        std::fs::write(ca_dir.join("ca.pem"), ca_cert.pem()).expect("write ca");
        std::fs::write(dir.join("leaf.pem"), leaf.pem()).expect("write leaf");
        std::fs::write(dir.join("leaf.key"), leaf_key.serialize_pem()).expect("write key");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/egress_support/upstream.py");
        let mut child = Command::new("python3")
            .args([script.as_ref(), root.as_os_str(), dir.join("leaf.pem").as_os_str(), dir.join("leaf.key").as_os_str()])
            .env("REAL_SECRET", REAL)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start upstreams");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("ports");
        let ports: Vec<u16> = line.split_whitespace().map(|p| p.parse().expect("port")).collect();
        Upstreams { http: ports[0], https: ports[1], ca_dir, _child: child }
    })
}

fn resolve_flags(up: &Upstreams) -> Vec<String> {
    let mut flags = Vec::new();
    for (name, port) in [("api", up.https), ("other", up.https), ("plain", up.http), ("pypi", up.http), ("denied", up.http)] {
        flags.push("--egress-resolve".to_string());
        flags.push(format!("{name}.corral.test=127.0.0.1:{port}"));
    }
    flags
}

/// `corral run` with egress flags, the test CA mounted at /testca, and `script` in sh.
fn run_net(flags: &[&str], script: &str) -> Run {
    let up = upstreams();
    let mut cmd = corral();
    cmd.arg("run").args(resolve_flags(up)).args(flags);
    cmd.arg("-v").arg(format!("{}:/testca:ro", up.ca_dir.display()));
    cmd.arg("--egress-trust").arg(up.ca_dir.join("ca.pem"));
    cmd.env(SECRET_ENV, REAL);
    cmd.args(["--", "/bin/sh", "-c", script]);
    let run: Run = cmd.output().expect("corral run").into();
    assert!(!run.stdout.contains(REAL) && !run.stderr.contains(REAL), "the real secret leaked into output: {run:?}");
    run
}

fn audit_lines(dir: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("audit.jsonl")).unwrap_or_default();
    assert!(!text.contains(REAL), "the audit log holds the real secret");
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

const POLICY: &[&str] = &[
    "--allow-host", "plain.corral.test:80",
    "--allow-host", "other.corral.test:443",
    "--allow-host", "pypi.corral.test",
    "--allow-host", "*.corral.test:443",
    "--allow-host", "localhost",
    "--deny-host", "denied.corral.test",
];

#[test]
fn allowed_hosts_work_from_curl_python_pip_and_node() {
    let node = r#"
const http = require('http'), tls = require('tls'), fs = require('fs');
// Node's http/https ignore HTTPS_PROXY before v24 (NODE_USE_ENV_PROXY): tunnel explicitly.
const proxy = new URL(process.env.HTTPS_PROXY);
http.request({ host: proxy.hostname, port: proxy.port, method: 'CONNECT', path: 'other.corral.test:443' })
  .on('connect', (res, socket) => {
    const t = tls.connect({ socket, servername: 'other.corral.test', ca: fs.readFileSync('/testca/ca.pem') }, () =>
      t.write('GET /hello.txt HTTP/1.1\r\nHost: other.corral.test\r\nConnection: close\r\n\r\n'));
    let data = ''; t.on('data', c => data += c); t.on('end', () => console.log('node ' + data.split('\r\n\r\n')[1].trim()));
  }).end();
"#;
    std::fs::write(upstreams().ca_dir.join("tunnel.js"), node).expect("write node script");
    let script = r#"
set -e
echo "curl-http $(curl -fsS http://plain.corral.test/hello.txt)"
echo "curl-https $(curl -fsS --cacert /testca/ca.pem https://other.corral.test/hello.txt)"
echo "curl-socks $(curl -fsS --socks5-hostname 127.0.0.1:3128 http://plain.corral.test/hello.txt)"
python3 -c "import requests; print('requests', requests.get('https://other.corral.test/hello.txt', verify='/testca/ca.pem').text.strip())"
python3 -c "import urllib.request; print('urllib', urllib.request.urlopen('http://plain.corral.test/hello.txt').read().decode().strip())"
node /testca/tunnel.js
PIP_DISABLE_PIP_VERSION_CHECK=1 python3 -m pip install -q --no-cache-dir --break-system-packages --target /tmp/pkgs \
  --index-url http://pypi.corral.test/simple/ --trusted-host pypi.corral.test corraltestpkg >/dev/null 2>&1
echo "pip $(PYTHONPATH=/tmp/pkgs python3 -c 'import corraltestpkg; print(corraltestpkg.VALUE)')"
"#;
    let run = run_net(POLICY, script);
    for expected in ["curl-http hello-corral", "curl-https hello-corral", "curl-socks hello-corral", "requests hello-corral", "urllib hello-corral", "node hello-corral", "pip 42"] {
        assert!(run.stdout.contains(expected), "missing {expected:?}: {run:?}");
    }
    assert_eq!(run.code, 0, "{run:?}");
    let audit = audit_lines(data_dir());
    assert!(audit.iter().any(|e| e["name"] == "plain.corral.test" && e["decision"] == "allow" && e["path"] == "/hello.txt" && e["method"] == "GET"));
    assert!(audit.iter().any(|e| e["name"] == "other.corral.test" && e["protocol"] == "connect" && e["sni"] == "other.corral.test"));
}

#[test]
fn refused_destinations_fail_with_the_right_error() {
    let up = upstreams();
    let script = format!(
        r#"
code() {{ curl -s --proxy http://127.0.0.1:3128 --noproxy '' -D - -o /dev/null "$@" | tr -d '\r' | grep -i '^x-corral-egress' | cut -d' ' -f2; }}
echo "denied=$(code http://denied.corral.test/)"
echo "unlisted=$(code http://unlisted.example/)"
echo "raw-ip=$(code http://127.0.0.1:{http}/)"
echo "metadata=$(code http://169.254.169.254/latest/meta-data/)"
echo "port=$(code http://plain.corral.test:8080/)"
echo "private=$(code http://localhost:{http}/)"
echo "connect-denied=$(curl -s -o /dev/null -w '%{{http_connect}}' https://denied.corral.test/)"
curl -s --socks5-hostname 127.0.0.1:3128 http://denied.corral.test/ >/dev/null; echo "socks-denied rc=$?"
python3 - <<'PY'
import socket, ssl
# Domain fronting: CONNECT to an allowed name, then TLS naming another.
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT other.corral.test:443 HTTP/1.1\r\nHost: other.corral.test:443\r\n\r\n")
print("connect-answer", s.recv(100).split(b"\r\n")[0].decode())
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
try:
    ctx.wrap_socket(s, server_hostname="evil.example").sendall(b"GET / HTTP/1.0\r\n\r\n")
    print("sni-mismatch passed")
except (OSError, ssl.SSLError) as e:
    print("sni-mismatch refused")
# A socket that ignores the proxy reaches nothing: the sandbox has its own loopback only.
try:
    socket.create_connection(("127.0.0.1", {http}), timeout=3); print("direct connected")
except OSError as e:
    print("direct refused", e.errno)
PY
curl -s --noproxy '*' -m 5 http://plain.corral.test/ >/dev/null; echo "no-proxy rc=$?"
"#,
        http = up.http
    );
    let run = run_net(POLICY, &script);
    for expected in [
        "denied=denied_by_rule",
        "unlisted=not_allowed",
        "raw-ip=not_allowed",
        "metadata=not_allowed",
        "port=not_allowed",
        "private=non_public_address",
        "connect-denied=403",
        "socks-denied rc=97",
        "connect-answer HTTP/1.1 200 Connection established",
        "sni-mismatch refused",
        "direct refused 111",
        "no-proxy rc=6",
    ] {
        assert!(run.stdout.contains(expected), "missing {expected:?}: {run:?}");
    }
    let audit = audit_lines(data_dir());
    let has = |name: &str, reason: &str| audit.iter().any(|e| e["name"] == name && e["reason"] == reason && e["decision"] == "deny");
    assert!(has("denied.corral.test", "denied_by_rule"));
    assert!(has("localhost", "non_public_address"));
    assert!(has("other.corral.test", "sni_mismatch"));
    let denied = audit.iter().find(|e| e["name"] == "denied.corral.test" && e["protocol"] == "http").expect("denied entry");
    assert_eq!(denied["rule"], "denied.corral.test", "the deciding rule is named");
}

#[test]
fn secrets_are_injected_only_for_bound_hosts_and_never_inside() {
    let secret = format!("API_KEY={SECRET_ENV}@api.corral.test");
    let flags = [POLICY, &["--secret", secret.as_str()]].concat();
    let script = r#"
echo "placeholder-shape ${API_KEY%%_*}"
echo "bound $(curl -fsS -H "Authorization: Bearer $API_KEY" https://api.corral.test/auth)"
echo "bound-python $(python3 -c "import os, requests; print(requests.get('https://api.corral.test/auth', headers={'Authorization': 'Bearer ' + os.environ['API_KEY']}).text.strip())")"
echo "unbound-https $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $API_KEY" https://other.corral.test/auth)"
echo "clean-https $(curl -fsS https://other.corral.test/hello.txt)"
echo "exfil-http $(curl -s -D - -o /dev/null -H "X-Leak: $API_KEY" http://plain.corral.test/ | tr -d '\r' | grep -i '^x-corral-egress')"
echo "exfil-body $(curl -s -o /dev/null -w '%{http_code}' --data "k=$API_KEY" http://plain.corral.test/post)"
echo "exfil-socks $(printf 'GET /?%s HTTP/1.0\r\n\r\n' "$API_KEY" | python3 -c "
import socket, sys
s = socket.create_connection(('127.0.0.1', 3128)); s.sendall(b'\x05\x01\x00'); s.recv(2)
s.sendall(b'\x05\x01\x00\x03' + bytes([17]) + b'plain.corral.test' + (80).to_bytes(2, 'big')); s.recv(10)
s.sendall(sys.stdin.buffer.read()); print(len(s.recv(100)))")"
"#;
    let run = run_net(&flags, script);
    for expected in [
        "placeholder-shape corral",
        "bound auth=ok",
        "bound-python auth=ok",
        "unbound-https 403",
        "clean-https hello-corral",
        "exfil-http X-Corral-Egress: exfiltration",
        "exfil-body 000",
        "exfil-socks 0",
    ] {
        assert!(run.stdout.contains(expected), "missing {expected:?}: {run:?}");
    }
    let audit = audit_lines(data_dir());
    let exfil: Vec<_> = audit.iter().filter(|e| e["reason"] == "exfiltration").collect();
    assert!(exfil.iter().any(|e| e["exfiltration_of"] == "API_KEY" && e["name"] == "plain.corral.test"), "{exfil:?}");
    assert!(audit.iter().any(|e| e["protocol"] == "https" && e["name"] == "api.corral.test" && e["secrets"][0] == "API_KEY"));

    // Nowhere inside: env, every process's environ and cmdline (as sandbox root), files.
    let run = run_net(&[flags.as_slice(), &["--user", "root"]].concat(), &hunter());
    assert!(run.stdout.contains("hits 0 []"), "{run:?}");
}

/// A shell command that lists every place inside holding the real value. The value is
/// assembled at run time so that the hunter's own command line does not contain it.
fn hunter() -> String {
    let (a, b) = REAL.split_at(8);
    format!(
        r#"python3 - <<'PY'
import glob, os
p = ('{a}' + '{b}').encode()
hits = []
for f in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):
    try:
        if p in open(f, 'rb').read(): hits.append(f)
    except OSError:
        pass
for top in ['/etc', '/tmp', '/root', '/home', '/var', '/run']:
    for d, _, files in os.walk(top):
        for n in files:
            try:
                if p in open(os.path.join(d, n), 'rb').read(): hits.append(os.path.join(d, n))
            except OSError:
                pass
if p.decode() in ''.join(os.environ.values()): hits.append('env')
print('hits', len(hits), hits)
PY"#
    )
}

/// A daemon with the test upstreams' names and CA configured.
struct TestDaemon {
    child: Child,
    url: String,
    key: String,
    data_dir: PathBuf,
    client: reqwest::blocking::Client,
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

impl TestDaemon {
    fn start() -> TestDaemon {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        let data_dir = std::env::temp_dir().join(format!("corral-egress-daemon-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&data_dir).expect("data dir");
        let key = format!("crl_egress_{}", std::process::id());
        let url = format!("http://127.0.0.1:{port}");
        let child = Self::spawn(&url, &data_dir, &key);
        let client = reqwest::blocking::Client::builder().timeout(std::time::Duration::from_secs(60)).build().expect("client");
        let daemon = TestDaemon { child, url, key, data_dir, client };
        daemon.wait_ready();
        daemon
    }

    fn spawn(url: &str, data_dir: &std::path::Path, key: &str) -> Child {
        let up = upstreams();
        Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(["serve", "--kill-sandboxes-on-exit", "--listen", url.trim_start_matches("http://"), "--data-dir"])
            .arg(data_dir)
            .args(resolve_flags(up))
            .arg("--egress-trust")
            .arg(up.ca_dir.join("ca.pem"))
            .env("CORRAL_API_KEY", key)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start daemon")
    }

    fn wait_ready(&self) {
        for _ in 0..400 {
            if self.client.get(format!("{}/v1/health", self.url)).send().is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("daemon did not come up");
    }

    /// SIGKILL, then a new daemon on the same port and data dir.
    fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(&self.url, &self.data_dir, &self.key);
        self.wait_ready();
    }

    fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, String) {
        let mut req = self.client.request(method, format!("{}{path}", self.url)).bearer_auth(&self.key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().expect("body");
        assert!(!text.contains(REAL), "an API answer holds the real secret: {text}");
        (status, text)
    }

    fn exec(&self, id: &str, cmd: &str) -> String {
        let (status, text) = self.call(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/exec?wait=true"), Some(json!({ "cmd": cmd, "user": "root" })));
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        format!("{}{}", v["stdout"].as_str().unwrap_or(""), v["stderr"].as_str().unwrap_or(""))
    }
}

#[test]
fn daemon_brokers_secrets_and_applies_policy_changes_at_runtime() {
    let mut d = TestDaemon::start();
    let (status, text) = d.call(reqwest::Method::POST, "/v1/secrets", Some(json!({ "name": "API_KEY", "value": REAL, "hosts": ["api.corral.test"] })));
    assert_eq!(status, 201, "{text}");
    let (status, _) = d.call(reqwest::Method::POST, "/v1/secrets", Some(json!({ "name": "BAD", "value": "a\r\nX-Injected: 1", "hosts": ["api.corral.test"] })));
    assert_eq!(status, 422, "control characters in a value could forge headers");
    d.call(reqwest::Method::GET, "/v1/secrets", None);

    let spec = json!({ "network": { "allow": ["plain.corral.test:80", "api.corral.test:443"], "secrets": ["API_KEY"] } });
    let (status, text) = d.call(reqwest::Method::POST, "/v1/sandboxes", Some(spec));
    assert_eq!(status, 201, "{text}");
    let id = serde_json::from_str::<Value>(&text).expect("json")["id"].as_str().expect("id").to_string();

    let fetch = "curl -s -o /dev/null -w '%{http_code}' http://pypi.corral.test/hello.txt";
    assert_eq!(d.exec(&id, fetch), "403");
    assert_eq!(d.exec(&id, "curl -fsS http://plain.corral.test/hello.txt"), "hello-corral\n");
    assert_eq!(d.exec(&id, r#"curl -fsS -H "Authorization: Bearer $API_KEY" https://api.corral.test/auth"#), "auth=ok\n");

    // A policy change applies to the next connection.
    let (status, text) = d.call(reqwest::Method::PATCH, &format!("/v1/sandboxes/{id}/network"), Some(json!({ "allow": ["pypi.corral.test"] })));
    assert_eq!(status, 200, "{text}");
    assert_eq!(d.exec(&id, fetch), "200");
    assert_eq!(d.exec(&id, "curl -s -o /dev/null -w '%{http_code}' http://plain.corral.test/hello.txt"), "403");
    let (status, _) = d.call(reqwest::Method::PATCH, &format!("/v1/sandboxes/{id}/network"), Some(json!({ "allow": ["not a host"] })));
    assert_eq!(status, 400);

    let leaks = d.exec(&id, &hunter());
    assert!(leaks.contains("hits 0 []"), "{leaks}");

    let (_, text) = d.call(reqwest::Method::GET, &format!("/v1/sandboxes/{id}/network"), None);
    let info: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(info["policy"]["allow"], json!(["pypi.corral.test"]));
    assert_eq!(info["secrets"][0]["name"], "API_KEY");
    let audit = info["audit"].as_array().expect("audit");
    assert!(audit.iter().any(|e| e["name"] == "pypi.corral.test" && e["decision"] == "deny" && e["reason"] == "not_allowed"));
    assert!(audit.iter().any(|e| e["name"] == "pypi.corral.test" && e["decision"] == "allow"));
    assert!(audit.iter().any(|e| e["protocol"] == "https" && e["path"] == "/auth" && e["secrets"][0] == "API_KEY"));
    audit_lines(&d.data_dir);

    let logs = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["logs", "--network", &id, "--url", &d.url, "--api-key", &d.key])
        .output()
        .expect("corral logs");
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("deny") && logs.contains("pypi.corral.test:80"), "{logs}");

    // After a daemon crash the re-attached sandbox keeps its policy and its brokered secret.
    d.crash_and_restart();
    assert_eq!(d.exec(&id, fetch), "200");
    let (status, _) = d.call(reqwest::Method::PATCH, &format!("/v1/sandboxes/{id}/network"), Some(json!({ "allow": ["api.corral.test:443"] })));
    assert_eq!(status, 200);
    assert_eq!(d.exec(&id, r#"curl -fsS -H "Authorization: Bearer $API_KEY" https://api.corral.test/auth"#), "auth=ok\n");
}
