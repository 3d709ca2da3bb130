//! Test peers for provider-aws: a moto server per test, a fault-injecting HTTP proxy in
//! front of it for what moto cannot do, and a tripwire that proves no call was made.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod proxy;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use machine_core::{MachineName, MachineSpec, SecretString};
use provider_aws::{AwsConfig, AwsConfigBuilder, AwsProvider};

/// An AMI among moto's defaults (DescribeImages knows it, with root device /dev/sda1).
pub const AMI: &str = "ami-760aaa0f";
/// The region every test uses; moto keys its state by the signature's region.
pub const REGION: &str = "us-east-1";

/// A moto server on a loopback port it chose itself, killed (by PID) when dropped.
///
/// moto binds port 0 and reports the port it got, so no other process can take the
/// port between a probe and moto's bind (a probed port can also be taken as the
/// ephemeral source port of one of the many connections the tests make).
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The last lines moto logged (one per request), shown when a test fails.
    log: Arc<Mutex<VecDeque<String>>>,
}

/// How many of moto's log lines a failing test shows.
const LOG_TAIL: usize = 40;

fn moto_server_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MOTO_SERVER") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    cache.join("machine-provisioning/moto/bin/moto_server")
}

impl Moto {
    /// Starts moto with its defaults.
    pub fn start() -> Moto {
        Moto::start_with(&[])
    }

    /// Starts moto with extra environment (`MOTO_ENABLE_AMI_VALIDATION=true`).
    ///
    /// # Panics
    /// When moto is not installed (saying how to install it), exits, or does not say
    /// where it listens within 60 s.
    pub fn start_with(env: &[(&str, &str)]) -> Moto {
        let bin = moto_server_path();
        assert!(
            bin.exists(),
            "moto_server not found at {}: run scripts/test or scripts/peers/30-moto.sh \
             (or set MOTO_SERVER to its path)",
            bin.display()
        );
        let mut cmd = Command::new(&bin);
        cmd.args(["-H", "127.0.0.1", "-p", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let stderr = child.stderr.take().expect("piped stderr");

        // Werkzeug logs ` * Running on http://127.0.0.1:<port>` once bound, then a line
        // per request: read on until the port shows, then keep draining (a full pipe
        // would stall moto) and keep the tail for a failing test.
        let log = Arc::new(Mutex::new(VecDeque::with_capacity(LOG_TAIL)));
        let (port_tx, port_rx) = mpsc::channel();
        let tail = log.clone();
        std::thread::spawn(move || {
            let mut port_tx = Some(port_tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(tx) = &port_tx
                    && let Some(port) = line
                        .split_once("Running on http://127.0.0.1:")
                        .and_then(|(_, p)| p.trim().parse::<u16>().ok())
                {
                    let _ = tx.send(port);
                    port_tx = None;
                }
                let mut tail = tail.lock().unwrap();
                if tail.len() == LOG_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let port = match port_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(port) => port,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().ok();
                let said: Vec<String> = log.lock().unwrap().iter().cloned().collect();
                panic!(
                    "moto_server did not say where it listens within 60 s (exit: {status:?}):\n{}",
                    said.join("\n")
                );
            }
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        Moto {
            child,
            endpoint: format!("http://{addr}"),
            addr,
            log,
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let tail = self.log.lock().unwrap();
            eprintln!("moto at {} logged, last {} lines:", self.addr, tail.len());
            for line in tail.iter() {
                eprintln!("  {line}");
            }
        }
    }
}

/// A unique owner per test, so tests sharing nothing still never see each other.
pub fn owner(test: &str) -> String {
    format!("{test}-{:06x}", fastrand::u32(..) & 0xffffff)
}

/// A config builder for moto (or a proxy) at `endpoint`: static keys, one region.
pub fn config(endpoint: &str, owner: &str) -> AwsConfigBuilder {
    AwsConfig::builder()
        .region(REGION)
        .endpoint_url(endpoint)
        .static_credentials("testing", SecretString::from("testing"))
        .owner(owner)
        .image(AMI)
        .connect_timeout(Duration::from_secs(2))
        .attempt_timeout(Duration::from_secs(20))
}

/// A provider for moto (or a proxy) at `endpoint`.
pub async fn provider(endpoint: &str, owner: &str) -> AwsProvider {
    AwsProvider::new(config(endpoint, owner).build().expect("test config"))
        .await
        .expect("provider")
}

/// A spec for `name` with moto's AMI and a small instance type.
pub fn spec(name: &str) -> MachineSpec {
    MachineSpec::new(MachineName::new(name).expect("test name")).with_size("t3.micro")
}

/// A loopback listener that accepts and counts connections and never answers: a
/// provider pointed at it proves, by a zero count, that it sent nothing.
pub struct Tripwire {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Tripwire {
    /// Starts listening; needs a tokio runtime.
    pub async fn start() -> Tripwire {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let endpoint = format!("http://{}", listener.local_addr().expect("local addr"));
        let connections = Arc::new(AtomicUsize::new(0));
        let count = connections.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(stream);
            }
        });
        Tripwire {
            endpoint,
            connections,
            task,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Tripwire {
    fn drop(&mut self) {
        self.task.abort();
    }
}
