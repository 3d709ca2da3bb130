//! Credentials that cannot be found fail at once as unauthorized, through the composer,
//! instead of being retried as a connection failure until the create deadline.
//!
//! The standard chain reads the process environment and home directory, which a test
//! cannot change safely in a multi-threaded process: the test runs itself again as a
//! child process with an environment holding no credentials (and the instance
//! metadata lookup off, so nothing leaves loopback), and the child does the check.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use machine_core::MachineProvisioner;
use machine_core::decorators::Retrying;
use machine_core::{
    CancellationToken, Composer, ComposerSettings, Deadlines, ErrorKind, RetryPolicy,
};
use provider_aws::{AwsConfig, AwsProvider, CredentialSource};

/// Set in the child's environment: do the check instead of starting a child.
const CHILD: &str = "PROVIDER_AWS_TEST_NO_CREDENTIALS_CHILD";
const TEST: &str = "missing_credentials_fail_provision_at_once";

#[test]
fn missing_credentials_fail_provision_at_once() {
    if std::env::var_os(CHILD).is_some() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(check());
        return;
    }
    let home = std::env::temp_dir().join(format!("no-aws-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).expect("empty home");
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env_clear()
        .env(CHILD, "1")
        .env("HOME", &home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", home.join("absent-config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            home.join("absent-credentials"),
        )
        .output()
        .expect("running the test binary as a child");
    let _ = std::fs::remove_dir_all(&home);
    assert!(
        out.status.success(),
        "the child check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The child ran the check, not nothing.
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

// ComposerSettings is becoming #[non_exhaustive]: a struct literal would not
// compile outside machine-core, so fields are set on the default.
async fn check() {
    // Nothing may be sent: the failure is local.
    let tripwire = common::Tripwire::start().await;
    let config = AwsConfig::builder()
        .region(common::REGION)
        .endpoint_url(&tripwire.endpoint)
        .credentials(CredentialSource::DefaultChain)
        .owner("no-credentials")
        .image(common::AMI)
        .build()
        .expect("config");
    let provider = Retrying::new(
        AwsProvider::new(config).await.expect("provider"),
        RetryPolicy::default(),
    );
    let settings = ComposerSettings::default()
        .with_poll_interval(Duration::from_millis(200))
        .with_deadlines(Deadlines::default().with_create(Duration::from_secs(60)));
    let composer = Composer::builder(Arc::new(provider))
        .settings(settings)
        .build()
        .expect("composer");
    let started = Instant::now();
    let e = composer
        .provision(&common::spec("nocreds-1"), &CancellationToken::new())
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(e.to_string().contains("credentials"), "{e}");
    assert!(
        took < Duration::from_secs(10),
        "took {took:?}: retried instead of failing at once"
    );
    assert_eq!(tripwire.connections(), 0, "a request was sent");
}

/// An endpoint whose host name does not resolve is named with the region in the error,
/// so that an operator sees which setting is wrong.
#[tokio::test]
async fn an_unresolvable_endpoint_is_named_with_its_region() {
    let provider = common::provider("http://no-such-ec2-endpoint.invalid:4566", "dns").await;
    let e = provider
        .find(&machine_core::MachineName::new("dns-1").unwrap())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(e.is_retryable(), "{msg}");
    assert!(msg.contains("no-such-ec2-endpoint.invalid"), "{msg}");
    assert!(msg.contains(common::REGION), "{msg}");
}
