//! The machine-core conformance suite against vcsim, directly and through the retrying
//! decorator over a fault injector.

mod common;

use std::sync::Arc;
use std::time::Duration;

use machine_core::conformance::{self, Clients, Fixture};
use machine_core::decorators::{FaultConfig, FaultInjecting, Retrying};
use machine_core::{MachineProvisioner, RetryPolicy};

use common::Vcsim;

fn fixture() -> Fixture {
    let mut fx = Fixture::new(
        "vsphere://00000000-0000-0000-0000-000000000000",
        common::spec,
    );
    fx.timeout = Duration::from_secs(30);
    fx.boot_timeout = Duration::from_secs(30);
    fx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_against_vcsim() {
    let vcsim = Vcsim::start();
    let owner = common::owner("conformance");
    let p: Arc<dyn MachineProvisioner> = Arc::new(common::provider(&vcsim, &owner));
    let second: Arc<dyn MachineProvisioner> = Arc::new(common::provider(&vcsim, &owner));
    let other: Arc<dyn MachineProvisioner> =
        Arc::new(common::provider(&vcsim, &format!("{owner}-other")));
    conformance::run_all(&Clients::new(p, second, other), &fixture()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_retrying_over_injected_faults() {
    let vcsim = Vcsim::start();
    let owner = common::owner("conformance-faults");
    // Lost answers are the hard case: a clone that happened while its caller saw an
    // error must be adopted by the retry, not cloned again.
    let faults = FaultConfig::default()
        .with_error_rate(0.15)
        .with_throttle_rate(0.05)
        .with_retry_after(Some(Duration::from_millis(2)))
        .with_lost_response_rate(0.15);
    let policy = RetryPolicy::default()
        .with_max_retries(12)
        .with_initial_delay(Duration::from_millis(1))
        .with_max_delay(Duration::from_millis(5));
    let wrap = |owner: &str| -> Arc<dyn MachineProvisioner> {
        let p = FaultInjecting::new(common::provider(&vcsim, owner), faults.clone())
            .expect("fault config");
        Arc::new(Retrying::new(p, policy))
    };
    conformance::run_all(
        &Clients::new(wrap(&owner), wrap(&owner), wrap(&format!("{owner}-other"))),
        &fixture(),
    )
    .await;
}
