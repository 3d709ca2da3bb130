//! User data by reference through AWS Secrets Manager, on moto (its EC2, Secrets
//! Manager and instance metadata service in one server) and the real cloud-init in a
//! Debian root (bootstrap-cloudinit's test peer): the instance's user data holds only a
//! stub, the document (split across secrets) is read by the "instance" with its role's
//! credentials from the metadata service, the secrets exist while it boots and are gone
//! after the bootstrap finished; a controller killed between `CreateSecret` and
//! `RunInstances` leaves secrets that a new process sweeps.

mod common;
#[path = "../../bootstrap-cloudinit/tests/peers/mod.rs"]
mod peers;

use machine_core::decorators::{FaultConfig, FaultInjecting};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, WriteFile};
use common::Moto;
use machine_core::bootstrap_data::{BootstrapDataStore, ByReference};
use machine_core::{
    CancellationToken, Composer, ComposerSettings, Connector, Error, Machine, MachineName,
    MachineProvisioner, MachineSpec, Phase, Result, SentinelFile, Transport,
};
use peers::root::{NetNs, Root};
use provider_aws::{AwsConfig, AwsProvider, SecretsManagerSettings, SecretsManagerStore};

const CANARY: &str = "canary-kubeadm-token-2b9f";

/// Forwards connections made inside a namespace of the test's own, on 127.0.0.1, to
/// moto on the host's loopback: the root (which shares the namespace) reaches moto's
/// Secrets Manager and metadata service there, and nothing else.
fn forwarder(moto: &Moto) -> (NetNs, SocketAddr) {
    let (net, listener) = NetNs::with(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let target = moto.addr;
    tokio::spawn(async move {
        while let Ok((mut inside, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outside) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
                }
            });
        }
    });
    (net, addr)
}

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

/// A provider whose create never returns: a controller killed after its put.
fn hanging_creates(provider: Arc<AwsProvider>) -> FaultInjecting<Arc<AwsProvider>> {
    FaultInjecting::new(provider, FaultConfig::default().with_hang_creates(true)).unwrap()
}

/// 150 KB that do not compress: over EC2's 16 KiB, and three secrets' worth.
fn big() -> String {
    let mut rng = fastrand::Rng::with_seed(27);
    (0..150_000).map(|_| rng.alphanumeric()).collect()
}

fn layer() -> Arc<CloudConfigLayer> {
    Arc::new(
        CloudConfigLayer::new(
            "node",
            CloudConfig::new()
                .with_file(
                    WriteFile::new("/etc/node/join-token", format!("{CANARY}\n"))
                        .permissions("0600"),
                )
                .with_file(WriteFile::new("/etc/node/bundle", big()))
                .with_runcmd("echo joined > /var/tmp/joined"),
        )
        .unwrap(),
    )
}

async fn store(config: &AwsConfig, moto: &Moto, inside: SocketAddr) -> Arc<SecretsManagerStore> {
    let settings = SecretsManagerSettings::default()
        .with_endpoint_url(&moto.endpoint)
        .with_instance_endpoint_url(format!("http://{inside}"))
        .with_metadata_endpoint(format!("http://{inside}"));
    Arc::new(SecretsManagerStore::new(config, settings).await.unwrap())
}

fn composer(
    provider: Arc<dyn MachineProvisioner>,
    connector: Arc<RootConnector>,
    store: Arc<SecretsManagerStore>,
) -> Composer {
    Composer::builder(provider)
        .coupled(layer())
        .connector(connector)
        .completion(Arc::new(SentinelFile::default()))
        .settings(ComposerSettings::default().with_poll_interval(Duration::from_millis(50)))
        .by_reference(ByReference::new(store).with_fetch_window(Duration::from_secs(10)))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_exist_while_the_machine_boots_and_are_gone_after_its_bootstrap() {
    let moto = Moto::start();
    let (net, inside) = forwarder(&moto);
    let owner = common::owner("secrets");
    let config = common::config(&moto.endpoint, &owner).build().unwrap();
    let provider = Arc::new(AwsProvider::new(config.clone()).await.unwrap());
    let store = store(&config, &moto, inside).await;
    let connector = Arc::new(RootConnector::default());
    let composer = composer(provider.clone(), connector.clone(), store.clone());
    let spec = MachineSpec::new(MachineName::new("node-1").unwrap());

    let mut m = None;
    for _ in 0..50 {
        m = composer.reconcile(&spec, m.as_ref()).await.unwrap().machine;
        if m.as_ref().is_some_and(|m| m.phase == Phase::Bootstrapping) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = m.unwrap();
    assert_eq!(m.phase, Phase::Bootstrapping);
    // While it boots: three secrets (150 KB in parts of 64 KiB), tagged with the owner.
    let secrets = store.secret_names(&spec.name).await.unwrap();
    assert_eq!(secrets.len(), 3, "{secrets:?}");
    assert!(
        secrets
            .iter()
            .all(|s| s.starts_with(&format!("machine-core/bootstrap/{owner}/node-1/")))
    );
    assert_eq!(store.list().await.unwrap().len(), 1);
    // What DescribeInstanceAttribute shows: the stub, under EC2's limit, no canary.
    let stub = provider.user_data(&m.provider_id).await.unwrap().unwrap();
    assert!(stub.bytes.len() <= provider_aws::USER_DATA_LIMIT);
    let stub_text = String::from_utf8(stub.decoded().unwrap()).unwrap();
    assert!(!stub_text.contains(CANARY));
    assert!(stub_text.contains("text/part-handler"));

    let root = Arc::new(Root::new(&stub.decoded().unwrap(), &format!("i-{owner}")).in_netns(&net));
    tokio::task::block_in_place(|| root.boot());
    *connector.0.lock().unwrap() = Some(root.clone());
    let done = composer
        .reconcile(&spec, Some(&m))
        .await
        .unwrap()
        .machine
        .unwrap();
    let verdict =
        std::fs::read_to_string(root.upper("/run/cloud-init/result.json")).unwrap_or_default();
    assert_eq!(done.phase, Phase::Ready, "{done:?}\n{verdict}");
    // The instance joined the parts and got every byte.
    assert_eq!(root.read("/etc/node/bundle"), big());
    assert_eq!(root.read("/etc/node/join-token"), format!("{CANARY}\n"));
    assert_eq!(root.mode("/etc/node/join-token"), 0o600);
    assert_eq!(root.read("/var/tmp/joined"), "joined\n");
    // After the bootstrap finished: no secret left (Secrets Manager's own listing).
    assert!(store.secret_names(&spec.name).await.unwrap().is_empty());
    assert!(store.list().await.unwrap().is_empty());
    // Calls for this machine: one listing and three creates to put, one listing and
    // three deletes to withdraw (and the four listings of the checks above).
    let calls = store.calls();
    assert_eq!((calls.create, calls.delete), (3, 3), "{calls:?}");
    assert_eq!(calls.list, 2 + 4, "{calls:?}");
    assert!(!format!("{store:?} {calls:?}").contains(CANARY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_left_by_a_controller_killed_before_run_instances_are_swept() {
    let moto = Moto::start();
    let owner = common::owner("orphans");
    let config = common::config(&moto.endpoint, &owner).build().unwrap();
    let inside: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let spec = MachineSpec::new(MachineName::new("node-2").unwrap());
    {
        // The controller: its create never reaches RunInstances; it is killed (its task
        // aborted) once its secrets are all there.
        let provider = Arc::new(AwsProvider::new(config.clone()).await.unwrap());
        let watch = store(&config, &moto, inside).await;
        let dying = composer(
            Arc::new(hanging_creates(provider)),
            Arc::default(),
            store(&config, &moto, inside).await,
        );
        let spec = spec.clone();
        let task = tokio::spawn(async move {
            let _ = dying.provision(&spec, &CancellationToken::new()).await;
        });
        let name = MachineName::new("node-2").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while watch.secret_names(&name).await.unwrap().len() < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "the put never finished"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled(), "killed mid-create");
    }
    // A new process: the secrets are there, no instance is.
    let provider = Arc::new(AwsProvider::new(config.clone()).await.unwrap());
    let fresh_store = store(&config, &moto, inside).await;
    assert_eq!(fresh_store.secret_names(&spec.name).await.unwrap().len(), 3);
    assert!(provider.find(&spec.name).await.unwrap().is_none());
    let fresh = composer(provider.clone(), Arc::default(), fresh_store.clone());
    assert!(
        fresh
            .sweep_bootstrap_data(Duration::from_secs(3600))
            .await
            .unwrap()
            .is_empty(),
        "within the grace period a create may still be in flight"
    );
    let swept = fresh.sweep_bootstrap_data(Duration::ZERO).await.unwrap();
    assert_eq!(swept, vec![spec.name.clone()]);
    assert!(
        fresh_store
            .secret_names(&spec.name)
            .await
            .unwrap()
            .is_empty()
    );
    // A put of the same document again keeps its secrets; another document replaces them.
    let a = fresh_store.put(&spec.name, b"one").await.unwrap();
    let b = fresh_store.put(&spec.name, b"one").await.unwrap();
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    fresh_store.put(&spec.name, b"two").await.unwrap();
    assert_eq!(fresh_store.secret_names(&spec.name).await.unwrap().len(), 1);
    fresh_store.withdraw(&spec.name).await.unwrap();
    fresh_store.withdraw(&spec.name).await.unwrap();
    assert!(
        fresh_store
            .secret_names(&spec.name)
            .await
            .unwrap()
            .is_empty()
    );
}
