//! machine-core's composer driving a decoupled layer over real SSH: the machine comes
//! from the simulator, its software goes over the SSH connector to a real sshd.

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use bootstrap_ssh::SshConnector;
use machine_core::sim::{SimCloud, SimConfig, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    Access, CancellationToken, Composer, Connector, Machine, MachineName, MachineSpec, Phase,
    Result, Transport,
};
use support::Sshd;

/// Points every simulated machine at the real sshd, the way a provider reports the
/// SSH endpoint and host keys of the machines it creates.
struct PointAt {
    inner: SshConnector,
    access: Access,
}

#[async_trait]
impl Connector for PointAt {
    async fn connect(&self, machine: &Machine) -> Result<Arc<dyn Transport>> {
        let mut real = machine.clone();
        real.access = self.access.clone();
        self.inner.connect(&real).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_composer_applies_a_decoupled_layer_over_ssh() {
    let sshd = Sshd::start();
    let d = sshd.dir.path();
    let cloud = SimCloud::new();
    let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default()).unwrap());
    let layer = StepLayer::new(
        "app",
        vec![
            Step::write_file(d.join("app.conf").to_str().unwrap(), "port=8080\n"),
            Step::run(format!("echo started >> {}", d.join("app.log").display())),
        ],
    )
    .unwrap()
    .with_state_dir(d.join("state").to_str().unwrap())
    .unwrap();
    let connector = PointAt {
        inner: SshConnector::new(sshd.config()),
        access: sshd.machine("x").access,
    };
    let composer = Composer::builder(provider)
        .decoupled(Arc::new(layer))
        .connector(Arc::new(connector))
        .build()
        .unwrap();
    let spec = MachineSpec::new(MachineName::new("web-1").unwrap());
    let done = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    assert_eq!(
        std::fs::read_to_string(d.join("app.conf")).unwrap(),
        "port=8080\n"
    );
    // Provisioning again adopts the machine and finds the layer applied.
    let again = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(again.machine.phase, Phase::Ready);
    assert_eq!(
        std::fs::read_to_string(d.join("app.log")).unwrap(),
        "started\n"
    );
}
