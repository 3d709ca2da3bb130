//! machine-core's conformance suite against real local machines, one test per case, each
//! in a lab of its own (bridge, subnet, run directory).

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use machine_core::MachineProvisioner;
use machine_core::conformance::{Clients, Fixture};
use machine_core::{MachineSpec, RetryPolicy};
use support::{ClientKey, Lab};

/// What a case keeps alive: its lab and client key. On drop, after the case passed, it
/// checks that the case left no machine directory of its owner behind; then the lab
/// tears down whatever is there.
struct Kept {
    lab: Lab,
    _key: ClientKey,
}

impl Drop for Kept {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let owner_dir = self.lab.run_dir.join("conf");
        let left: Vec<_> = std::fs::read_dir(&owner_dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name())
                    .filter(|n| n != ".locks")
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "machines left behind: {left:?}");
        let locks: Vec<_> = std::fs::read_dir(owner_dir.join(".locks"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(locks.is_empty(), "lock files left behind: {locks:?}");
    }
}

async fn setup() -> (Clients, Fixture, Kept) {
    let lab = Lab::new();
    let key = ClientKey::new();
    let fresh = {
        let config = lab.config("conf");
        move || {
            let p: Arc<dyn MachineProvisioner> =
                Arc::new(provider_local::LocalProvider::new(config.clone()).expect("provider"));
            Box::pin(async move { p }) as Pin<Box<dyn Future<Output = _> + Send>>
        }
    };
    let clients = Clients::new(
        lab.provider("conf"),
        lab.provider("conf"),
        lab.provider("someone-else"),
    )
    .with_fresh(fresh);
    let access = key.access("root");
    let mut fixture = Fixture::new("local:///conf/none/00000000", move |name| {
        let mut spec = MachineSpec::new(name.clone());
        spec.ssh = Some(access.clone());
        spec
    });
    // cloud-init's four stages take seconds on a loaded 2-core host.
    fixture.boot_timeout = Duration::from_secs(180);
    fixture.poll = Duration::from_millis(100);
    // Machines share this host's CPUs and memory: the provider takes no size.
    fixture.sizes = Vec::new();
    // The machine's own sshd, with the host keys it made pinned from `access.hostKeys`:
    // a stopped machine must refuse, a started one answer. A connection is retried for
    // 3 s only, so that the stopped machine's refusal comes back soon.
    let ssh = key.ssh_config().with_retry(
        RetryPolicy::default()
            .with_initial_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_millis(500)),
        Duration::from_secs(3),
    );
    fixture.connector = Some(Arc::new(bootstrap_ssh::SshConnector::new(ssh)));
    // Nothing can stand between this provider and its backend: the backend is this
    // host's kernel and file system, reached by system calls and `ip`, with no wire and
    // no quota, capacity, permission or throttle answer of its own to inject.
    fixture.faults = None;
    // A /24 holds 253 machines, far more than any case makes at once.
    fixture.capacity = None;
    // A create has 7 await points (network, lock, prepare, files, record, boot, read)
    // and a delete 5; tests/crashes.rs abandons each of them in turn and checks the
    // host, so the suite's rounds sample them rather than cover them twice.
    fixture.crash_rounds = 4;
    fixture.replica_rounds = 2;
    (clients, fixture, Kept { lab, _key: key })
}

machine_core::conformance_tests!(setup);
