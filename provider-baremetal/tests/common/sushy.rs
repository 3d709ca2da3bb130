//! A sushy-tools Redfish emulator per test: the fake driver (no libvirt), N fake
//! systems, its own state directory, a free loopback port; killed by PID when dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The virtualenv scripts/peers/60-sushy-tools.sh installs sushy-tools into.
pub fn venv() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    cache.join("machine-provisioning/sushy-tools")
}

/// One fake system's identity.
#[derive(Debug, Clone)]
pub struct FakeSystem {
    /// Its Redfish id (a UUID, as sushy's fake driver uses).
    pub id: String,
    /// Its name.
    pub name: String,
}

/// What a sushy-emulator enforces beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Basic auth: the one account (user, password) its htpasswd file holds.
    pub auth: Option<(String, String)>,
    /// Serve HTTPS with a fresh certificate for 127.0.0.1 from a fresh private CA.
    pub tls: bool,
}

/// A running sushy-emulator.
pub struct Sushy {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The fake systems it serves, in the order configured.
    pub systems: Vec<FakeSystem>,
    dir: tempfile::TempDir,
    /// The CA certificate (PEM) that signed its certificate, when serving HTTPS.
    pub cert_pem: Option<PathBuf>,
    /// The server certificate's SHA-256 fingerprint, `AB:CD:...`, as openssl prints it.
    pub fingerprint: Option<String>,
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Sushy {
    /// Starts sushy-emulator with `n` fake systems, all powered off.
    ///
    /// # Panics
    /// When sushy-tools is not installed (saying how to install it), or it does not
    /// answer within 30 s.
    pub fn start(n: usize) -> Sushy {
        Sushy::start_with(n, &Options::default())
    }

    /// Starts sushy-emulator with `n` fake systems and `options`.
    ///
    /// # Panics
    /// As [`Sushy::start`]; also when openssl or bcrypt (in sushy's venv) fail.
    pub fn start_with(n: usize, options: &Options) -> Sushy {
        let bin = venv().join("bin/sushy-emulator");
        assert!(
            bin.exists(),
            "sushy-emulator not found at {}: run scripts/peers/60-sushy-tools.sh (or scripts/test)",
            bin.display()
        );
        let tag = format!("{:08x}", fastrand::u32(..));
        let systems: Vec<FakeSystem> = (0..n)
            .map(|i| FakeSystem {
                id: format!("{tag}-0000-4000-8000-{i:012x}"),
                name: format!("fake-{i}"),
            })
            .collect();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut extra = String::new();
        if let Some((user, password)) = &options.auth {
            let hash = run(Command::new(venv().join("bin/python")).args([
                "-c",
                "import bcrypt, sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(4)).decode())",
                password,
            ]));
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, format!("{user}:{}\n", hash.trim())).expect("htpasswd");
            extra.push_str(&format!(
                "SUSHY_EMULATOR_AUTH_FILE = '{}'\n",
                file.display()
            ));
        }
        let (mut cert_pem, mut fingerprint) = (None, None);
        if options.tls {
            // A private CA and a server certificate it signed for 127.0.0.1: a CA
            // certificate itself is refused as a server's (webpki: CaUsedAsEndEntity).
            let p = |f: &str| dir.path().join(f);
            let (cert, key) = (p("cert.pem"), p("key.pem"));
            let ec = [
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
            ];
            run(Command::new("openssl")
                .args(["req", "-x509"])
                .args(ec)
                .args(["-days", "1", "-subj", "/CN=test BMC CA", "-keyout"])
                .arg(p("ca-key.pem"))
                .arg("-out")
                .arg(p("ca.pem")));
            run(Command::new("openssl")
                .args(["req", "-new"])
                .args(ec)
                .args(["-subj", "/CN=127.0.0.1", "-keyout"])
                .arg(&key)
                .arg("-out")
                .arg(p("req.pem")));
            std::fs::write(
                p("ext.cnf"),
                "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
            )
            .expect("extensions file");
            run(Command::new("openssl")
                .args(["x509", "-req", "-days", "1", "-in"])
                .arg(p("req.pem"))
                .arg("-CA")
                .arg(p("ca.pem"))
                .arg("-CAkey")
                .arg(p("ca-key.pem"))
                .args(["-CAcreateserial", "-extfile"])
                .arg(p("ext.cnf"))
                .arg("-out")
                .arg(&cert));
            let fp = run(Command::new("openssl")
                .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
                .arg(&cert));
            fingerprint = Some(fp.trim().rsplit('=').next().unwrap_or_default().to_owned());
            extra.push_str(&format!(
                "SUSHY_EMULATOR_SSL_CERT = '{}'\nSUSHY_EMULATOR_SSL_KEY = '{}'\n",
                cert.display(),
                key.display()
            ));
            cert_pem = Some(p("ca.pem"));
        }
        let scheme = if options.tls { "https" } else { "http" };
        // sushy takes a fixed port from its config: take a free one from the kernel and
        // retry when another process grabs it first.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free loopback port")
                .port();
            let fakes: Vec<String> = systems
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    format!(
                        "{{'uuid': '{}', 'name': '{}', 'power_state': 'Off', \
                         'nics': [{{'mac': '52:54:00:00:{:02x}:{:02x}', 'ip': '{}'}}]}}",
                        s.id,
                        s.name,
                        i / 256,
                        i % 256,
                        fake_ip(i)
                    )
                })
                .collect();
            let config = format!(
                "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
                 SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
                 SUSHY_EMULATOR_FAKE_DRIVER = True\n\
                 SUSHY_EMULATOR_STATE_DIR = '{state}'\n\
                 SUSHY_EMULATOR_FAKE_SYSTEMS = [{fakes}]\n{extra}",
                state = dir.path().join("state").display(),
                fakes = fakes.join(", "),
            );
            let config_path = dir.path().join("emulator.conf");
            std::fs::write(&config_path, config).expect("writing sushy's config");
            let log = std::fs::File::create(dir.path().join("emulator.log")).expect("log file");
            let tmp = dir.path().join("tmp");
            std::fs::create_dir_all(&tmp).expect("sushy's temporary directory");
            let mut child = Command::new(&bin)
                // InsertMedia downloads images under TMPDIR: keep them in this run's dir.
                .env("TMPDIR", &tmp)
                .arg("--config")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log file"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(status) = child.try_wait().expect("waiting on sushy") {
                    let said = std::fs::read_to_string(dir.path().join("emulator.log"))
                        .unwrap_or_default();
                    if said.contains("Address already in use") {
                        break;
                    }
                    panic!("sushy-emulator exited ({status}):\n{said}");
                }
                if answers(addr, options.tls) {
                    // A burst of first requests on a fresh emulator can wipe changes
                    // other requests just made: read every system once, one at a time.
                    if !options.tls {
                        for s in &systems {
                            warm(addr, &s.id, options.auth.as_ref());
                        }
                    }
                    return Sushy {
                        child,
                        endpoint: format!("{scheme}://{addr}"),
                        addr,
                        systems,
                        dir,
                        cert_pem,
                        fingerprint,
                    };
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("sushy-emulator did not answer on {addr} within 30 s");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("sushy-emulator could not get a free port in 5 tries");
    }

    /// sushy's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The images InsertMedia downloaded whose file name is `name`, as sushy stored them.
    pub fn downloaded(&self, name: &str) -> Vec<Vec<u8>> {
        let mut found = Vec::new();
        let mut dirs = vec![self.dir.path().join("tmp")];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.file_name().is_some_and(|n| n == name) {
                    found.push(std::fs::read(&p).expect("reading a downloaded image"));
                }
            }
        }
        found
    }

    /// What sushy logged so far (one line per request).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("emulator.log")).unwrap_or_default()
    }
}

/// The address sushy gives fake system `i`'s NIC, where the tests' pools say its OS
/// answers.
pub fn fake_ip(i: usize) -> String {
    format!("192.0.2.{}", 1 + i % 250)
}

/// Reads system `id` once over plain HTTP (with basic auth when given).
fn warm(addr: SocketAddr, id: &str, auth: Option<&(String, String)>) {
    use base64::Engine;
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let authorization = auth
        .map(|(u, p)| {
            format!(
                "Authorization: Basic {}\r\n",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        })
        .unwrap_or_default();
    let req =
        format!("GET /redfish/v1/Systems/{id} HTTP/1.0\r\nHost: {addr}\r\n{authorization}\r\n");
    if s.write_all(req.as_bytes()).is_ok() {
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
    }
}

/// Whether a Redfish service root answers at `addr` (any status: with auth it is 401;
/// with TLS, an accepted connection).
fn answers(addr: SocketAddr, tls: bool) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    if tls {
        return true;
    }
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /redfish/v1/ HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("sushy-emulator at {} logged, last lines:", self.addr);
            for line in tail.iter().rev() {
                eprintln!("  {line}");
            }
        }
    }
}
