//! machine-core's conformance suite against real local machines.

mod support;

use std::time::Duration;

use machine_core::MachineSpec;
use machine_core::conformance::{self, Clients, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_machines_pass_the_conformance_suite() {
    let lab = support::Lab::new();
    let clients = Clients::new(
        lab.provider("conf"),
        lab.provider("conf"),
        lab.provider("someone-else"),
    );
    let mut fixture = Fixture::new("local:///conf/none", |name| MachineSpec::new(name.clone()));
    // cloud-init's four stages take seconds on a loaded 2-core host.
    fixture.boot_timeout = Duration::from_secs(180);
    fixture.poll = Duration::from_millis(100);
    conformance::run_all(&clients, &fixture).await;
    // Every machine the suite made is gone: no directory is left for the owner.
    let owner_dir = lab.run_dir.join("conf");
    let left: Vec<_> = std::fs::read_dir(&owner_dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "machines left behind: {left:?}");
}
