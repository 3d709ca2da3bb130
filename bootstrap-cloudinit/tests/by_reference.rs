//! User data by reference on the real cloud-init (Debian's 22.4, all four boot stages
//! in a Debian root, [`peers::root`]), through the served-once HTTPS store
//! (bootstrap-store) bound in a network namespace the root shares:
//! - the same layers inline and by reference leave the same machine on disk, byte for
//!   byte (users, groups, files with their modes and owners, `bootcmd`, `runcmd` and
//!   scripts of several layers), also after a second boot, and the composer, driving the
//!   real machine through its completion check, withdraws the document before Ready;
//! - the instance's user data (the stub) holds no canary secret;
//! - a failing step of a layer is named in the verdict as it is inline;
//! - a stub whose digest differs, a second fetch (410), and a store that is gone apply
//!   nothing and fail the boot, the verdict naming the reason.

mod peers;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, User, WriteFile};
use bootstrap_store::{DocumentState, HttpsStore, HttpsStoreConfig, Network};
use machine_core::bootstrap_data::{self, BootstrapDataStore, ByReference};
use machine_core::sim::{SimCloud, SimConfig, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    Completion, CompletionCheck, Composer, ComposerSettings, Connector, CoupledSoftware, Error,
    Machine, MachineName, MachineProvisioner, MachineSpec, Phase, Result, SentinelFile, Transport,
    UserData,
};
use peers::root::{NetNs, Root};

const CANARY: &str = "canary-join-token-7d41e0";

/// Three layers of two kinds: users, files with modes and owners, `bootcmd`, `runcmd`
/// and scripts in each.
fn layers(failing: bool) -> Vec<Arc<dyn CoupledSoftware>> {
    let accounts = CloudConfigLayer::new(
        "accounts",
        CloudConfig::new()
            .with_user(User::new("deploy"))
            .with_user(User::new("auditor"))
            .with_file(
                WriteFile::new("/etc/composed/join-token", format!("{CANARY}\n"))
                    .permissions("0600"),
            )
            .with_bootcmd("echo accounts >> /var/tmp/bootcmd")
            .with_runcmd("echo accounts >> /var/tmp/runcmd"),
    )
    .unwrap()
    .with_script("order.sh", "#!/bin/sh\necho accounts >> /var/tmp/order\n")
    .unwrap();
    let app = CloudConfigLayer::with_system_users(
        "app",
        CloudConfig::new()
            .with_file(
                WriteFile::new("/srv/app/app.conf", "listen: 8080\n")
                    .permissions("0640")
                    .owner("deploy:deploy")
                    .deferred(),
            )
            .with_file(WriteFile::new("/etc/composed/app.env", "MODE=prod\n").permissions("0644"))
            .with_runcmd("echo app >> /var/tmp/runcmd"),
        vec!["deploy".into()],
    )
    .unwrap()
    .with_script("order.sh", "#!/bin/sh\necho app >> /var/tmp/order\n")
    .unwrap();
    let mut steps = vec![
        Step::write_file_mode("/etc/composed/steps.sh", "#!/bin/sh\necho steps\n", 0o750),
        Step::run("echo steps >> /var/tmp/order"),
    ];
    if failing {
        steps.push(Step::run("echo 'steps fails on purpose' >&2; exit 7"));
    }
    let steps = StepLayer::new("steps", steps).unwrap();
    vec![Arc::new(accounts), Arc::new(app), Arc::new(steps)]
}

/// The connector of a machine that is this root, once it has booted.
#[derive(Default)]
struct RootConnector(Mutex<Option<Arc<Root>>>);

#[async_trait]
impl Connector for RootConnector {
    async fn connect(&self, _machine: &Machine) -> Result<Arc<dyn Transport>> {
        match self.0.lock().unwrap().clone() {
            Some(root) => Ok(root),
            None => Err(Error::transient("the machine has not booted yet")),
        }
    }
}

/// The store, bound in a namespace of the test's own on 127.0.0.1; the roots given
/// that namespace reach it there and nothing else.
fn store(handle: &tokio::runtime::Handle) -> (NetNs, Arc<HttpsStore>) {
    let handle = handle.clone();
    let (net, store) = NetNs::with(move || {
        handle.block_on(HttpsStore::start(
            HttpsStoreConfig::new("127.0.0.1:0".parse().unwrap())
                .allow(Network::parse("127.0.0.1").unwrap()),
        ))
    });
    (net, Arc::new(store.unwrap()))
}

fn composer(
    layers: &[Arc<dyn CoupledSoftware>],
    provider: Arc<dyn MachineProvisioner>,
    connector: Arc<RootConnector>,
    store: Option<Arc<HttpsStore>>,
) -> Composer {
    let mut b = Composer::builder(provider)
        .connector(connector)
        .completion(Arc::new(SentinelFile::default()))
        .settings(ComposerSettings::default().with_poll_interval(Duration::from_millis(50)));
    for l in layers {
        b = b.coupled(l.clone());
    }
    if let Some(store) = store {
        b = b.by_reference(ByReference::new(store).with_fetch_window(Duration::from_secs(3)));
    }
    b.build().unwrap()
}

fn sim(cloud: &SimCloud) -> Arc<SimProvider> {
    let config = SimConfig::default().with_user_data_limit(64 * 1024);
    Arc::new(SimProvider::new(cloud.clone(), config).unwrap())
}

fn unique() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "iid-ref-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

fn boot(user_data: &[u8], net: Option<&NetNs>) -> Arc<Root> {
    let mut root = Root::new(user_data, &unique());
    if let Some(net) = net {
        root = root.in_netns(net);
    }
    tokio::task::block_in_place(|| root.boot());
    Arc::new(root)
}

/// Every file the boot left on the machine that is the software's doing: path to
/// (content, mode, uid, gid). Left out: cloud-init's own state and logs, random host
/// keys, and what differs by design (the instance's own user data).
fn disk(root: &Root) -> BTreeMap<String, (Vec<u8>, u32, u32, u32)> {
    const SKIP: &[&str] = &[
        "var/lib/cloud",
        "run",
        "var/log",
        "etc/ssh",
        "tmp",
        "var/cache",
        "etc/machine-id",
        "etc/hostname",
        "etc/hosts",
        "var/lib/machine-core",
    ];
    let base = root.upper("/");
    let mut out = BTreeMap::new();
    let mut stack = vec![base.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(&base)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if SKIP
                .iter()
                .any(|s| rel == *s || rel.starts_with(&format!("{s}/")))
            {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path.clone());
            }
            let content = if meta.is_file() {
                std::fs::read(&path).unwrap()
            } else {
                Vec::new()
            };
            out.insert(rel, (content, meta.mode() & 0o7777, meta.uid(), meta.gid()));
        }
    }
    out
}

fn verdict_of(root: &Root) -> String {
    std::fs::read_to_string(root.upper("/run/cloud-init/result.json")).unwrap_or_default()
}

async fn check(root: &Arc<Root>) -> Completion {
    let m = Machine::new(
        MachineName::new("web-1").unwrap(),
        machine_core::ProviderId::new("sim:///x").unwrap(),
        Phase::Provisioned,
    );
    SentinelFile::default()
        .check(&m, root.as_ref())
        .await
        .unwrap()
}

fn spec() -> MachineSpec {
    MachineSpec::new(MachineName::new("web-1").unwrap())
}

/// The composer drives a machine by reference to Ready: it creates it with a stub (no
/// canary), the root boots that stub, the completion check reads the real machine, and
/// the document is withdrawn before Ready. Returns the booted root and the stub.
async fn provision_by_reference(
    layers: &[Arc<dyn CoupledSoftware>],
    net: &NetNs,
    store: &Arc<HttpsStore>,
) -> (Arc<Root>, UserData, Machine) {
    let cloud = SimCloud::new();
    let provider = sim(&cloud);
    let connector = Arc::new(RootConnector::default());
    let composer = composer(
        layers,
        provider.clone(),
        connector.clone(),
        Some(store.clone()),
    );
    let mut m = None;
    for _ in 0..100 {
        let r = composer.reconcile(&spec(), m.as_ref()).await.unwrap();
        m = r.machine;
        if m.as_ref().is_some_and(|m| m.phase == Phase::Bootstrapping) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = m.unwrap();
    assert_eq!(
        m.phase,
        Phase::Bootstrapping,
        "waits for the machine to boot"
    );
    assert_eq!(store.state_of(&m.name), Some(DocumentState::Waiting));
    let stub = provider.user_data(&m.provider_id).await.unwrap().unwrap();
    // The machine fetches from 127.0.0.1 in the namespace; the sim reported others.
    store
        .expect_clients(&m.name, &["127.0.0.1".parse().unwrap()])
        .await
        .unwrap();
    let root = boot(&stub.decoded().unwrap(), Some(net));
    *connector.0.lock().unwrap() = Some(root.clone());
    let after = composer.reconcile(&spec(), Some(&m)).await.unwrap();
    (root, stub, after.machine.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_reference_leaves_the_machine_inline_would_and_the_store_empty() {
    let (net, store) = store(&tokio::runtime::Handle::current());
    let layers = layers(false);
    let (by_ref, stub, m) = provision_by_reference(&layers, &net, &store).await;
    assert_eq!(m.phase, Phase::Ready, "{m:?} {}", verdict_of(&by_ref));
    let stub_text = String::from_utf8(stub.decoded().unwrap()).unwrap();
    assert!(
        !stub_text.contains(CANARY),
        "the instance's user data holds the canary"
    );
    // After the bootstrap finished: nothing in memory, nothing listed, state served.
    let name = MachineName::new("web-1").unwrap();
    assert_eq!(store.documents_in_memory(), 0);
    assert!(store.list().await.unwrap().is_empty());
    assert_eq!(store.state_of(&name), Some(DocumentState::Served));
    assert_eq!(store.stats().served, 1);

    // The same layers inline.
    let cloud = SimCloud::new();
    let inline = composer(&layers, sim(&cloud), Arc::default(), None)
        .user_data(&spec())
        .unwrap()
        .unwrap();
    let inline_root = boot(&inline.decoded().unwrap(), None);
    assert_eq!(check(&inline_root).await, Completion::Done);
    let (a, b) = (disk(&inline_root), disk(&by_ref));
    assert!(a.contains_key("etc/composed/join-token") && a.contains_key("srv/app/app.conf"));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (path, inline_file) in &a {
        assert_eq!(
            inline_file, &b[path],
            "{path} differs between inline and by reference"
        );
    }
    for log in ["/var/tmp/order", "/var/tmp/runcmd", "/var/tmp/bootcmd"] {
        assert!(!by_ref.read(log).is_empty(), "{log}");
    }
    assert_eq!(by_ref.read("/var/tmp/runcmd"), "accounts\napp\n");
    assert_eq!(by_ref.read("/var/tmp/order"), "accounts\napp\nsteps\n");
    // The document is kept root-only on the machine, as inline user data is.
    let iid = by_ref.read("/var/lib/cloud/data/instance-id");
    let kept = format!(
        "/var/lib/cloud/instances/{}/{}",
        iid.trim(),
        bootstrap_data::KEPT_DOCUMENT
    );
    assert_eq!(by_ref.mode(&kept), 0o600);

    // A second boot of each (the store no longer serves it): still the same, and the
    // per-boot modules ran again in both.
    tokio::task::block_in_place(|| {
        inline_root.boot();
        by_ref.boot();
    });
    assert_eq!(by_ref.read("/var/tmp/bootcmd"), "accounts\naccounts\n");
    assert_eq!(disk(&inline_root), disk(&by_ref));
    assert_eq!(
        check(&by_ref).await,
        Completion::Done,
        "{}",
        verdict_of(&by_ref)
    );

    // The same stub on another machine: the token is used up, nothing is applied.
    let replay = boot(&stub.decoded().unwrap(), Some(&net));
    let Completion::Failed(why) = check(&replay).await else {
        panic!("a replayed stub booted: {}", verdict_of(&replay))
    };
    assert!(
        why.contains("machine-core-by-reference-failed-refused-410"),
        "{why}"
    );
    assert!(
        !replay.upper("/etc/composed").exists(),
        "nothing of the document"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_step_is_named_as_inline_and_the_machine_fails() {
    let (net, store) = store(&tokio::runtime::Handle::current());
    let layers = layers(true);
    let (root, _, m) = provision_by_reference(&layers, &net, &store).await;
    assert_eq!(m.phase, Phase::Failed);
    let msg = m.failure.as_ref().unwrap().message.clone();
    assert!(
        msg.contains("steps.sh"),
        "the failing layer's script is named: {msg}"
    );
    // What came before the failing step is there, as inline.
    assert_eq!(root.read("/etc/composed/app.env"), "MODE=prod\n");
    assert!(store.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_digest_or_a_store_gone_applies_nothing_and_names_the_reason() {
    let (net, store) = store(&tokio::runtime::Handle::current());
    let cloud = SimCloud::new();
    let layers = layers(false);
    let composer = composer(&layers, sim(&cloud), Arc::default(), None);
    let document = composer.user_data(&spec()).unwrap().unwrap();
    let name = MachineName::new("web-1").unwrap();
    let location = store.put(&name, &document.bytes).await.unwrap();
    store
        .expect_clients(&name, &["127.0.0.1".parse().unwrap()])
        .await
        .unwrap();
    let waiter = SentinelFile::default().user_data_parts(&spec());
    // A stub whose digest is not the document's (one byte flipped, same length): the
    // document is fetched and refused.
    let mut other = document.bytes.clone();
    other[0] ^= 1;
    let tampered =
        bootstrap_data::cloud_init_stub(&location, &other, &waiter, Duration::from_secs(3))
            .unwrap();
    let root = boot(&tampered.bytes, Some(&net));
    let Completion::Failed(why) = check(&root).await else {
        panic!("a stub with a wrong digest booted: {}", verdict_of(&root))
    };
    assert!(
        why.contains("machine-core-by-reference-failed-digest-mismatch"),
        "{why}"
    );
    assert!(
        !root.upper("/etc/composed").exists(),
        "nothing of the document"
    );
    assert!(root.account("/etc/passwd", "deploy").is_none());
    assert_eq!(
        store.stats().served,
        1,
        "it was fetched, and refused by the stub"
    );

    // The store gone: the stub tries for its window, then fails the boot.
    let location = store
        .put(&MachineName::new("web-2").unwrap(), &document.bytes)
        .await
        .unwrap();
    let stub = bootstrap_data::cloud_init_stub(
        &location,
        &document.bytes,
        &waiter,
        Duration::from_secs(3),
    )
    .unwrap();
    drop(store);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let root = boot(&stub.bytes, Some(&net));
    let Completion::Failed(why) = check(&root).await else {
        panic!("a stub booted with its store gone: {}", verdict_of(&root))
    };
    assert!(
        why.contains("machine-core-by-reference-failed-fetch-failed"),
        "{why}"
    );
    assert!(!root.upper("/etc/composed").exists());
    let log =
        std::fs::read_to_string(root.upper("/var/log/cloud-init-output.log")).unwrap_or_default();
    assert!(
        log.contains("cannot fetch 127.0.0.1"),
        "the reason is in the boot log"
    );
    assert!(
        !log.contains("/v1/"),
        "the URL (its token) is not logged: {log}"
    );
    let debug_log =
        std::fs::read_to_string(root.upper("/var/log/cloud-init.log")).unwrap_or_default();
    assert!(!debug_log.contains("/v1/"), "nor in cloud-init's own log");
}
