//! TLS trust against a real, independent TLS server: `openssl s_server`, with a CA and a
//! server certificate made by the `openssl` command line tool.

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use machine_core::ErrorKind;
use provider_http::{CertFingerprint, HttpClient, HttpSettings, TlsConfig};

/// A CA, a server certificate it signed for 127.0.0.1, and `openssl s_server` serving it.
struct Server {
    dir: PathBuf,
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("openssl").args(args).current_dir(dir).output().unwrap_or_else(|e| {
        panic!("the `openssl` command is needed for these tests ({e}): install it with `apt-get install openssl` (scripts/peers/15-openssl.sh)")
    });
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Server {
    fn start(name: &str) -> Server {
        let dir = std::env::temp_dir().join(format!("provider-http-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &dir,
            &[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=provider-http test CA",
                ],
            ]
            .concat(),
        );
        openssl(
            &dir,
            &[
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=127.0.0.1",
                ],
            ]
            .concat(),
        );
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
            ],
        );
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("openssl")
            .args([
                "s_server",
                "-accept",
                &format!("127.0.0.1:{port}"),
                "-cert",
                "server.pem",
                "-key",
                "server.key",
                "-www",
                "-quiet",
            ])
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server");
        let server = Server { dir, child, port };
        let start = Instant::now();
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            assert!(
                // Generous: a loaded machine ten times slower still starts it in time.
                start.elapsed() < Duration::from_secs(60),
                "openssl s_server did not listen on {port} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/some/path?token=hidden", self.port)
    }

    /// The server certificate's fingerprint as OpenSSL prints it (`sha256 Fingerprint=AB:…`).
    fn openssl_fingerprint(&self) -> String {
        let out = openssl(
            &self.dir,
            &[
                "x509",
                "-in",
                "server.pem",
                "-noout",
                "-fingerprint",
                "-sha256",
            ],
        );
        out.trim().rsplit('=').next().unwrap().to_string()
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
}

async fn get(tls: TlsConfig, url: &str) -> machine_core::Result<reqwest::StatusCode> {
    let client = HttpClient::new(&HttpSettings::new().with_tls(tls))?;
    Ok(client.send(client.inner().get(url)).await?.status())
}

#[tokio::test]
async fn the_default_refuses_a_server_whose_ca_is_not_a_system_root() {
    let server = Server::start("default");
    let err = get(TlsConfig::new(), &server.url()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Permanent, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("https://127.0.0.1:") && text.contains("not trusted"),
        "{text}"
    );
    assert!(
        text.contains("with_ca_file") && text.contains("with_pinned_sha256"),
        "says what to do: {text}"
    );
    assert!(
        !text.contains("token=hidden") && !text.contains("/some/path"),
        "no path or query: {text}"
    );
}

#[tokio::test]
async fn a_server_signed_by_the_given_ca_is_trusted() {
    let server = Server::start("ca");
    let status = get(
        TlsConfig::new().with_ca_file(server.ca_file()),
        &server.url(),
    )
    .await
    .unwrap();
    assert!(status.is_success(), "{status}");
}

#[tokio::test]
async fn a_pin_written_as_openssl_prints_it_is_trusted() {
    let server = Server::start("pin");
    let pin: CertFingerprint = server.openssl_fingerprint().parse().unwrap();
    assert_eq!(
        pin.to_string(),
        server.openssl_fingerprint(),
        "the same text as OpenSSL's"
    );
    let status = get(TlsConfig::new().with_pinned_sha256(pin), &server.url())
        .await
        .unwrap();
    assert!(status.is_success(), "{status}");
}

#[tokio::test]
async fn a_wrong_pin_is_refused_naming_both_fingerprints() {
    let server = Server::start("wrongpin");
    let wrong = CertFingerprint::of_der(b"another certificate");
    let err = get(TlsConfig::new().with_pinned_sha256(wrong), &server.url())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Permanent, "{err}");
    let text = err.to_string();
    assert!(text.contains(&wrong.to_string()), "names the pin: {text}");
    assert!(
        text.contains(&server.openssl_fingerprint()),
        "names what the server presented: {text}"
    );
}

#[tokio::test]
async fn a_ca_pin_is_not_the_servers_pin() {
    // Pinning pins the server's own certificate; its CA's fingerprint does not match it.
    let server = Server::start("capin");
    let ca = openssl(
        &server.dir,
        &["x509", "-in", "ca.pem", "-noout", "-fingerprint", "-sha256"],
    );
    let pin: CertFingerprint = ca.trim().rsplit('=').next().unwrap().parse().unwrap();
    let err = get(TlsConfig::new().with_pinned_sha256(pin), &server.url())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not the pinned"), "{err}");
}

#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

#[tokio::test]
async fn insecure_connects_and_warns_on_every_handshake() {
    let server = Server::start("insecure");
    let logs = Logs::default();
    // A current-thread runtime: the handshakes run on this thread, under this subscriber.
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(logs.clone())
            .finish(),
    );
    let client =
        HttpClient::new(&HttpSettings::new().with_tls(TlsConfig::new().insecure())).unwrap();
    for _ in 0..3 {
        // s_server -www answers HTTP/1.0 and closes: each request is a new handshake.
        let response = client.send(client.inner().get(server.url())).await.unwrap();
        assert!(response.status().is_success());
        response.bytes().await.unwrap();
    }
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert_eq!(text.matches("WITHOUT verification").count(), 3, "{text}");
    assert_eq!(
        text.matches("verification is OFF").count(),
        1,
        "once when built: {text}"
    );
    assert!(
        text.contains(&server.openssl_fingerprint()),
        "shows the fingerprint to pin: {text}"
    );
}

#[tokio::test]
async fn a_refused_connection_is_transient() {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = get(TlsConfig::new(), &format!("https://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Transient, "{err}");
    assert!(err.to_string().contains("could not connect"), "{err}");
}
