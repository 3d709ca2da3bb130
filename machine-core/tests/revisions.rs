//! Revisions on the simulator: the coupled revision stamped at create and read back by a
//! new process, drift shown when the spec or a coupled layer changes; a decoupled layer's
//! digest recorded on the machine, so an unchanged layer costs one read and a changed
//! one is applied again in place.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use machine_core::revision::{LAYER_SET_PATH, REVISION_LABEL, layer_digest_path};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, Composer, DecoupledSoftware, FileUpload, Machine, MachineName,
    MachineProvisioner, MachineSpec, Phase, Result, Software, Transport, conditions,
};

fn spec(name: &str) -> MachineSpec {
    MachineSpec::new(MachineName::new(name).unwrap())
}

fn sim(cloud: &SimCloud) -> Arc<SimProvider> {
    Arc::new(SimProvider::new(cloud.clone(), SimConfig::default()).unwrap())
}

fn coupled(motd: &str) -> Arc<StepLayer> {
    Arc::new(StepLayer::new("base", vec![Step::write_file("/etc/motd", motd)]).unwrap())
}

#[tokio::test]
async fn the_coupled_revision_is_stamped_read_back_and_drift_shown() {
    let cloud = SimCloud::new();
    let composer = |motd: &str| {
        Composer::builder(sim(&cloud))
            .coupled(coupled(motd))
            .build()
            .unwrap()
    };
    let first = composer("v1\n");
    let done = first
        .provision(&spec("web-1"), &CancellationToken::new())
        .await
        .unwrap();
    let stamped = done
        .machine
        .revision()
        .expect("stamped at create")
        .to_owned();
    assert_eq!(stamped.len(), 40);
    assert_eq!(
        done.machine
            .condition(conditions::UP_TO_DATE)
            .map(|c| c.status),
        Some(true)
    );
    // A new process reads it back from the provider.
    let found = sim(&cloud)
        .find(&spec("web-1").name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.labels.get(REVISION_LABEL), Some(&stamped));

    // The same layers: current. Another coupled layer: drift, and no second machine.
    let again = composer("v1\n")
        .reconcile(&spec("web-1"), None)
        .await
        .unwrap();
    let m = again.machine.unwrap();
    assert_eq!(
        m.condition(conditions::UP_TO_DATE).unwrap().reason,
        conditions::CURRENT
    );
    let changed = composer("v2\n")
        .reconcile(&spec("web-1"), None)
        .await
        .unwrap();
    let m = changed.machine.unwrap();
    let c = m.condition(conditions::UP_TO_DATE).unwrap();
    assert!(!c.status);
    assert_eq!(c.reason, conditions::COUPLED_CHANGED);
    assert!(c.message.contains(&stamped), "{}", c.message);
    assert_eq!(
        m.provider_id, done.machine.provider_id,
        "drift is shown, not acted on"
    );
    // A spec change that shapes the machine drifts too.
    let bigger = composer("v1\n")
        .reconcile(&spec("web-1").with_size("large"), None)
        .await
        .unwrap();
    assert!(
        !bigger
            .machine
            .unwrap()
            .condition(conditions::UP_TO_DATE)
            .unwrap()
            .status
    );
}

/// A layer whose own `is_applied` only sees that its file exists (as many hand-written
/// layers do): without digests a changed content would never be applied again.
struct AppConfig {
    content: String,
    applies: AtomicUsize,
    asked: AtomicUsize,
    /// Whether it gives a digest.
    digested: bool,
}

impl AppConfig {
    fn new(content: &str) -> Arc<Self> {
        Arc::new(AppConfig {
            content: content.to_owned(),
            applies: AtomicUsize::new(0),
            asked: AtomicUsize::new(0),
            digested: true,
        })
    }

    /// The layer without a digest: only its own `is_applied` says.
    fn undigested(content: &str) -> Arc<Self> {
        Arc::new(AppConfig {
            digested: false,
            ..Arc::into_inner(Self::new(content)).unwrap()
        })
    }
}

impl Software for AppConfig {
    fn name(&self) -> &str {
        "app-config"
    }
}

#[async_trait]
impl DecoupledSoftware for AppConfig {
    async fn is_applied(&self, _m: &Machine, t: &dyn Transport) -> Result<bool> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Ok(t.read_file("/etc/app.conf", 1024).await?.is_some())
    }

    async fn apply(&self, _m: &Machine, t: &dyn Transport) -> Result<()> {
        self.applies.fetch_add(1, Ordering::SeqCst);
        t.upload(&FileUpload::new("/etc/app.conf", self.content.clone()))
            .await
    }

    fn digest(&self, _m: &Machine) -> Option<String> {
        self.digested
            .then(|| machine_core::revision::digest(self.content.as_bytes()))
    }
}

#[tokio::test]
async fn a_changed_decoupled_layer_is_applied_again_in_place_and_an_unchanged_one_costs_one_read() {
    let cloud = SimCloud::new();
    let provider = sim(&cloud);
    let composer = |layer: Arc<AppConfig>| {
        Composer::builder(provider.clone())
            .decoupled(layer)
            .connector(Arc::new(SimConnector::new(cloud.clone())))
            .build()
            .unwrap()
    };
    let v1 = AppConfig::new("v1\n");
    let done = composer(v1.clone())
        .provision(&spec("app-1"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    let id = done.machine.provider_id.clone();
    let host = || cloud.host(&id).unwrap();
    assert_eq!(v1.applies.load(Ordering::SeqCst), 1);
    assert_eq!(
        host()
            .file_text(&layer_digest_path("app-config"))
            .unwrap()
            .trim(),
        machine_core::revision::digest(b"v1\n")
    );
    // And the set of layers it finished.
    let set = |c: &Composer, m: &Machine| c.bootstrapper().layer_set_digest(m);
    assert_eq!(
        host().file_text(LAYER_SET_PATH).unwrap().trim(),
        set(&composer(v1.clone()), &done.machine)
    );

    // Unchanged: the recorded digest answers; the layer is not asked.
    let v1_again = AppConfig::new("v1\n");
    let r = composer(v1_again.clone())
        .reconcile(&spec("app-1"), None)
        .await
        .unwrap();
    assert_eq!(r.machine.unwrap().phase, Phase::Ready);
    assert_eq!(
        v1_again.asked.load(Ordering::SeqCst),
        0,
        "is_applied was called"
    );
    assert_eq!(v1_again.applies.load(Ordering::SeqCst), 0);

    // Changed: applied again in place, on the same machine, and recorded.
    let v2 = AppConfig::new("v2\n");
    let r = composer(v2.clone())
        .reconcile(&spec("app-1"), None)
        .await
        .unwrap();
    let m = r.machine.unwrap();
    assert_eq!(m.provider_id, id, "updated in place");
    assert_eq!(m.phase, Phase::Ready);
    assert_eq!(v2.applies.load(Ordering::SeqCst), 1);
    assert_eq!(host().file_text("/etc/app.conf").unwrap(), "v2\n");
    let c = m
        .condition(&conditions::layer_applied("app-config"))
        .unwrap();
    assert!(c.message.contains("the layer changed"), "{}", c.message);

    // A machine without a record (made before digests) asks the layer once, then records.
    let p = layer_digest_path("app-config");
    cloud.remove_file(&id, &p).unwrap();
    let v2_again = AppConfig::new("v2\n");
    let r = composer(v2_again.clone())
        .reconcile(&spec("app-1"), None)
        .await
        .unwrap();
    assert_eq!(r.machine.unwrap().phase, Phase::Ready);
    assert_eq!(v2_again.asked.load(Ordering::SeqCst), 1);
    assert_eq!(v2_again.applies.load(Ordering::SeqCst), 0);
    assert!(host().file_text(&p).is_some(), "the record was written");
    assert_eq!(
        host().file_text(LAYER_SET_PATH).unwrap().trim(),
        set(&composer(v2_again.clone()), &m),
        "the set record follows the update"
    );
}

#[tokio::test]
async fn layers_without_digests_record_nothing_on_the_machine() {
    let cloud = SimCloud::new();
    let done = Composer::builder(sim(&cloud))
        .decoupled(AppConfig::undigested("v1\n"))
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .build()
        .unwrap()
        .provision(&spec("plain-1"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    let host = cloud.host(&done.machine.provider_id).unwrap();
    assert!(host.file_text(&layer_digest_path("app-config")).is_none());
    assert!(
        host.file_text(LAYER_SET_PATH).is_none(),
        "a set record where no layer has a digest"
    );
}
