//! The machine-core conformance suite against vcsim: through a fault proxy that answers
//! CloneVM_Task as vCenter refuses it (permission, capacity), and through the retrying
//! decorator over a fault injector. A VMware Tools stand-in gives booted VMs their
//! addresses, as a guest would.

mod common;

use std::sync::Arc;
use std::time::Duration;

use machine_core::conformance::{self, Clients, Fixture};
use machine_core::decorators::{FaultConfig, FaultInjecting, Retrying};
use machine_core::{MachineProvisioner, RetryPolicy};
use provider_vsphere::VsphereProvider;

use common::Vcsim;
use common::proxy::FaultProxy;
use common::tools::Tools;

fn fixture() -> Fixture {
    let mut fx = Fixture::new(
        "vsphere://00000000-0000-0000-0000-000000000000",
        common::spec,
    );
    fx.timeout = Duration::from_secs(30);
    fx.boot_timeout = Duration::from_secs(30);
    // What Machine::size reads back: the VM's numCPU and memoryMB.
    fx.sizes = vec!["1x64".into(), "2x128".into()];
    // The suite's default rounds (8 crash rounds, 3 replica rounds of 3 replicas and 4
    // names): vcsim answers in about a millisecond, and both runs together take about
    // 6 s on 2 shared cores, so neither run needs fewer.
    fx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_against_vcsim() {
    let vcsim = Vcsim::start();
    let _tools = Tools::start(&vcsim).await;
    let proxy = Arc::new(FaultProxy::start(&vcsim).await);
    let owner = common::owner("conformance");
    let make = {
        let proxy = proxy.clone();
        let (url, fingerprint) = (vcsim.url.clone(), vcsim.fingerprint);
        move |owner: &str| -> Arc<dyn MachineProvisioner> {
            let config = common::config_at(&url, fingerprint, owner);
            Arc::new(proxy.provider(config))
        }
    };
    let fresh = {
        let (make, owner) = (make.clone(), owner.clone());
        move || {
            let p = make(&owner);
            Box::pin(async move { p }) as futures_util::future::BoxFuture<'static, _>
        }
    };
    let clients =
        Clients::new(make(&owner), make(&owner), make(&format!("{owner}-other"))).with_fresh(fresh);
    let mut fx = fixture();
    fx.faults = Some(proxy.hook());
    conformance::run_all(&clients, &fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_retrying_over_injected_faults() {
    let vcsim = Vcsim::start();
    let _tools = Tools::start(&vcsim).await;
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
    let wrap = {
        let (url, fingerprint) = (vcsim.url.clone(), vcsim.fingerprint);
        move |owner: &str| -> Arc<dyn MachineProvisioner> {
            let config = common::config_at(&url, fingerprint, owner);
            let p = VsphereProvider::new(config.build().expect("test config")).expect("provider");
            let p = FaultInjecting::new(p, faults.clone()).expect("fault config");
            Arc::new(Retrying::new(p, policy))
        }
    };
    let fresh = {
        let (wrap, owner) = (wrap.clone(), owner.clone());
        move || {
            let p = wrap(&owner);
            Box::pin(async move { p }) as futures_util::future::BoxFuture<'static, _>
        }
    };
    let clients =
        Clients::new(wrap(&owner), wrap(&owner), wrap(&format!("{owner}-other"))).with_fresh(fresh);
    let fx = fixture();
    conformance::run_all(&clients, &fx).await;
}
