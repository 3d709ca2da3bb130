//! The machine-core conformance suite against moto's EC2, one test per case, three
//! times:
//! `ignored` talks to moto directly, whose RunInstances ignores client tokens (the
//! provider configured `clientTokens: ignored`, every create settling races by the
//! oldest launch); `honoured` goes through the test proxy, which gives RunInstances
//! real EC2's token semantics (the default `clientTokens: honoured`) and answers with
//! EC2's own error documents when the backend-faults case asks
//! ([`common::proxy::Ec2Faults`]). The faults case needs a proxy on the wire, so the
//! direct runs have no hook; the mapping it checks does not depend on token semantics.
//! `retrying` is `ignored` with every client inside the retrying decorator.
//!
//! Facts of moto the fixture states: instances run as soon as they are listed, so
//! the boot timeout is short; any instance type is accepted and read back, so two
//! sizes; moto runs no guest and its console is one canned boot log without
//! cloud-init's host-key block, so host-key discovery is off (the provider declares
//! it only where configured: see `AwsConfigBuilder::host_key_discovery`); the SSH user
//! comes from the config's defaults, as the image's user would.

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use machine_core::conformance::{Clients, Fixture};
use machine_core::decorators::Retrying;
use machine_core::{MachineProvisioner, MachineSpec, RetryPolicy};
use provider_aws::{AwsConfigBuilder, AwsProvider, Ec2Settings};

use common::proxy::{Ec2Faults, FaultProxy, Faults};
use common::{AMI, Moto};

/// What a test keeps alive: moto, and the proxy in front of it.
struct Peers {
    _proxy: Option<Arc<FaultProxy>>,
    _moto: Arc<Moto>,
}

fn fixture() -> Fixture {
    let mut fx = Fixture::new("aws:///us-east-1a/i-0123456789abcdef0", |name| {
        MachineSpec::new(name.clone())
            .with_image(AMI)
            .with_size("t3.micro")
    });
    fx.timeout = Duration::from_secs(30);
    fx.boot_timeout = Duration::from_secs(30);
    fx.poll = Duration::from_millis(200);
    fx.sizes = vec!["t3.micro".into(), "m5.large".into()];
    fx
}

/// The config of every provider instance of one run: `base` (endpoint, owner and the
/// endpoint's token semantics) with moto's facts above.
fn config(base: AwsConfigBuilder) -> provider_aws::AwsConfig {
    base.defaults(Ec2Settings {
        ssh_user: Some("admin".into()),
        ..Ec2Settings::default()
    })
    .host_key_discovery(false)
    .build()
    .expect("test config")
}

/// How the clients of a run reach moto, and what wraps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// Straight to moto.
    Direct,
    /// Through the token proxy.
    TokenProxy,
    /// Straight to moto, every client inside `Retrying` with the default policy.
    DirectRetrying,
}

async fn make(base: AwsConfigBuilder, run: Run) -> Arc<dyn MachineProvisioner> {
    let p = AwsProvider::new(config(base)).await.expect("provider");
    if run == Run::DirectRetrying {
        Arc::new(Retrying::new(p, RetryPolicy::default()))
    } else {
        Arc::new(p)
    }
}

/// Clients on moto as `run` says.
async fn setup(run: Run) -> (Clients, Fixture, Peers) {
    let through_token_proxy = run == Run::TokenProxy;
    // One moto for the cases running meanwhile: each case keeps to its own owner and
    // run prefix, and a moto of its own would cost each case more than its work.
    let moto = Moto::shared();
    let owner = common::owner("conformance");
    let mut fx = fixture();
    if run == Run::DirectRetrying {
        // The decorator only retries what the provider reports; what a crash or a race
        // of replicas leaves is the provider's, proven by the `ignored` run's full
        // rounds (the most expensive cases here: each create waits out its race
        // window). A round of each keeps the wrapped provider honest at a fraction.
        fx.crash_rounds = 2;
        fx.replica_rounds = 1;
    }
    let (endpoint, proxy) = if through_token_proxy {
        let proxy = Arc::new(FaultProxy::start(moto.addr, Faults::default(), 22).await);
        fx.faults = Some(Arc::new(Ec2Faults::new(proxy.clone())));
        (proxy.endpoint.clone(), Some(proxy))
    } else {
        (moto.endpoint.clone(), None)
    };
    let base = move |owner: &str| {
        if through_token_proxy {
            common::config_via_proxy(&endpoint, owner)
        } else {
            common::config(&endpoint, owner)
        }
    };
    let fresh = {
        let (base, owner) = (base.clone(), owner.clone());
        move || -> BoxFuture<'static, Arc<dyn MachineProvisioner>> {
            Box::pin(make(base(&owner), run))
        }
    };
    let clients = Clients::new(
        make(base(&owner), run).await,
        make(base(&owner), run).await,
        make(base(&format!("{owner}-other")), run).await,
    )
    .with_fresh(fresh);
    (
        clients,
        fx,
        Peers {
            _proxy: proxy,
            _moto: moto,
        },
    )
}

/// Straight to moto, which launches on every RunInstances.
mod ignored {
    async fn setup() -> (
        machine_core::conformance::Clients,
        machine_core::conformance::Fixture,
        super::Peers,
    ) {
        super::setup(super::Run::Direct).await
    }

    machine_core::conformance_tests!(setup);
}

/// Through the proxy that gives moto EC2's client-token semantics and error answers.
mod honoured {
    async fn setup() -> (
        machine_core::conformance::Clients,
        machine_core::conformance::Fixture,
        super::Peers,
    ) {
        super::setup(super::Run::TokenProxy).await
    }

    machine_core::conformance_tests!(setup);
}

/// Straight to moto, every client inside the retrying decorator: what a controller
/// runs, retries deciding above the provider (the crate docs' "one layer decides").
mod retrying {
    async fn setup() -> (
        machine_core::conformance::Clients,
        machine_core::conformance::Fixture,
        super::Peers,
    ) {
        super::setup(super::Run::DirectRetrying).await
    }

    machine_core::conformance_tests!(setup);
}
