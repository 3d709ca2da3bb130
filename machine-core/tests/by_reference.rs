//! User data by reference on the simulator: the store gets the document before the
//! create, the provider only a stub, the revision stays the real data's, and the document
//! is withdrawn at the end of the bootstrap and on delete; a create abandoned after its
//! put is finished or swept by a new composer.

use machine_core::decorators::{FaultConfig, FaultInjecting};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use machine_core::bootstrap_data::{
    BootstrapDataStore, ByReference, HttpsLocation, Location, StoredDocument,
};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, Composer, ComposerSettings, Deadlines, ErrorKind, Labels, MachineName,
    MachineProvisioner, MachineSpec, Phase, Result, SecretString, SentinelFile, revision,
};

const CANARY: &str = "canary-secret-5f1c";

/// A store in memory, shared by every composer of a test as a durable store would be.
#[derive(Default)]
struct MemStore {
    docs: Mutex<BTreeMap<MachineName, (Vec<u8>, SystemTime)>>,
    log: Mutex<Vec<String>>,
}

impl std::fmt::Display for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the test's store")
    }
}

#[async_trait]
impl BootstrapDataStore for MemStore {
    fn max_bytes(&self) -> usize {
        1024 * 1024
    }
    async fn put(&self, name: &MachineName, document: &[u8]) -> Result<Location> {
        self.log.lock().unwrap().push(format!("put {name}"));
        self.docs
            .lock()
            .unwrap()
            .insert(name.clone(), (document.to_vec(), SystemTime::now()));
        Ok(Location::Https(HttpsLocation::new(
            SecretString::from(format!("https://store.invalid/v1/{name}-one-time-token")),
            vec![0x30, 0x03, 1, 2, 3],
        )))
    }
    async fn withdraw(&self, name: &MachineName) -> Result<()> {
        self.log.lock().unwrap().push(format!("withdraw {name}"));
        self.docs.lock().unwrap().remove(name);
        Ok(())
    }
    async fn list(&self) -> Result<Vec<StoredDocument>> {
        Ok(self
            .docs
            .lock()
            .unwrap()
            .iter()
            .map(|(n, (_, at))| StoredDocument::new(n.clone(), *at))
            .collect())
    }
    async fn expect_clients(&self, name: &MachineName, addresses: &[IpAddr]) -> Result<()> {
        self.log
            .lock()
            .unwrap()
            .push(format!("expect {name} {}", addresses.len()));
        Ok(())
    }
}

impl MemStore {
    fn holds(&self, name: &str) -> Option<Vec<u8>> {
        let name = MachineName::new(name).unwrap();
        self.docs.lock().unwrap().get(&name).map(|(d, _)| d.clone())
    }
    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

/// A provider whose create never returns: a controller killed mid-create.
fn hanging_creates(provider: Arc<SimProvider>) -> FaultInjecting<Arc<SimProvider>> {
    FaultInjecting::new(provider, FaultConfig::default().with_hang_creates(true)).unwrap()
}

/// Whether a MIME document says `needle`, in any part, whatever its transfer encoding.
fn mentions(doc: &[u8], needle: &str) -> bool {
    use base64::Engine;
    let text = String::from_utf8_lossy(doc);
    if text.replace("=\n", "").contains(needle) {
        return true;
    }
    text.split("\n\n").any(|block| {
        let joined: String = block.lines().take_while(|l| !l.starts_with("--")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(joined.trim())
            .is_ok_and(|b| String::from_utf8_lossy(&b).contains(needle))
    })
}

fn spec(name: &str) -> MachineSpec {
    MachineSpec::new(MachineName::new(name).unwrap())
}

fn secret_layer() -> Arc<StepLayer> {
    Arc::new(
        StepLayer::new(
            "join",
            vec![
                Step::run(format!("echo {CANARY} > /etc/join-token")),
                Step::run("systemctl start agent"),
            ],
        )
        .unwrap(),
    )
}

fn settings() -> ComposerSettings {
    ComposerSettings::default()
        .with_deadlines(
            Deadlines::default()
                .with_create(Duration::from_secs(5))
                .with_boot(Duration::from_secs(5))
                .with_bootstrap(Duration::from_secs(5))
                .with_delete(Duration::from_secs(5)),
        )
        .with_poll_interval(Duration::from_millis(10))
}

fn composer(
    provider: Arc<dyn MachineProvisioner>,
    cloud: &SimCloud,
    store: Option<Arc<MemStore>>,
) -> Composer {
    let mut b = Composer::builder(provider)
        .coupled(secret_layer())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .completion(Arc::new(SentinelFile::default()))
        .settings(settings());
    if let Some(store) = store {
        b = b.by_reference(ByReference::new(store));
    }
    b.build().unwrap()
}

fn sim(cloud: &SimCloud) -> Arc<SimProvider> {
    Arc::new(SimProvider::new(cloud.clone(), SimConfig::default()).unwrap())
}

#[tokio::test]
async fn the_provider_gets_a_stub_and_the_store_the_data_until_the_bootstrap_finished() {
    let cloud = SimCloud::new();
    let provider = sim(&cloud);
    let store = Arc::new(MemStore::default());
    let by_ref = composer(provider.clone(), &cloud, Some(store.clone()));
    let inline = composer(provider.clone(), &cloud, None);
    let s = spec("web-1");

    let done = by_ref
        .provision(&s, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    // What the provider holds (what describing the instance shows): a stub, no secret.
    let shown = provider
        .user_data(&done.machine.provider_id)
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(shown.decoded().unwrap()).unwrap();
    assert!(text.contains("text/part-handler"), "{text}");
    assert!(
        !mentions(text.as_bytes(), CANARY),
        "the canary is in the instance's user data"
    );
    // The stub carries the completion check's waiter, so the sentinel came.
    assert!(text.contains("completion-waiter"), "{text}");
    // The coupled revision is the real data's, the same as inline.
    let inline_data = inline.user_data(&s).unwrap();
    assert_eq!(
        done.machine.revision().unwrap(),
        revision::coupled_revision(&s, inline_data.as_ref())
    );
    assert_eq!(by_ref.user_data(&s).unwrap(), inline_data);
    // Put before create, withdrawn before Ready: the store is empty now.
    let log = store.log();
    assert_eq!(
        log.first().map(String::as_str),
        Some("put web-1"),
        "{log:?}"
    );
    assert!(log.contains(&"withdraw web-1".to_owned()), "{log:?}");
    assert!(store.holds("web-1").is_none());
    assert_eq!(cloud.bootstrap_finished_calls(&done.machine.provider_id), 1);
}

#[tokio::test]
async fn the_document_holds_the_layers_and_the_stub_their_digest() {
    let cloud = SimCloud::new();
    let store = Arc::new(MemStore::default());
    // One reconcile: the machine is created and still boots.
    let provider = Arc::new(
        SimProvider::new(
            cloud.clone(),
            SimConfig::default().with_boot_latency(Duration::from_secs(3600)),
        )
        .unwrap(),
    );
    let composer = Composer::builder(provider.clone())
        .coupled(secret_layer())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .completion(Arc::new(SentinelFile::default()))
        .by_reference(ByReference::new(store.clone()))
        .build()
        .unwrap();
    let r = composer.reconcile(&spec("db-1"), None).await.unwrap();
    let m = r.machine.unwrap();
    let doc = store.holds("db-1").expect("stored before the create");
    assert!(mentions(&doc, CANARY), "the document has the layer");
    assert!(
        !mentions(&doc, "completion-waiter"),
        "the waiter travels in the stub"
    );
    let stub = provider.user_data(&m.provider_id).await.unwrap().unwrap();
    let stub = String::from_utf8(stub.decoded().unwrap()).unwrap();
    // The pointer: the string literal lines after `POINTER = ...(`.
    let b64: String = stub
        .lines()
        .skip_while(|l| !l.starts_with("POINTER = "))
        .skip(1)
        .take_while(|l| l.trim_start().starts_with('"'))
        .map(|l| l.trim().trim_matches('"'))
        .collect();
    use base64::Engine;
    let pointer: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(&b64)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        pointer["sha256"],
        machine_core::bootstrap_data::document_sha256(&doc)
    );
    assert!(!format!("{composer:?}").contains("one-time-token"));
}

#[tokio::test]
async fn delete_withdraws_the_document() {
    let cloud = SimCloud::new();
    let store = Arc::new(MemStore::default());
    let booting = SimProvider::new(
        cloud.clone(),
        SimConfig::default().with_boot_latency(Duration::from_secs(3600)),
    )
    .unwrap();
    let composer = composer(Arc::new(booting), &cloud, Some(store.clone()));
    let r = composer.reconcile(&spec("gone-1"), None).await.unwrap();
    assert!(r.machine.is_some());
    assert!(store.holds("gone-1").is_some());
    composer
        .deprovision(
            &MachineName::new("gone-1").unwrap(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(store.holds("gone-1").is_none());
}

#[tokio::test]
async fn a_create_abandoned_after_its_put_is_swept_or_finished_by_a_new_composer() {
    let cloud = SimCloud::new();
    let store = Arc::new(MemStore::default());
    let hanging: Arc<dyn MachineProvisioner> = Arc::new(hanging_creates(sim(&cloud)));
    let dying = composer(hanging, &cloud, Some(store.clone()));
    let s = spec("orphan-1");
    let abandoned = tokio::time::timeout(
        Duration::from_millis(200),
        dying.provision(&s, &CancellationToken::new()),
    )
    .await;
    assert!(abandoned.is_err(), "the create was abandoned");
    drop(dying);
    assert!(store.holds("orphan-1").is_some(), "the put happened");

    // A new process: a sweep within the grace period keeps it (a create may be in
    // flight), after it withdraws it since no machine of that name exists.
    let fresh = composer(sim(&cloud), &cloud, Some(store.clone()));
    assert!(
        fresh
            .sweep_bootstrap_data(Duration::from_secs(3600))
            .await
            .unwrap()
            .is_empty()
    );
    let swept = fresh.sweep_bootstrap_data(Duration::ZERO).await.unwrap();
    assert_eq!(swept, vec![MachineName::new("orphan-1").unwrap()]);
    assert!(store.holds("orphan-1").is_none());

    // Abandoned again; this time the new process finishes the create instead.
    let dying = composer(
        Arc::new(hanging_creates(sim(&cloud))),
        &cloud,
        Some(store.clone()),
    );
    let _ = tokio::time::timeout(
        Duration::from_millis(200),
        dying.provision(&s, &CancellationToken::new()),
    )
    .await;
    let provider = sim(&cloud);
    let fresh = composer(provider.clone(), &cloud, Some(store.clone()));
    let done = fresh
        .provision(&s, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    assert_eq!(
        provider.list(&Labels::new()).await.unwrap().len(),
        1,
        "one machine"
    );
    assert!(store.list().await.unwrap().is_empty(), "no document left");
    // A machine that exists is never swept.
    let again = composer(sim(&cloud), &cloud, Some(store.clone()));
    store.put(&s.name, b"x").await.unwrap();
    assert!(
        again
            .sweep_bootstrap_data(Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn by_reference_needs_a_completion_check_and_lifts_the_provider_limit() {
    let cloud = SimCloud::new();
    let store = Arc::new(MemStore::default());
    let e = Composer::builder(sim(&cloud))
        .coupled(secret_layer())
        .by_reference(ByReference::new(store.clone()))
        .build()
        .unwrap_err();
    assert_eq!(e.field(), Some("completion"));
    assert_eq!(e.kind(), ErrorKind::InvalidSpec);

    // 40 KiB of incompressible data: over the sim's 16 KiB inline, fine by reference.
    let noise: String = (0..40_000).map(|_| fastrand::alphanumeric()).collect();
    let big = Arc::new(StepLayer::new("big", vec![Step::write_file("/etc/big", noise)]).unwrap());
    let build = |store: Option<Arc<MemStore>>| {
        let mut b = Composer::builder(sim(&cloud))
            .coupled(big.clone())
            .connector(Arc::new(SimConnector::new(cloud.clone())))
            .completion(Arc::new(SentinelFile::default()))
            .settings(settings());
        if let Some(s) = store {
            b = b.by_reference(ByReference::new(s));
        }
        b.build().unwrap()
    };
    let e = build(None).user_data(&spec("big-1")).unwrap_err();
    assert_eq!(e.field(), Some("userData"));
    let done = build(Some(store.clone()))
        .provision(&spec("big-1"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
}
