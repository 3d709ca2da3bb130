//! The served-once HTTPS store at 1,000 machines: the server's CPU per document
//! served, against two TLS file servers serving the same files to the same client in
//! the same run (`openssl s_server -WWW` and Python's `http.server` over `ssl`).
//!
//! ```text
//! cargo run -p bootstrap-store --example bench_store [-- N [CONCURRENCY]]
//! ```
//!
//! N documents (default 1,000) of about 16 KiB of cloud-config each are put in an
//! [`bootstrap_store::HttpsStore`] on 127.0.0.1, each bound to its own machine's
//! address (127.1.x.y, as [`machine_core::bootstrap_data::BootstrapDataStore::expect_clients`]
//! would bind it), then fetched once each over TLS by a child process (this example
//! run as `fetch`), CONCURRENCY (default 16) at a time, each connection from its
//! machine's address, with a client that pins the server's certificate as the stub
//! does and offers X25519 only, as the stub's OpenSSL 3.0 does. Every reply is checked
//! (status 200, the document's length). The server's CPU is the sum of the on-CPU time
//! of its process's threads (`/proc/<pid>/task/*/schedstat`, user and system) over the
//! fetches, so the client's CPU is never counted. Needs `openssl` and `python3` on PATH.

use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootstrap_store::{HttpsStore, HttpsStoreConfig, Network};
use machine_core::bootstrap_data::{BootstrapDataStore, Location};
use machine_core::{ExposeSecret, MachineName};
use rustls::pki_types::ServerName;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../tests/support/pinned.rs"]
mod pinned;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The on-CPU time of every thread of process `pid`, user and system, in nanoseconds.
fn cpu_ns(pid: u32) -> Res<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        // A thread that ended between the listing and the read has nothing to add.
        if let Ok(text) = std::fs::read_to_string(&path) {
            total += text
                .split_whitespace()
                .next()
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

/// The address machine `i` fetches from: 127.1.x.y, on loopback.
fn client_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        127,
        1,
        u8::try_from(i / 250).unwrap_or(u8::MAX),
        u8::try_from(i % 250 + 1).unwrap_or(u8::MAX),
    ))
}

/// A cloud-config of about 16 KiB for machine `i`: users with keys, a few files, a
/// certificate bundle's worth of text, commands; different for every machine.
fn document(i: usize) -> String {
    let mut seed: [u8; 32] = Sha256::digest(format!("machine-{i}")).into();
    let mut hex_line = || {
        seed = Sha256::digest(seed).into();
        hex::encode(seed)
    };
    let mut d = format!(
        "#cloud-config\nhostname: web-{i}\nusers:\n  - name: deploy\n    groups: [sudo]\n    shell: /bin/bash\n    ssh_authorized_keys:\n"
    );
    for k in 0..4 {
        d += &format!(
            "      - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5{} ops-{k}@example\n",
            &hex_line()[..48]
        );
    }
    d += "write_files:\n  - path: /etc/app/app.env\n    permissions: '0600'\n    content: |\n";
    d += &format!(
        "      JOIN_TOKEN={}\n      NODE=web-{i}\n      MODE=prod\n",
        hex_line()
    );
    d += "  - path: /etc/pki/bundle.pem\n    content: |\n";
    while d.len() < 15 * 1024 {
        d += "      ";
        d += &hex_line();
        d += "\n";
    }
    d += "runcmd:\n  - [systemctl, daemon-reload]\n  - [systemctl, enable, --now, app.service]\n";
    while d.len() < 16 * 1024 {
        d += "  - [sh, -c, 'echo step >> /var/log/app-setup.log']\n";
    }
    d
}

/// The fetcher, run as a child: reads the server's address and certificate (hex), then
/// one `client-ip path length` line per document from stdin, fetches each once and
/// prints `ok bytes wall-seconds suite group`.
async fn fetch_main(concurrency: usize) -> Res<()> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let mut lines = input.lines();
    let server: SocketAddr = lines.next().ok_or("no server")?.parse()?;
    let pin = hex::decode(lines.next().ok_or("no certificate")?)?;
    let jobs: Vec<(IpAddr, String, usize)> = lines
        .map(|l| {
            let mut w = l.split_whitespace();
            Ok((
                w.next().ok_or("no ip")?.parse()?,
                w.next().ok_or("no path")?.to_owned(),
                w.next().ok_or("no length")?.parse()?,
            ))
        })
        .collect::<Res<_>>()?;
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519];
    let tls = pinned::pinned_connector(pin, provider)?;
    let jobs = Arc::new(std::sync::Mutex::new(jobs));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (jobs, tls) = (jobs.clone(), tls.clone());
        workers.push(tokio::spawn(async move {
            let (mut ok, mut bytes, mut negotiated) = (0usize, 0usize, String::new());
            loop {
                let Some((ip, path, len)) = jobs.lock().map_err(|_| "poisoned")?.pop() else {
                    break;
                };
                let socket = tokio::net::TcpSocket::new_v4()?;
                socket.bind(SocketAddr::new(ip, 0))?;
                let stream = socket.connect(server).await?;
                let mut conn = tls.connect(ServerName::try_from("store")?, stream).await?;
                if negotiated.is_empty() {
                    let c = conn.get_ref().1;
                    let suite = c.negotiated_cipher_suite().map(|s| s.suite());
                    let group = c.negotiated_key_exchange_group().map(|g| g.name());
                    if let (Some(suite), Some(group)) = (suite, group) {
                        negotiated = format!("{suite:?}/{group:?}");
                    }
                }
                conn.write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: store\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await?;
                let mut out = Vec::new();
                // A server that closes without close_notify (s_server) ends in an error
                // after the whole reply: the reply is checked below either way.
                let _ = conn.read_to_end(&mut out).await;
                let head_end = out.windows(4).position(|w| w == b"\r\n\r\n");
                let status = String::from_utf8_lossy(&out[..head_end.unwrap_or(0)])
                    .split_whitespace()
                    .nth(1)
                    .map(str::to_owned);
                let body = head_end.map_or(0, |e| out.len() - e - 4);
                if status.as_deref() == Some("200") && body == len {
                    ok += 1;
                    bytes += body;
                } else {
                    eprintln!("{path}: status {status:?}, {body} bytes of {len}");
                }
            }
            Res::Ok((ok, bytes, negotiated))
        }));
    }
    let (mut ok, mut bytes, mut negotiated) = (0, 0, String::new());
    for w in workers {
        let (o, b, n) = w.await??;
        ok += o;
        bytes += b;
        if negotiated.is_empty() {
            negotiated = n;
        }
    }
    println!(
        "{ok} {bytes} {} {}",
        start.elapsed().as_secs_f64(),
        negotiated.replace(' ', "")
    );
    Ok(())
}

/// What one server did for the fetches.
struct Served {
    ok: usize,
    wall: f64,
    cpu: Duration,
    negotiated: String,
}

/// Runs the fetcher against `server` (whose process is `pid`) over `jobs`, measuring
/// `pid`'s CPU from just before the fetcher gets its work to its end.
fn fetch(
    server: SocketAddr,
    pid: u32,
    certificate_der: &[u8],
    jobs: &[(IpAddr, String, usize)],
    concurrency: usize,
) -> Res<Served> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["fetch", &concurrency.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut work = format!("{server}\n{}\n", hex::encode(certificate_der));
    for (ip, path, len) in jobs {
        work += &format!("{ip} {path} {len}\n");
    }
    let before = cpu_ns(pid)?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    stdin.write_all(work.as_bytes())?;
    drop(stdin);
    let mut out = String::new();
    child
        .stdout
        .take()
        .ok_or("no stdout")?
        .read_to_string(&mut out)?;
    let status = child.wait()?;
    let after = cpu_ns(pid)?;
    if !status.success() {
        return Err(format!("the fetcher failed: {status}").into());
    }
    let mut w = out.split_whitespace();
    let ok = w.next().ok_or("no count")?.parse()?;
    let _bytes: usize = w.next().ok_or("no bytes")?.parse()?;
    let wall = w.next().ok_or("no wall")?.parse()?;
    Ok(Served {
        ok,
        wall,
        cpu: Duration::from_nanos(after.saturating_sub(before)),
        negotiated: w.next().unwrap_or("?").to_owned(),
    })
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> Res<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Waits until something accepts connections on `addr`.
fn wait_listening(addr: SocketAddr, child: &mut Child) -> Res<()> {
    for _ in 0..200 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            return Err(format!("the peer server ended: {status}").into());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Err(format!("nothing listens on {addr}").into())
}

/// Stops a peer server this example started.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn row(label: &str, n: usize, s: &Served, store_cpu: Option<Duration>) {
    let per = s.cpu.as_secs_f64() * 1e6 / s.ok.max(1) as f64;
    println!(
        "{label:<34} {:>5}/{n:<5} {:>8.2}s {:>9.3}s {:>9.0} us {:>8} {}",
        s.ok,
        s.wall,
        s.cpu.as_secs_f64(),
        per,
        store_cpu.map_or("1.00".into(), |c| format!(
            "{:.2}",
            s.cpu.as_secs_f64() / c.as_secs_f64().max(1e-9)
        )),
        s.negotiated
    );
}

fn run(cmd: &mut Command) -> Res<()> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)).into())
    }
}

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let first = args.next();
    if first.as_deref() == Some("fetch") {
        let concurrency = args.next().map(|a| a.parse()).transpose()?.unwrap_or(16);
        return tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(fetch_main(concurrency));
    }
    let n: usize = first.map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let concurrency: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(16);
    let pid = std::process::id();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let docs: Vec<String> = (0..n).map(document).collect();
    let mean = docs.iter().map(String::len).sum::<usize>() / n.max(1);

    // The store, its documents put and bound to their machines' addresses.
    let store = runtime.block_on(HttpsStore::start(
        HttpsStoreConfig::new("127.0.0.1:0".parse()?).allow(Network::parse("127.0.0.0/8")?),
    ))?;
    let put_before = cpu_ns(pid)?;
    let put_start = Instant::now();
    let mut store_jobs = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let name = MachineName::new(format!("web-{i}"))?;
        let Location::Https(h) = runtime.block_on(store.put(&name, doc.as_bytes()))? else {
            return Err("not an HTTPS location".into());
        };
        runtime.block_on(store.expect_clients(&name, &[client_ip(i)]))?;
        let url = h.url.expose_secret();
        let path = &url[url.find("/v1/").ok_or("no /v1/ in the URL")?..];
        store_jobs.push((client_ip(i), path.to_owned(), doc.len()));
    }
    let put_wall = put_start.elapsed();
    let put_cpu = Duration::from_nanos(cpu_ns(pid)?.saturating_sub(put_before));

    // The same documents as files for the peers, under a certificate of the same kind
    // (self-signed ECDSA P-256).
    let dir = tempfile::tempdir()?;
    let files = dir.path().join("www");
    std::fs::create_dir_all(&files)?;
    let mut file_jobs = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        std::fs::write(files.join(format!("doc-{i}")), doc)?;
        file_jobs.push((client_ip(i), format!("/doc-{i}"), doc.len()));
    }
    let (key, cert, der) = (
        dir.path().join("key.pem"),
        dir.path().join("cert.pem"),
        dir.path().join("cert.der"),
    );
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=store", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert))?;
    run(Command::new("openssl")
        .args(["x509", "-outform", "DER", "-in"])
        .arg(&cert)
        .arg("-out")
        .arg(&der))?;
    let peer_der = std::fs::read(&der)?;

    println!(
        "bootstrap-store: {n} documents of {mean} bytes (mean), each fetched once over TLS, {concurrency} at a time, on {} cores (load {})",
        std::thread::available_parallelism().map_or(0, |c| c.get()),
        std::fs::read_to_string("/proc/loadavg")?.trim()
    );
    println!(
        "puts (and bindings): {:.3}s wall, {:.3}s CPU, {:.0} us CPU a document",
        put_wall.as_secs_f64(),
        put_cpu.as_secs_f64(),
        put_cpu.as_secs_f64() * 1e6 / n.max(1) as f64
    );
    println!(
        "{:<34} {:>11} {:>9} {:>10} {:>12} {:>8} negotiated",
        "server", "served", "wall", "server CPU", "CPU / doc", "x store"
    );

    let ours = fetch(
        store.addr(),
        pid,
        store.certificate_der(),
        &store_jobs,
        concurrency,
    )?;
    let stats = store.stats();
    if stats.served != n as u64 || store.documents_in_memory() != 0 {
        return Err(format!("the store served {} of {n}: {stats:?}", stats.served).into());
    }
    row("bootstrap-store HttpsStore", n, &ours, None);

    let port = free_port()?;
    let mut s_server = Peer(
        Command::new("openssl")
            .args(["s_server", "-quiet", "-WWW", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .current_dir(&files)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_listening(addr, &mut s_server.0)?;
    let s = fetch(addr, s_server.0.id(), &peer_der, &file_jobs, concurrency)?;
    row("openssl s_server -WWW", n, &s, Some(ours.cpu));
    drop(s_server);

    let mut python = Peer(
        Command::new("python3")
            .arg("-c")
            .arg(PYTHON_SERVER)
            .arg(&files)
            .arg(&cert)
            .arg(&key)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?,
    );
    let mut first_line = String::new();
    std::io::BufReader::new(python.0.stdout.take().ok_or("no stdout")?)
        .read_line(&mut first_line)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], first_line.trim().parse::<u16>()?));
    wait_listening(addr, &mut python.0)?;
    let p = fetch(addr, python.0.id(), &peer_der, &file_jobs, concurrency)?;
    row("python3 http.server + ssl", n, &p, Some(ours.cpu));
    drop(python);
    Ok(())
}

/// Python's `http.server` over TLS, one request at a time, no request log; prints its
/// port. Arguments: the directory, the certificate, the key.
const PYTHON_SERVER: &str = r#"
import functools, http.server, ssl, sys
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
class Server(http.server.HTTPServer):
    request_queue_size = 128
handler = functools.partial(Quiet, directory=sys.argv[1])
server = Server(("127.0.0.1", 0), handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[2], sys.argv[3])
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;
