//! TLS for tests: a throwaway CA with a server and a client certificate (and, on demand, server
//! certificates for another host name or expired: [`ServerCert`]), made with the `openssl`
//! command-line tool in a temp dir of its own, and `redis-server`s that serve TLS with them.
//!
//! A [`TlsServer`] listens on two loopback ports: a TLS port for the manager under test, and a
//! plain one the harness uses to see that it is up and to look inside ([`TlsServer::server`]).
//! The TLS port speaks nothing but TLS.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use distlock_runtime::LockManagerBuilder;

use distlock_runtime::testing::{TestRedis, TestRedisError};

use super::{free_port, manager_at, RedisServer};

/// A CA, a server certificate it signed (for `127.0.0.1` and `localhost`) and a client
/// certificate it signed, as files in a temp dir removed on drop; on demand, server
/// certificates made to be refused ([`ServerCert`]).
pub struct TestCa {
    dir: PathBuf,
}

/// Which certificate a [`TlsServer`] presents on its TLS port. Each is signed by the
/// [`TestCa`], so a client that trusts the CA refuses the bad ones for their name or their
/// dates alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCert {
    /// For `127.0.0.1` and `localhost`, valid for two days from now.
    Good,
    /// Valid now, but for another host: `elsewhere.invalid` and `192.0.2.1` (a documentation
    /// address), neither `127.0.0.1` nor `localhost`.
    WrongName,
    /// For `127.0.0.1` and `localhost`, but expired: valid only on 1 January 2020.
    Expired,
}

impl ServerCert {
    /// The base name of its `.crt` and `.key` files in the CA's dir.
    fn name(self) -> &'static str {
        match self {
            Self::Good => "server",
            Self::WrongName => "server-wrong-name",
            Self::Expired => "server-expired",
        }
    }
}

/// How long a certificate [`TestCa::sign`] makes is valid.
#[derive(Clone, Copy)]
enum Validity {
    /// From now, for this many days (`openssl x509 -days`).
    Days(u32),
    /// Between two fixed times, `YYYYMMDDHHMMSSZ` (`openssl ca -startdate/-enddate`, which,
    /// unlike `x509 -days`, can date a certificate in the past).
    Between(&'static str, &'static str),
}

impl TestCa {
    /// Makes a new CA and its two certificates (P-256 keys, valid for two days).
    ///
    /// # Panics
    /// When `openssl` is not on PATH or fails.
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("distlock-tls-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test CA's dir");
        let ca = Self { dir };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        ca.openssl(&[
            &["req", "-x509"][..],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2"],
            // A name of its own: another test CA is another issuer.
            &[
                "-subj",
                &format!("/CN=distlock test CA {n} of {}", std::process::id()),
            ],
            &["-addext", "basicConstraints=critical,CA:TRUE"],
            &["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ]);
        ca.sign(
            "server",
            "localhost",
            "IP:127.0.0.1,DNS:localhost",
            "serverAuth,clientAuth",
            Validity::Days(2),
        );
        ca.sign(
            "client",
            "distlock test client",
            "DNS:client.test",
            "clientAuth",
            Validity::Days(2),
        );
        ca
    }

    /// Makes the files of `cert` unless they exist (the good one always does), and returns
    /// the paths of its certificate and key.
    ///
    /// # Panics
    /// When `openssl` fails.
    pub fn server_cert(&self, cert: ServerCert) -> (PathBuf, PathBuf) {
        let name = cert.name();
        let (crt, key) = (
            self.path(&format!("{name}.crt")),
            self.path(&format!("{name}.key")),
        );
        if !crt.exists() {
            let (cn, san, validity) = match cert {
                ServerCert::Good => unreachable!("made with the CA"),
                ServerCert::WrongName => (
                    "elsewhere.invalid",
                    "DNS:elsewhere.invalid,IP:192.0.2.1",
                    Validity::Days(2),
                ),
                ServerCert::Expired => (
                    "localhost",
                    "IP:127.0.0.1,DNS:localhost",
                    Validity::Between("20200101000000Z", "20200102000000Z"),
                ),
            };
            self.sign(name, cn, san, "serverAuth", validity);
        }
        (crt, key)
    }

    /// Makes `name.key` and `name.crt`, signed by the CA.
    fn sign(&self, name: &str, cn: &str, san: &str, usage: &str, validity: Validity) {
        let ext = format!(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage={usage}\nsubjectAltName={san}\n"
        );
        std::fs::write(self.dir.join(format!("{name}.ext")), ext).expect("write extensions");
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        self.openssl(&[
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
            ],
            &["-keyout", &key, "-out", &csr, "-subj", &format!("/CN={cn}")],
        ]);
        match validity {
            Validity::Days(days) => self.openssl(&[
                &[
                    "x509", "-req", "-in", &csr, "-CA", "ca.crt", "-CAkey", "ca.key",
                ],
                &[
                    "-CAcreateserial",
                    "-days",
                    &days.to_string(),
                    "-out",
                    &crt,
                    "-extfile",
                    &ext,
                ],
            ]),
            Validity::Between(start, end) => {
                // `openssl ca` keeps a database of what it issued: an empty one of its own.
                let config = format!(
                    "[ca]\ndefault_ca = test_ca\n[test_ca]\ndatabase = {name}.index\n\
                     new_certs_dir = .\nserial = {name}.serial\ndefault_md = sha256\n\
                     policy = any_name\nunique_subject = no\n[any_name]\ncommonName = supplied\n"
                );
                std::fs::write(self.dir.join(format!("{name}.cnf")), config)
                    .expect("write an openssl ca config");
                std::fs::write(self.dir.join(format!("{name}.index")), "")
                    .expect("write an openssl ca database");
                std::fs::write(self.dir.join(format!("{name}.serial")), "01\n")
                    .expect("write an openssl ca serial");
                self.openssl(&[
                    &["ca", "-batch", "-notext", "-config", &format!("{name}.cnf")],
                    &["-cert", "ca.crt", "-keyfile", "ca.key", "-in", &csr],
                    &["-out", &crt, "-extfile", &ext],
                    &["-startdate", start, "-enddate", end],
                ]);
            }
        }
    }

    fn openssl(&self, args: &[&[&str]]) {
        let args: Vec<&str> = args.concat();
        let output = Command::new("openssl")
            .args(&args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("run openssl: is it installed and on PATH?");
        assert!(
            output.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The path of one of the CA's files (`ca.crt`, `server.key`, ...).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.path(file)).expect("read a test certificate")
    }

    /// The CA's certificate, PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.read("ca.crt")
    }

    /// The client certificate, PEM.
    pub fn client_cert_pem(&self) -> Vec<u8> {
        self.read("client.crt")
    }

    /// The client certificate's private key, PEM (PKCS#8).
    pub fn client_key_pem(&self) -> Vec<u8> {
        self.read("client.key")
    }

    /// The server certificate's private key, PEM (PKCS#8): a key that does not belong to the
    /// client certificate.
    pub fn server_key_pem(&self) -> Vec<u8> {
        self.read("server.key")
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether a [`TlsServer`] asks its clients for a certificate (`tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// No client certificate is asked for.
    No,
    /// A client must present a certificate the CA signed (mutual TLS).
    Required,
}

/// Why this run's server (see [`distlock_runtime::testing::PROGRAM_ENV`]) serves no TLS, or
/// `None` when it does. Found once per process, by starting it with a TLS port and no
/// certificate: a server built with TLS stops for the missing certificate, one built without it
/// ("Failed finding TLS support": the PyPI builds of Redis 8.2 and Valkey 8.1 that CI runs the
/// suite on too) for the missing support.
pub fn without_tls() -> Option<String> {
    static FOUND: OnceLock<Option<String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let server = RedisServer::start();
            let program = server.program().to_owned();
            drop(server);
            let (port, tls_port) = (free_port().to_string(), free_port().to_string());
            let mut child = Command::new(&program)
                .args([
                    "--port",
                    &port,
                    "--bind",
                    "127.0.0.1",
                    "--tls-port",
                    &tls_port,
                ])
                .args(["--save", "", "--appendonly", "no"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start the server to ask it about TLS");
            // It stops at once either way; one that somehow serves is stopped after 5 s.
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while child.try_wait().ok().flatten().is_none() {
                if std::time::Instant::now() > deadline {
                    let _ = child.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let output = child.wait_with_output().expect("the server's output");
            let said = String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr);
            let version = Command::new(&program)
                .arg("--version")
                .output()
                .map(|out| {
                    let line = String::from_utf8_lossy(&out.stdout).into_owned();
                    line.split(" sha=")
                        .next()
                        .unwrap_or_default()
                        .trim()
                        .to_owned()
                })
                .unwrap_or_default();
            (said.contains("TLS support") || said.contains("connection type tls")).then(|| {
                format!(
                    "{} ({version}) is built without TLS; the TLS tests run on a server built \
                     with it (Debian's redis-server)",
                    program.display()
                )
            })
        })
        .clone()
}

/// Set (to anything) where TLS must be tested: [`skip_without_tls`] then fails instead of
/// skipping. `.ci/run` sets it for its main run, on Debian's `redis-server`.
pub const REQUIRE_TLS_ENV: &str = "DISTLOCK_REQUIRE_TLS";

/// Whether the TLS test named `test` is skipped because this run's server serves no TLS
/// ([`without_tls`]); a skipped test says so by name, on stderr (written past the test
/// harness's capture, so the run's log shows it).
///
/// # Panics
/// When the server serves no TLS and [`REQUIRE_TLS_ENV`] is set: the run was to test TLS.
pub fn skip_without_tls(test: &str) -> bool {
    let Some(why) = without_tls() else {
        return false;
    };
    assert!(
        std::env::var_os(REQUIRE_TLS_ENV).is_none(),
        "`{test}` cannot run: {why}, and {REQUIRE_TLS_ENV} says this run must test TLS"
    );
    let _ = writeln!(std::io::stderr(), "skipped `{test}`: {why}");
    true
}

/// A `redis-server` serving TLS with a [`TestCa`]'s server certificate on its TLS port, and
/// plain RESP on another port for the harness.
pub struct TlsServer {
    server: RedisServer,
    tls_port: u16,
}

impl TlsServer {
    /// Starts a server whose TLS port uses `ca`'s server certificate, trusts `ca` for client
    /// certificates, and asks for them as `clients` says.
    ///
    /// # Panics
    /// When `redis-server` (built with TLS) is not on PATH or no server could be started.
    pub fn start(ca: &TestCa, clients: ClientCerts) -> Self {
        Self::start_with(ca, clients, &[])
    }

    /// [`start`](Self::start), with `extra` arguments for `redis-server`.
    ///
    /// # Panics
    /// When `redis-server` (built with TLS) is not on PATH or no server could be started.
    pub fn start_with(ca: &TestCa, clients: ClientCerts, extra: &[&str]) -> Self {
        Self::start_presenting(ca, ServerCert::Good, clients, extra)
    }

    /// [`start_with`](Self::start_with), presenting `cert` on the TLS port.
    ///
    /// # Panics
    /// When `openssl` fails, or `redis-server` (built with TLS) is not on PATH or no server
    /// could be started.
    pub fn start_presenting(
        ca: &TestCa,
        cert: ServerCert,
        clients: ClientCerts,
        extra: &[&str],
    ) -> Self {
        let (cert, key) = ca.server_cert(cert);
        let (cert, key) = (
            cert.to_string_lossy().into_owned(),
            key.to_string_lossy().into_owned(),
        );
        let ca_cert = ca.path("ca.crt").to_string_lossy().into_owned();
        for _ in 0..20 {
            let (port, tls_port) = (free_port(), free_port());
            let tls_port_arg = tls_port.to_string();
            let auth = match clients {
                ClientCerts::No => "no",
                ClientCerts::Required => "yes",
            };
            let mut args = vec![
                "--tls-port",
                &tls_port_arg,
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca_cert,
                "--tls-auth-clients",
                auth,
            ];
            args.extend_from_slice(extra);
            // Up once the plain port answers: both listeners are open before either serves.
            match TestRedis::builder().args(&args).port(port).start_blocking() {
                Ok(server) => {
                    return Self {
                        server: server.into(),
                        tls_port,
                    }
                }
                // A port was taken meanwhile, or TLS is not built in: try others.
                Err(TestRedisError::Startup { .. }) => {}
                Err(other) => panic!("{other}"),
            }
        }
        panic!("could not start redis-server with TLS (is it built with TLS support?)");
    }

    /// `rediss://127.0.0.1:TLS_PORT`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }

    /// `rediss://user:password@127.0.0.1:TLS_PORT`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("rediss://{user}:{password}@127.0.0.1:{}", self.tls_port)
    }

    /// The TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// The server, through its plain port: to look inside, pause or kill it.
    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    /// The server, to pause, kill or restart it (on the same ports).
    pub fn server_mut(&mut self) -> &mut RedisServer {
        &mut self.server
    }

    /// A builder for this server's TLS port that trusts `ca`, with 2 s timeouts like
    /// [`RedisServer::manager`]'s.
    pub fn manager_builder(&self, ca: &TestCa) -> LockManagerBuilder {
        manager_at(&self.url(), Duration::from_secs(2)).tls_ca_pem(ca.ca_pem())
    }
}

/// A Redis Cluster of [`TlsServer`]s (`tls-cluster yes`: the bus and replication are TLS too),
/// primaries only, created with `redis-cli --tls --cluster create` on their TLS ports. A node
/// answers `CLUSTER SLOTS` with the ports of the client's kind: TLS ports on a TLS connection,
/// plain ones on the harness's.
pub struct TlsCluster {
    nodes: Vec<TlsServer>,
}

impl TlsCluster {
    /// Starts `primaries` nodes (3 or more), creates the cluster, and waits until every node
    /// says `cluster_state:ok` and knows all the others.
    ///
    /// # Panics
    /// When a node does not start, `redis-cli --cluster create` fails, or the cluster is not
    /// ready within 20 s.
    pub fn start(ca: &TestCa, primaries: usize) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nodes: Vec<TlsServer> = (0..primaries)
            .map(|_| {
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                let config = ca.path(&format!("nodes-{n}.conf"));
                // A free bus port rather than the TLS port + 10000, which may be out of range.
                let bus_port = free_port().to_string();
                TlsServer::start_with(
                    ca,
                    ClientCerts::No,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &config.to_string_lossy(),
                        "--cluster-port",
                        &bus_port,
                        "--cluster-node-timeout",
                        "500",
                        "--tls-cluster",
                        "yes",
                        "--tls-replication",
                        "yes",
                    ],
                )
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.tls_port))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(ca.path("ca.crt"))
            .args(["--cluster", "create"])
            .args(&addresses)
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli: is it installed and on PATH?");
        assert!(
            output.status.success(),
            "redis-cli --tls --cluster create {} failed ({}):\n{}{}",
            addresses.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let known = format!("cluster_known_nodes:{primaries}\r\n");
        for node in &nodes {
            loop {
                let info = node.server.command(&["CLUSTER", "INFO"]);
                if info.contains("cluster_state:ok\r\n") && info.contains(&known) {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "TLS cluster not ready after 20 s: {info}"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Self { nodes }
    }

    /// `rediss://127.0.0.1:TLS_PORT` of every node.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(TlsServer::url).collect()
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &TlsServer {
        &self.nodes[i]
    }

    /// How many nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

/// One `redis-server --sentinel` serving TLS (with `tls-replication yes`: it watches its primary
/// over TLS), monitoring a [`TlsServer`] by its TLS port under [`TlsSentinel::MASTER_NAME`], so
/// it names the primary's TLS port. No failover is ever expected of it.
pub struct TlsSentinel {
    sentinel: RedisServer,
    tls_port: u16,
}

impl TlsSentinel {
    /// The name the sentinel knows the primary by.
    pub const MASTER_NAME: &'static str = "distlock-tls";

    /// Starts a sentinel watching `primary`, and waits until it names it.
    ///
    /// # Panics
    /// When the sentinel does not start or does not name the primary within 5 s.
    pub fn start(ca: &TestCa, primary: &TlsServer) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = |file: &str| ca.path(file).to_string_lossy().into_owned();
        for _ in 0..20 {
            let (port, tls_port) = (free_port(), free_port());
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let config_file = ca.path(&format!("sentinel-{n}.conf"));
            let config = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\ntls-port {tls_port}\n\
                 tls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {ca_cert}\n\
                 tls-auth-clients no\ntls-replication yes\n\
                 sentinel monitor {name} 127.0.0.1 {primary} 1\n",
                dir = path(""),
                cert = path("server.crt"),
                key = path("server.key"),
                ca_cert = path("ca.crt"),
                name = Self::MASTER_NAME,
                primary = primary.tls_port,
            );
            std::fs::write(&config_file, config).expect("write a sentinel config file");
            let started = TestRedis::builder()
                .config_file(&config_file)
                .arg("--sentinel")
                .port(port)
                .start_blocking();
            let sentinel = match started {
                Ok(sentinel) => RedisServer::from(sentinel),
                // A port was taken meanwhile: try others.
                Err(TestRedisError::Startup { .. }) => continue,
                Err(other) => panic!("{other}"),
            };
            let named =
                sentinel.command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::MASTER_NAME]);
            assert!(
                named.contains(&format!("\r\n{}\r\n", primary.tls_port)),
                "the sentinel names {named:?}, not the primary's TLS port"
            );
            return Self { sentinel, tls_port };
        }
        panic!("could not start a TLS sentinel on free ports");
    }

    /// `rediss://127.0.0.1:TLS_PORT` of the sentinel.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }

    /// The sentinel, through its plain port.
    pub fn server(&self) -> &RedisServer {
        &self.sentinel
    }
}
