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
use provider_aws::{AwsConfig, AwsConfigBuilder, AwsProvider, ClientTokens};

/// An AMI among moto's defaults (DescribeImages knows it, with root device /dev/sda1).
pub const AMI: &str = "ami-760aaa0f";
/// The region every test uses; moto keys its state by the signature's region.
pub const REGION: &str = "us-east-1";

/// A unique owner per test, so tests sharing nothing still never see each other.
pub fn owner(test: &str) -> String {
    format!("{test}-{:06x}", fastrand::u32(..) & 0xffffff)
}

/// A config builder for bare moto at `endpoint`: static keys, one region, and client
/// tokens declared ignored, as moto ignores them (every create settles races).
pub fn config(endpoint: &str, owner: &str) -> AwsConfigBuilder {
    config_via_proxy(endpoint, owner).client_tokens(ClientTokens::Ignored)
}

/// A config builder for moto behind [`proxy::FaultProxy`] at `endpoint`, which gives
/// RunInstances EC2's token semantics: the default `clientTokens: honoured`.
pub fn config_via_proxy(endpoint: &str, owner: &str) -> AwsConfigBuilder {
    AwsConfig::builder()
        .region(REGION)
        .endpoint_url(endpoint)
        .static_credentials("testing", SecretString::from("testing"))
        .owner(owner)
        .image(AMI)
        .connect_timeout(Duration::from_secs(2))
        .attempt_timeout(Duration::from_secs(20))
}

/// A provider for bare moto at `endpoint` (see [`config`]).
pub async fn provider(endpoint: &str, owner: &str) -> AwsProvider {
    AwsProvider::new(config(endpoint, owner).build().expect("test config"))
        .await
        .expect("provider")
}

/// A provider for moto behind [`proxy::FaultProxy`] at `endpoint` (see
/// [`config_via_proxy`]).
pub async fn provider_via_proxy(endpoint: &str, owner: &str) -> AwsProvider {
    AwsProvider::new(
        config_via_proxy(endpoint, owner)
            .build()
            .expect("test config"),
    )
    .await
    .expect("provider")
}

/// Waits, when the next token epoch (ten minutes of Unix time) begins within 40 s, until
/// it has begun: a create acknowledged near an epoch's end settles races (a wait and a
/// lookup) even where tokens are honoured, which a test counting lookups must avoid.
pub async fn away_from_an_epoch_end() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let left = 600 - now % 600;
    if left <= 40 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
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

/// Every instance moto holds with `owner`'s tag: its `Name` tag and state, listed in
/// pages of 100 (one answer with a thousand instances can take moto over 20 s).
pub async fn moto_instances(endpoint: &str, owner: &str) -> Vec<(String, String)> {
    let sdk = sdk(endpoint).await;
    let filter = aws_sdk_ec2::types::Filter::builder()
        .name(format!("tag:{}", provider_aws::tags::OWNER_TAG))
        .values(owner)
        .build();
    let pages: Vec<_> = sdk
        .describe_instances()
        .filters(filter)
        .max_results(100)
        .into_paginator()
        .send()
        .collect()
        .await;
    let mut out = Vec::new();
    for page in pages {
        let page = page.expect("listing moto's instances");
        for i in page.reservations().iter().flat_map(|r| r.instances()) {
            let name = i
                .tags()
                .iter()
                .find(|t| t.key() == Some("Name"))
                .and_then(|t| t.value())
                .unwrap_or_default();
            let state = i.state().and_then(|s| s.name()).map(|n| n.as_str());
            out.push((name.to_owned(), state.unwrap_or_default().to_owned()));
        }
    }
    out
}
