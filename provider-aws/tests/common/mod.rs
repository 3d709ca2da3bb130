//! Test peers for provider-aws: a moto server per test, a fault-injecting HTTP proxy in
//! front of it for what moto cannot do, and a tripwire that proves no call was made.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod proxy;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use machine_core::{MachineName, MachineSpec, SecretString};
use provider_aws::{AwsConfig, AwsConfigBuilder, AwsProvider};

/// An AMI among moto's defaults (DescribeImages knows it, with root device /dev/sda1).
pub const AMI: &str = "ami-760aaa0f";
/// The region every test uses; moto keys its state by the signature's region.
pub const REGION: &str = "us-east-1";

/// A moto server on a free loopback port, killed (by PID) when dropped.
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The address it listens on.
    pub addr: SocketAddr,
}

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
    /// When moto is not installed (saying how to install it) or does not answer in 60 s.
    pub fn start_with(env: &[(&str, &str)]) -> Moto {
        let bin = moto_server_path();
        assert!(
            bin.exists(),
            "moto_server not found at {}: run scripts/test or scripts/peers/30-moto.sh \
             (or set MOTO_SERVER to its path)",
            bin.display()
        );
        // A port another test grabs between our probe and moto's bind makes moto exit:
        // try again on another port.
        for _ in 0..5 {
            let port = free_port();
            let mut cmd = Command::new(&bin);
            cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            for (k, v) in env {
                cmd.env(k, v);
            }
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let mut moto = Moto {
                child,
                endpoint: format!("http://{addr}"),
                addr,
            };
            if moto.wait_ready(Duration::from_secs(60)) {
                return moto;
            }
        }
        panic!("moto_server did not start on a free port in 5 tries");
    }

    fn wait_ready(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "moto_server on {} did not answer within {timeout:?}",
            self.addr
        );
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding a loopback port")
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
