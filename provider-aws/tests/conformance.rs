//! The machine-core conformance suite against moto's EC2, directly and through the
//! retrying decorator.

mod common;

use std::sync::Arc;

use machine_core::conformance::{self, Clients, Fixture};
use machine_core::decorators::Retrying;
use machine_core::{MachineProvisioner, RetryPolicy};

use common::{AMI, Moto};

fn fixture() -> Fixture {
    let mut fx = Fixture::new("aws:///us-east-1a/i-0123456789abcdef0", |name| {
        machine_core::MachineSpec::new(name.clone())
            .with_image(AMI)
            .with_size("t3.micro")
    });
    fx.timeout = std::time::Duration::from_secs(30);
    fx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_against_moto() {
    let moto = Moto::start();
    let owner = common::owner("conformance");
    let p: Arc<dyn MachineProvisioner> = Arc::new(common::provider(&moto.endpoint, &owner).await);
    // A second client on the same account and owner: a restarted process.
    let second: Arc<dyn MachineProvisioner> =
        Arc::new(common::provider(&moto.endpoint, &owner).await);
    let other: Arc<dyn MachineProvisioner> =
        Arc::new(common::provider(&moto.endpoint, &format!("{owner}-other")).await);
    conformance::run_all(&Clients::new(p, second, other), &fixture()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_the_retrying_decorator() {
    let moto = Moto::start();
    let owner = common::owner("conformance-retrying");
    let wrap =
        |p| -> Arc<dyn MachineProvisioner> { Arc::new(Retrying::new(p, RetryPolicy::default())) };
    let p = wrap(common::provider(&moto.endpoint, &owner).await);
    let second = wrap(common::provider(&moto.endpoint, &owner).await);
    let other = wrap(common::provider(&moto.endpoint, &format!("{owner}-other")).await);
    conformance::run_all(&Clients::new(p, second, other), &fixture()).await;
}
