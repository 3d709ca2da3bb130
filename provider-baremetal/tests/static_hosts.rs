//! The static-hosts provider against real OpenSSH hosts: sshd processes on loopback
//! ports, each with its own host key and its own private claim directory (a tmpfs in
//! the sshd's mount namespace), so several "hosts" share this machine without sharing
//! their claims.

#[path = "../../bootstrap-ssh/tests/support/mod.rs"]
mod support;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bootstrap_ssh::{Auth, SshConfig, SshConnector};
use machine_core::conformance::{Clients, Fixture};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, Composer, ErrorKind, MachineName, MachineProvisioner, MachineSpec, Phase,
    UserData, UserDataFormat,
};
use provider_baremetal::{HostEntry, StaticHostsConfig, StaticHostsProvider};
use support::{Sshd, SshdOptions};

/// Some hosts that trust one client key, and the inventory naming them.
struct Pool {
    hosts: Vec<Sshd>,
    key: PathBuf,
    claim_dir: PathBuf,
    _keys: tempfile::TempDir,
}

impl Pool {
    fn new(n: usize) -> Pool {
        let keys = tempfile::tempdir().unwrap();
        let key = support::keygen(keys.path(), "client", "ed25519", "");
        let claim_dir = std::env::temp_dir().join(format!("bm-claims-{}", support::unique()));
        let hosts = (0..n)
            .map(|_| {
                Sshd::with(SshdOptions {
                    authorized: vec![key.with_extension("pub")],
                    private_dir: Some(claim_dir.clone()),
                    ..SshdOptions::default()
                })
            })
            .collect();
        Pool {
            hosts,
            key,
            claim_dir,
            _keys: keys,
        }
    }

    /// Host `i`: even ones are of size class `small`, odd ones `Large-2x4096`.
    fn entry(&self, i: usize) -> HostEntry {
        let h = &self.hosts[i];
        let even = i.is_multiple_of(2);
        HostEntry::new(format!("h{i}"), h.host.clone())
            .port(h.port)
            .host_key(h.host_key_pub.clone())
            .label("slot", if even { "even" } else { "odd" })
            .size(if even { SMALL } else { LARGE })
    }

    fn config(&self, owner: &str) -> StaticHostsConfig {
        let mut c = StaticHostsConfig::new(
            owner,
            (0..self.hosts.len()).map(|i| self.entry(i)).collect(),
        );
        c.claim_dir = self.claim_dir.display().to_string();
        c.probe_timeout = Duration::from_secs(5);
        c
    }

    fn connector(&self) -> Arc<SshConnector> {
        connector(&self.key)
    }

    fn provider(&self, owner: &str) -> Arc<StaticHostsProvider> {
        self.provider_with(self.config(owner))
    }

    fn provider_with(&self, config: StaticHostsConfig) -> Arc<StaticHostsProvider> {
        Arc::new(StaticHostsProvider::new(config, self.connector()).unwrap())
    }
}

const SMALL: &str = "small";
const LARGE: &str = "Large-2x4096";

/// An SSH connector logging in with the client key at `key`, verifying pinned host keys.
fn connector(key: &std::path::Path) -> Arc<SshConnector> {
    let auth = Auth::key_file(key, None).unwrap();
    Arc::new(SshConnector::new(support::fast(SshConfig::new(vec![auth]))))
}

/// The host a static provider ID names (`static:///<host>/<claim id>`).
fn host_of(id: &machine_core::ProviderId) -> &str {
    let rest = id.as_str().strip_prefix("static:///").unwrap();
    rest.split('/').next().unwrap()
}

fn spec(name: &str) -> MachineSpec {
    MachineSpec::new(MachineName::new(name).unwrap())
}

/// Hosts in the conformance pool: `names_are_exact` holds six machines at once.
const CONFORMANCE_HOSTS: usize = 6;

async fn setup() -> (Clients, Fixture, Pool) {
    let pool = Pool::new(CONFORMANCE_HOSTS);
    let mut fixture = Fixture::new("static:///no-such-host", |name| {
        MachineSpec::new(name.clone())
    });
    // A size is a size class of the inventory: the spec claims a host of that class.
    fixture.sizes = vec![SMALL.into(), LARGE.into()];
    // The connector the provider itself uses; static hosts have no power operations, so
    // the suite only reaches machines with it where power is declared (never here).
    fixture.connector = Some(pool.connector());
    // Nothing answers for the hosts but their own sshd, over an end-to-end encrypted
    // and authenticated channel that no proxy can answer for; and they have no quota,
    // capacity or throttle answer of their own (a full pool is the provider's
    // InsufficientCapacity, tested below).
    fixture.faults = None;
    fixture.capacity = Some(CONFORMANCE_HOSTS);
    // Every call reads the claims of all six hosts over new SSH connections: a round of
    // the crash cases costs about 3 s, of the replica case 9 s. Four crash rounds still
    // hit each quarter of a create's and a delete's await points.
    fixture.crash_rounds = 4;
    fixture.replica_rounds = 2;
    let fresh = {
        let (config, key) = (pool.config("conf"), pool.key.clone());
        move || {
            let p: Arc<dyn MachineProvisioner> =
                Arc::new(StaticHostsProvider::new(config.clone(), connector(&key)).unwrap());
            Box::pin(async move { p }) as Pin<Box<dyn Future<Output = _> + Send>>
        }
    };
    let clients = Clients::new(
        pool.provider("conf"),
        pool.provider("conf"),
        pool.provider("conf-other"),
    )
    .with_fresh(fresh);
    (clients, fixture, pool)
}

machine_core::conformance_tests!(setup);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_is_a_capacity_error_until_a_host_is_released() {
    let pool = Pool::new(2);
    let p = pool.provider("quota");
    let a = p.create(&spec("a"), None).await.unwrap();
    let b = p.create(&spec("b"), None).await.unwrap();
    assert_ne!(
        host_of(&a.provider_id),
        host_of(&b.provider_id),
        "two machines on one host"
    );
    let e = p.create(&spec("c"), None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InsufficientCapacity, "{e}");
    assert!(e.to_string().contains("h0, h1"), "{e}");

    p.delete(&a.provider_id).await.unwrap();
    let c = p.create(&spec("c"), None).await.unwrap();
    assert_eq!(
        host_of(&c.provider_id),
        host_of(&a.provider_id),
        "c did not get the released host"
    );
    assert_ne!(c.provider_id, a.provider_id, "a new claim has a new ID");
    assert_eq!(c.phase, Phase::Provisioned);
    let names: Vec<_> = p
        .list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name.to_string())
        .collect();
    assert_eq!(names, ["b", "c"]);
    for m in [b, c] {
        p.delete(&m.provider_id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specs_pin_a_host_or_select_by_label() {
    let pool = Pool::new(3);
    let p = pool.provider("pick");
    let pinned = spec("pinned").with_provider(serde_json::json!({"host": "h2"}));
    let m = p.create(&pinned, None).await.unwrap();
    assert_eq!(host_of(&m.provider_id), "h2");
    assert_eq!(m.access.ssh.as_ref().unwrap().port, pool.hosts[2].port);
    assert_eq!(m.access.host_keys, [pool.hosts[2].host_key_pub.clone()]);

    // h0 and h2 are "even"; h2 is taken, so h0 it is.
    let even = spec("even").with_provider(serde_json::json!({"selector": {"slot": "even"}}));
    let e = p.create(&even, None).await.unwrap();
    assert_eq!(host_of(&e.provider_id), "h0");
    let again = spec("again").with_provider(serde_json::json!({"host": "h2"}));
    let err = p.create(&again, None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InsufficientCapacity, "{err}");

    for (bad, field) in [
        (serde_json::json!({"host": "h9"}), "provider.host"),
        (
            serde_json::json!({"selector": {"slot": "none"}}),
            "provider.selector",
        ),
        (serde_json::json!({"hots": "h1"}), "provider.hots"),
    ] {
        let err = p
            .create(&spec("bad").with_provider(bad), None)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidSpec, "{err}");
        assert_eq!(err.field(), Some(field), "{err}");
    }
    for m in [m, e] {
        p.delete(&m.provider_id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_racing_never_share_a_host_or_duplicate_a_name() {
    let pool = Pool::new(3);
    let (p1, p2) = (pool.provider("race"), pool.provider("race"));
    let (s1, s2, s3) = (spec("x1"), spec("x2"), spec("x3"));
    let (x1, x2, x3) = tokio::join!(
        p1.create(&s1, None),
        p2.create(&s2, None),
        p1.create(&s3, None),
    );
    let mut ids: Vec<_> = [x1, x2, x3]
        .into_iter()
        .map(|m| m.unwrap().provider_id)
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "two machines share a host: {ids:?}");
    for id in &ids {
        p1.delete(id).await.unwrap();
    }

    // Both controllers create one name at the same instant: one machine.
    let same = spec("same");
    let (a, b) = tokio::join!(p1.create(&same, None), p2.create(&same, None));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.provider_id, b.provider_id, "one name, two hosts");
    let listed = p2.list(&Default::default()).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    p2.delete(&a.provider_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_host_makes_find_fail_rather_than_answer_none() {
    let pool = Pool::new(1);
    let mut config = pool.config("silent");
    // A port held for the whole test and never answered: a free port picked and let go
    // could be taken by another test's sshd meanwhile (it was, once, in CI).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = silent.local_addr().unwrap().port();
    config
        .hosts
        .push(HostEntry::new("dead", "127.0.0.1").port(dead));
    config.probe_timeout = Duration::from_secs(2);
    let p = pool.provider_with(config);
    let e = p.find(&MachineName::new("x").unwrap()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(e.to_string().contains("dead"), "{e}");
    let e = p.create(&spec("x"), None).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    // Nothing was claimed on the live host meanwhile.
    assert!(
        pool.provider("silent")
            .list(&Default::default())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_host_key_is_refused_and_nothing_is_claimed() {
    let pool = Pool::new(2);
    let mut config = pool.config("keys");
    // h0 pinned to h1's key: a host that is not who the inventory says.
    config.hosts[0].host_keys = vec![pool.hosts[1].host_key_pub.clone()];
    let p = pool.provider_with(config);
    let e = p.create(&spec("x"), None).await.unwrap_err();
    assert!(!e.is_retryable(), "a key mismatch is permanent: {e}");
    assert!(e.to_string().contains("h0"), "{e}");
    assert!(
        pool.provider("keys")
            .list(&Default::default())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_composer_applies_decoupled_layers_to_a_claimed_host() {
    let pool = Pool::new(2);
    let p = pool.provider("compose");
    // The sshd's own directory is on the shared filesystem, so the test can look.
    let out = pool.hosts[0].dir.path().join("app.conf");
    let state = pool.hosts[0].dir.path().join("state");
    let layer = StepLayer::new(
        "app",
        vec![
            Step::write_file(out.to_str().unwrap(), "port=8080\n"),
            Step::run("uname -s"),
        ],
    )
    .unwrap()
    .with_state_dir(state.to_str().unwrap())
    .unwrap();
    let composer = Composer::builder(p.clone())
        .decoupled(Arc::new(layer))
        .connector(pool.connector())
        .build()
        .unwrap();
    let web = spec("web").with_provider(serde_json::json!({"host": "h0"}));
    let done = composer
        .provision(&web, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    assert_eq!(host_of(&done.machine.provider_id), "h0");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "port=8080\n");

    composer
        .deprovision(&web.name, &CancellationToken::new())
        .await
        .unwrap();
    assert!(p.find(&web.name).await.unwrap().is_none());
}

#[tokio::test]
async fn user_data_is_refused_before_any_host_is_touched() {
    // No host listens here: the refusal must come before any connection.
    let config = StaticHostsConfig::new(
        "ud",
        vec![HostEntry::new("h0", "127.0.0.1").port(support::free_port())],
    );
    let connector = Arc::new(SshConnector::new(SshConfig::new(Vec::new())));
    let p = StaticHostsProvider::new(config, connector).unwrap();
    assert!(p.capabilities().user_data.is_none());
    let ud = UserData::new(UserDataFormat::ShellScript, "#!/bin/sh\ntrue\n");
    let e = p.create(&spec("x"), Some(&ud)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec);
    assert_eq!(e.field(), Some("userData"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_claims_only_hosts_of_that_class_and_reads_back_as_the_machines_size() {
    // h0 and h2 are small, h1 large.
    let pool = Pool::new(3);
    let p = pool.provider("sized");
    let big = p.create(&spec("big").with_size(LARGE), None).await.unwrap();
    assert_eq!(host_of(&big.provider_id), "h1");
    assert_eq!(big.size.as_deref(), Some(LARGE));
    let got = p.get(&big.provider_id).await.unwrap();
    assert_eq!(got.size.as_deref(), Some(LARGE));
    // The only large host is taken: no room, though small ones are free.
    let e = p
        .create(&spec("big2").with_size(LARGE), None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InsufficientCapacity, "{e}");
    // A size no host has, or a pinned host of another size: the spec is wrong.
    for bad in [
        spec("huge").with_size("huge"),
        spec("pinned")
            .with_size(SMALL)
            .with_provider(serde_json::json!({"host": "h1"})),
    ] {
        let e = p.create(&bad, None).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
        assert_eq!(e.field(), Some("size"), "{e}");
        assert!(p.find(&bad.name).await.unwrap().is_none());
    }
    // Without a size any host will do, and the machine still says what it got.
    let any = p.create(&spec("any"), None).await.unwrap();
    assert_eq!(host_of(&any.provider_id), "h0");
    assert_eq!(any.size.as_deref(), Some(SMALL));
    for m in [big, any] {
        p.delete(&m.provider_id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_machines_id_never_names_the_next_machine_on_its_host() {
    let pool = Pool::new(1);
    let p = pool.provider("stale");
    let old = p.create(&spec("old"), None).await.unwrap();
    p.delete(&old.provider_id).await.unwrap();
    let new = p.create(&spec("new"), None).await.unwrap();
    assert_eq!(host_of(&new.provider_id), host_of(&old.provider_id));
    assert_ne!(new.provider_id, old.provider_id);
    let e = p.get(&old.provider_id).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    // A late delete of the old machine (a retry, a controller that was behind) leaves
    // the new one alone.
    p.delete(&old.provider_id).await.unwrap();
    let still = p.get(&new.provider_id).await.unwrap();
    assert_eq!(still.name.as_str(), "new");
    p.delete(&new.provider_id).await.unwrap();
    assert!(p.find(&new.name).await.unwrap().is_none());
}
