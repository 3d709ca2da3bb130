//! The machine-core conformance suite against a pool of sushy-tools fake systems,
//! directly and through Retrying(FaultInjecting).

mod common;

use std::sync::Arc;
use std::time::Duration;

use machine_core::conformance::{self, Clients, Fixture};
use machine_core::decorators::{FaultConfig, FaultInjecting, Retrying};
use machine_core::{MachineProvisioner, MachineSpec, RetryPolicy};

use common::Sushy;

/// Enough fake systems for the suite's machines alive at once, of both owners.
const POOL: usize = 8;

fn fixture() -> Fixture {
    let mut fx = Fixture::new("redfish://127.0.0.1:1/no-such-system", |name| {
        MachineSpec::new(name.clone())
    });
    // sushy applies a reset 1-11 s after it is asked; delete waits for power off.
    fx.timeout = Duration::from_secs(60);
    fx.boot_timeout = Duration::from_secs(60);
    fx.poll = Duration::from_millis(250);
    fx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_against_sushy() {
    let sushy = Sushy::start(POOL);
    let claims = tempfile::tempdir().unwrap();
    let p: Arc<dyn MachineProvisioner> = common::provider(&sushy, claims.path(), "conf").await;
    // A second controller of the same owner: a restarted process.
    let second: Arc<dyn MachineProvisioner> = common::provider(&sushy, claims.path(), "conf").await;
    let other: Arc<dyn MachineProvisioner> =
        common::provider(&sushy, claims.path(), "conf-other").await;
    conformance::run_all(&Clients::new(p, second, other), &fixture()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_retrying_fault_injecting() {
    let sushy = Sushy::start(POOL);
    let claims = tempfile::tempdir().unwrap();
    let faults = FaultConfig::default()
        .with_error_rate(0.1)
        .with_lost_response_rate(0.1)
        .with_seed(Some(16));
    let wrap = |p: Arc<dyn MachineProvisioner>| -> Arc<dyn MachineProvisioner> {
        let faulty = FaultInjecting::new(p, faults.clone()).expect("fault config");
        Arc::new(Retrying::new(faulty, RetryPolicy::default()))
    };
    let p = wrap(common::provider(&sushy, claims.path(), "conf").await);
    let second = wrap(common::provider(&sushy, claims.path(), "conf").await);
    let other = wrap(common::provider(&sushy, claims.path(), "conf-other").await);
    conformance::run_all(&Clients::new(p, second, other), &fixture()).await;
}
