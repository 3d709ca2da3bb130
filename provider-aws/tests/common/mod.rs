//! Test peers for provider-aws: a moto server per test, a fault-injecting HTTP proxy in
//! front of it for what moto cannot do, and a tripwire that proves no call was made.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod moto;
pub mod proxy;

// Not every test binary starts moto.
#[allow(unused_imports)]
pub use moto::Moto;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use machine_core::{MachineName, MachineSpec, SecretString};
use provider_aws::{AwsConfig, AwsConfigBuilder, AwsProvider};

/// An AMI among moto's defaults (DescribeImages knows it, with root device /dev/sda1).
pub const AMI: &str = "ami-760aaa0f";
/// The region every test uses; moto keys its state by the signature's region.
pub const REGION: &str = "us-east-1";

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

/// An SDK client of its own for moto at `endpoint`, for what the provider does not
/// show (volumes) or must not do (launching a duplicate from outside).
pub async fn sdk(endpoint: &str) -> aws_sdk_ec2::Client {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "testing", "testing", None, None, "tests",
        ))
        .load()
        .await;
    aws_sdk_ec2::Client::new(&config)
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
