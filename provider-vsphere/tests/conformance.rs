//! The machine-core conformance suite against vcsim, directly and through the retrying
//! decorator over a fault injector.

mod common;

use std::sync::Arc;
use std::time::Duration;

use machine_core::conformance::{self, Clients, Fixture};
use machine_core::decorators::Retrying;
use machine_core::{MachineProvisioner, RetryPolicy};

use common::Vcsim;

fn fixture() -> Fixture {
    let mut fx = Fixture::new("vsphere://00000000-0000-0000-0000-000000000000", common::spec);
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
