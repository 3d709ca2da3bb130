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

/// A `CloudConfigLayer` carrying its own host key in `ssh_keys` gets it pinned, as the
/// derived keys are; a raw layer installing a key it does not name is refused.
#[tokio::test]
async fn a_layers_own_host_key_is_pinned_and_an_unnamed_one_refused() {
    let cloud = SimCloud::new();
    let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default()).unwrap());
    let key = bootstrap_cloudinit::HostKey::generate_ed25519("web-1").unwrap();
    let keyed = CloudConfigLayer::new(
        "keyed",
        CloudConfig {
            ssh_keys: Some(key.ssh_keys()),
            ..CloudConfig::new()
        },
    )
    .unwrap();
    let recording = Arc::new(Recording {
        inner: SimConnector::new(cloud.clone()),
        seen: Mutex::default(),
    });
    let composer = Composer::builder(provider.clone())
        .coupled(Arc::new(keyed.clone()))
        .decoupled(Arc::new(
            StepLayer::new("app", vec![Step::run("true")]).unwrap(),
        ))
        .connector(recording.clone())
        .completion(Arc::new(SentinelFile::default()))
        .build()
        .unwrap();
    let done = composer
        .provision(
            &MachineSpec::new(MachineName::new("web-1").unwrap()),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    let seen = recording.seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(
        seen.iter()
            .all(|keys| keys.contains(&key.public().to_owned())),
        "the layer's own host key was not pinned: {seen:?}"
    );

    /// The same document, as a layer type that does not name its keys.
    struct Unnamed(Vec<machine_core::UserDataPart>);
    impl machine_core::Software for Unnamed {
        fn name(&self) -> &str {
            "unnamed"
        }
    }
    impl machine_core::CoupledSoftware for Unnamed {
        fn user_data_parts(&self, _: &MachineSpec) -> Result<Vec<machine_core::UserDataPart>> {
            Ok(self.0.clone())
        }
    }
    let composer = Composer::builder(provider)
        .coupled(Arc::new(Unnamed(keyed.parts().unwrap())))
        .build()
        .unwrap();
    let e = composer
        .user_data(&MachineSpec::new(MachineName::new("web-2").unwrap()))
        .unwrap_err();
    assert_eq!(e.field(), Some("ssh_keys"), "{e}");
    assert!(e.to_string().contains("\"unnamed\""), "{e}");
    assert!(!e.to_string().contains("PRIVATE"), "{e}");
}

/// A template layer's host name is checked against another layer's through its view
/// rendered for the machine: equal names pass, a different one is refused; merge
/// settings in a layer are refused where the layer is made.
#[tokio::test]
async fn template_layers_are_checked_through_their_views_and_merge_settings_refused() {
    let cloud = SimCloud::new();
    let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default()).unwrap());
    let template = CloudConfigLayer::new("tpl", CloudConfig::new())
        .unwrap()
        .with_jinja2(
            "host.yaml",
            "## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\n",
        )
        .unwrap();
    let fixed = CloudConfigLayer::new("fixed", CloudConfig::new().with_hostname("web-1")).unwrap();
    let composer = Composer::builder(provider)
        .coupled(Arc::new(fixed))
        .coupled(Arc::new(template))
        .build()
        .unwrap();
    composer
        .user_data(&MachineSpec::new(MachineName::new("web-1").unwrap()))
        .expect("the template renders web-1's own name");
    let e = composer
        .user_data(&MachineSpec::new(MachineName::new("db-1").unwrap()))
        .unwrap_err();
    assert_eq!(e.field(), Some("hostname"), "{e}");
    assert!(e.to_string().contains("\"tpl\""), "{e}");

    let mut extra = std::collections::BTreeMap::new();
    extra.insert("merge_how".to_owned(), serde_json::json!("dict(replace)"));
    let e = CloudConfigLayer::new(
        "merging",
        CloudConfig {
            extra,
            ..CloudConfig::new()
        },
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("layer merging.merge_how"), "{e}");
}
