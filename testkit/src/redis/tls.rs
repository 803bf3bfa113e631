//! A private TLS-only `redis-server` per test: a CA, a server certificate
//! (SAN 127.0.0.1 and localhost), a client certificate and an unrelated CA,
//! all made with the `openssl` CLI in a temp dir at test time; the server
//! listens for TCP on a TLS port only (`--port 0`), with a unix socket in the
//! temp dir for the test's own administration (readiness, `FLUSHALL`). When
//! `redis-server` or `openssl` is missing the tests skip loudly, unless
//! `REDSTRING_REQUIRE_REDIS=1`, when they fail.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{Listen, base_command, command_over, free_port};

/// Whether clients must present a certificate the CA signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// `--tls-auth-clients no`: any client that trusts the server may connect.
    Optional,
    /// `--tls-auth-clients yes`: mutual TLS.
    Required,
}

/// The certificates and keys a test made.
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// The CA that signed the server's and the client's certificates.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    /// A CA that signed nothing here.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.crt")
    }
    /// The server's certificate (SAN IP:127.0.0.1, DNS:localhost).
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }
    /// The server's private key.
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }
    /// A client certificate the CA signed.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.crt")
    }
    /// The client certificate's private key.
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }
}

fn tool_available(tool: &str) -> bool {
    Command::new(tool)
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// `true` when the tools are present; otherwise `false` after a loud message,
/// or a panic when `REDSTRING_REQUIRE_REDIS=1`.
fn tools_or_skip() -> bool {
    let redis = super::redis_available();
    let openssl = tool_available("openssl");
    if redis && openssl {
        return true;
    }
    if std::env::var("REDSTRING_REQUIRE_REDIS").as_deref() == Ok("1") {
        panic!("REDSTRING_REQUIRE_REDIS=1 but redis-server ({redis}) or openssl ({openssl}) is not on PATH");
    }
    eprintln!();
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!("!!! SKIPPING: redis-server or openssl is not on PATH; Redis over TLS is UNTESTED.");
    eprintln!("!!! Install them (apt-get install redis-server openssl) or set REDSTRING_REQUIRE_REDIS=1.");
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    false
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

fn make_ca(dir: &Path, name: &str) {
    let (key, crt, subj) = (
        format!("{name}.key"),
        format!("{name}.crt"),
        format!("/CN=redstring test {name}"),
    );
    let mut args = vec!["req", "-x509", "-new", "-nodes"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subj]);
    openssl(dir, &args);
}

fn make_leaf(dir: &Path, name: &str, extensions: &str) {
    let (key, csr, crt, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    std::fs::write(dir.join(&ext), extensions).expect("write extensions");
    let mut args = vec!["req", "-new", "-nodes"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=localhost"]);
    openssl(dir, &args);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}

/// Makes a CA, a server and a client certificate it signed, and another CA, in `dir`.
fn make_pki(dir: &Path) -> Pki {
    make_ca(dir, "ca");
    make_ca(dir, "other-ca");
    make_leaf(
        dir,
        "server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    );
    make_leaf(
        dir,
        "client",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    );
    Pki { dir: dir.to_path_buf() }
}

/// Certificates only, for tests that need no server; `None` when skipping.
pub fn pki_only() -> Option<(tempfile::TempDir, Pki)> {
    if !tools_or_skip() {
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = make_pki(dir.path());
    Some((dir, pki))
}

/// A running TLS-only redis-server.
pub struct TlsServer {
    dir: tempfile::TempDir,
    pki: Pki,
    port: u16,
    auth: ClientAuth,
    password: Option<String>,
    child: Option<Child>,
}

impl TlsServer {
    /// A fresh server, or `None` (after a loud message) when the tools are
    /// missing and not required.
    pub fn start(auth: ClientAuth, password: Option<&str>) -> Option<Self> {
        if !tools_or_skip() {
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let pki = make_pki(dir.path());
        let mut server = TlsServer {
            dir,
            pki,
            port: 0,
            auth,
            password: password.map(str::to_owned),
            child: None,
        };
        // A port is free when chosen but may be taken before the server binds
        // it; then the server exits and another is tried.
        for _ in 0..5 {
            if server.launch() {
                return Some(server);
            }
        }
        panic!("a TLS redis-server did not start on any of five ports");
    }

    fn launch(&mut self) -> bool {
        self.port = free_port();
        let mut cmd = base_command(None, Listen::Tls(self.port), &self.socket(), self.dir.path());
        cmd.arg("--tls-cert-file")
            .arg(self.pki.server_cert())
            .arg("--tls-key-file")
            .arg(self.pki.server_key())
            .arg("--tls-ca-cert-file")
            .arg(self.pki.ca())
            .arg("--tls-auth-clients")
            .arg(if self.auth == ClientAuth::Required { "yes" } else { "no" });
        if let Some(p) = &self.password {
            cmd.arg("--requirepass").arg(p);
        }
        let mut child = cmd.spawn().expect("spawn redis-server");
        for _ in 0..500 {
            if child.try_wait().ok().flatten().is_some() {
                return false;
            }
            let ready = self.command(&["PING"]).is_some_and(|r| r.starts_with("+PONG"))
                && TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            if ready {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("TLS redis-server did not answer PING");
    }

    /// The certificates this server was set up with.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The TLS port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The administration socket (not used by the clients under test).
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// `rediss://` to the TLS port, with the password if there is one.
    pub fn url(&self) -> String {
        self.url_with(self.password.as_deref())
    }

    /// `rediss://` to the TLS port with `password` (whatever the server's).
    pub fn url_with(&self, password: Option<&str>) -> String {
        match password {
            Some(p) => format!("rediss://:{p}@127.0.0.1:{}", self.port),
            None => format!("rediss://127.0.0.1:{}", self.port),
        }
    }

    /// Whether clients must present a certificate.
    pub fn auth(&self) -> ClientAuth {
        self.auth
    }

    /// Sends one command over the administration socket (authenticating first
    /// if needed); `None` if the server is not reachable.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        command_over(&self.socket(), self.password.as_deref(), args)
    }

    /// Empties the server.
    pub fn flush(&self) {
        let reply = self.command(&["FLUSHALL"]).expect("server reachable");
        assert!(reply.starts_with("+OK"), "FLUSHALL: {reply}");
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
