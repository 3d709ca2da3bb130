//! The crate's layers in machine-core's composer on the simulator: a cloud-config layer
//! and per-machine derived host keys coupled, the key pinned for the decoupled step.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, DerivedHostKeys, Secret, User};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, Composer, Connector, Machine, MachineName, MachineSpec, Phase, Result,
    SentinelFile, Transport,
};

/// Records the access info each connection was asked for, then connects for real.
struct Recording {
    inner: SimConnector,
    seen: Mutex<Vec<Vec<String>>>,
}

#[async_trait]
impl Connector for Recording {
    async fn connect(&self, machine: &Machine) -> Result<Arc<dyn Transport>> {
        self.seen
            .lock()
            .unwrap()
            .push(machine.access.host_keys.clone());
        self.inner.connect(machine).await
    }
}

#[tokio::test]
async fn coupled_layers_and_pinned_host_keys_through_the_composer() {
    let cloud = SimCloud::new();
    let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default()).unwrap());
    let keys = DerivedHostKeys::new(Secret::new("test master secret, 32 bytes or more")).unwrap();
    let base = CloudConfigLayer::new(
        "base",
        CloudConfig::new()
            .with_user(User::new("ops"))
            .with_package("curl"),
    )
    .unwrap();
    let recording = Arc::new(Recording {
        inner: SimConnector::new(cloud.clone()),
        seen: Mutex::default(),
    });
    let composer = Composer::builder(provider)
        .coupled(Arc::new(base))
        .coupled(Arc::new(keys.clone()))
        .decoupled(Arc::new(
            StepLayer::new("app", vec![Step::run("true")]).unwrap(),
        ))
        .connector(recording.clone())
        .completion(Arc::new(SentinelFile::default()))
        .build()
        .unwrap();
    let name = MachineName::new("web-1").unwrap();
    let done = composer
        .provision(&MachineSpec::new(name.clone()), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    let key = keys.for_machine(&name).unwrap();
    // The machine got the key in its user data...
    let host = cloud.host(&done.machine.provider_id).unwrap();
    let user_data = host
        .file_text("/var/lib/cloud/instance/user-data.txt")
        .expect("user data stored by the simulator");
    assert!(user_data.contains("text/cloud-config"), "{user_data}");
    assert!(
        user_data.contains("host-keys.cloud-config.yaml"),
        "{user_data}"
    );
    // ...and every connection was asked to pin it (besides any key the provider
    // itself reports).
    let seen = recording.seen.lock().unwrap();
    assert!(!seen.is_empty());
    for keys_seen in seen.iter() {
        assert!(
            keys_seen.contains(&key.public().to_owned()),
            "{keys_seen:?}"
        );
    }
}
