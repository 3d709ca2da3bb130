//! The composer's user data, from layers of every kind, run through the real cloud-init
//! boot stages in a Debian root ([`peers::root`]): every user, file and command of every
//! layer must be on the machine, scripts must run in the composed order, and each
//! completion check (sentinel file, phone home, `cloud-init status`) must say Done only
//! when every part succeeded and finished, and Failed with cloud-init's own lines
//! otherwise. A property test composes random layer sets the same way.

mod peers;

use std::sync::Arc;

use bootstrap_cloudinit::{
    Bootstrap, CloudConfig, CloudConfigLayer, CloudInitStatus, DerivedHostKeys, PhoneHomeCheck,
    PhoneHomeListener, Secret, User, WriteFile,
};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    Completion, CompletionCheck, Composer, CoupledSoftware, ErrorKind, Machine, MachineName,
    MachineSpec, Phase, ProviderId, Result, SentinelFile, Software, UserData, UserDataFormat,
    UserDataPart,
};
use peers::root::{NetNs, Root};
use proptest::prelude::*;

/// A layer made of plain machine-core parts, as a user's own layer type would be: a
/// cloud-config part with no `Merge-Type` header and a script part.
struct RawLayer {
    name: String,
    parts: Vec<UserDataPart>,
}

impl Software for RawLayer {
    fn name(&self) -> &str {
        &self.name
    }
}

impl CoupledSoftware for RawLayer {
    fn user_data_parts(&self, _spec: &MachineSpec) -> Result<Vec<UserDataPart>> {
        Ok(self.parts.clone())
    }
}

/// The kinds of layer the composer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A `CloudConfigLayer` with a user, a file, a runcmd and a script part.
    CloudConfig,
    /// A `Bootstrap` (default merged output) of one layer: a user, a file, a runcmd.
    Bootstrap,
    /// A machine-core `StepLayer` (a shell script): a file, a user, a command.
    Steps,
    /// A [`RawLayer`]: a header-less cloud-config (user, file, runcmd) and a script.
    Raw,
}

/// One layer of a composition: its kind, its name, whether one of its steps fails.
#[derive(Debug, Clone)]
struct Spec {
    kind: Kind,
    name: String,
    fails: bool,
}

const ORDER_LOG: &str = "/var/tmp/order";
const RUNCMD_LOG: &str = "/var/tmp/runcmd";

fn user(name: &str) -> String {
    format!("u-{name}")
}

fn file(name: &str) -> String {
    format!("/etc/composed/{name}.conf")
}

fn content(name: &str) -> String {
    format!("written by layer {name}\n")
}

fn failing(name: &str) -> String {
    format!("echo 'layer {name} fails on purpose' >&2; exit 3")
}

impl Spec {
    fn new(kind: Kind, name: &str) -> Self {
        Spec {
            kind,
            name: name.to_owned(),
            fails: false,
        }
    }

    fn failing(mut self) -> Self {
        self.fails = true;
        self
    }

    /// Whether the layer has a script part that logs to [`ORDER_LOG`].
    fn scripts(&self) -> bool {
        self.kind != Kind::Bootstrap
    }

    /// Whether the layer has a runcmd entry that logs to [`RUNCMD_LOG`].
    fn runcmd(&self) -> bool {
        self.kind != Kind::Steps
    }

    fn build(&self) -> Arc<dyn CoupledSoftware> {
        let n = self.name.as_str();
        let order = format!("#!/bin/sh\necho {n} >> {ORDER_LOG}\n");
        let logged = format!("echo {n} >> {RUNCMD_LOG}");
        let config = || {
            CloudConfig::new()
                .with_user(User::new(user(n)))
                .with_file(WriteFile::new(file(n), content(n)))
                .with_runcmd(logged.clone())
        };
        match self.kind {
            Kind::CloudConfig => {
                let mut layer = CloudConfigLayer::new(n, config())
                    .unwrap()
                    .with_script("order.sh", order)
                    .unwrap();
                if self.fails {
                    layer = layer
                        .with_script("fail.sh", format!("#!/bin/sh\n{}\n", failing(n)))
                        .unwrap();
                }
                Arc::new(layer)
            }
            Kind::Bootstrap => {
                let mut c = config();
                if self.fails {
                    // A failed command in the middle of runcmd, followed by another.
                    c = c.with_runcmd(failing(n)).with_runcmd("true");
                }
                let inner = CloudConfigLayer::new("inner", c).unwrap();
                Arc::new(Bootstrap::new(n, vec![inner]).unwrap())
            }
            Kind::Steps => {
                let mut steps = vec![
                    Step::write_file(file(n), content(n)),
                    Step::run(format!("useradd -M {}", user(n))),
                    Step::run(format!("echo {n} >> {ORDER_LOG}")),
                ];
                if self.fails {
                    steps.push(Step::run(failing(n)));
                }
                Arc::new(StepLayer::new(n, steps).unwrap())
            }
            Kind::Raw => {
                let doc = format!(
                    "#cloud-config\nusers:\n- name: {}\nwrite_files:\n- path: {}\n  content: {:?}\nruncmd:\n- {logged}\n",
                    user(n),
                    file(n),
                    content(n),
                );
                let mut parts = vec![
                    UserDataPart::new(UserDataFormat::CloudConfig, "config.yaml", doc),
                    UserDataPart::new(UserDataFormat::ShellScript, "order.sh", order),
                ];
                if self.fails {
                    parts.push(UserDataPart::new(
                        UserDataFormat::ShellScript,
                        format!("{n}-fail.sh"),
                        format!("#!/bin/sh\n{}\n", failing(n)),
                    ));
                }
                Arc::new(RawLayer {
                    name: n.to_owned(),
                    parts,
                })
            }
        }
    }
}

/// The completion checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CheckKind {
    Sentinel,
    PhoneHome,
    Status,
}

/// A completion check and what it needs on the test's side.
struct Check {
    kind: CheckKind,
    check: Arc<dyn CompletionCheck>,
    sentinel: SentinelFile,
    net: Option<NetNs>,
}

impl Check {
    fn new(kind: CheckKind) -> Self {
        let sentinel = SentinelFile::default();
        let (check, net): (Arc<dyn CompletionCheck>, _) = match kind {
            CheckKind::Sentinel => (Arc::new(sentinel.clone()), None),
            CheckKind::Status => (Arc::new(CloudInitStatus::new()), None),
            CheckKind::PhoneHome => {
                // The listener is bound inside a namespace of the test's own, which the
                // machine shares: it reaches the listener on 127.0.0.1 and nothing else.
                let handle = tokio::runtime::Handle::current();
                let (net, listener) = NetNs::with(move || {
                    handle.block_on(PhoneHomeListener::bind("127.0.0.1:0".parse().unwrap()))
                });
                let listener = Arc::new(listener.unwrap());
                (
                    Arc::new(PhoneHomeCheck::new(listener, "127.0.0.1")),
                    Some(net),
                )
            }
        };
        Check {
            kind,
            check,
            sentinel,
            net,
        }
    }
}

fn composer(layers: &[Arc<dyn CoupledSoftware>], check: &Check) -> Composer {
    let cloud = SimCloud::new();
    let config = SimConfig::default().with_user_data_limit(64 * 1024);
    let provider = Arc::new(SimProvider::new(cloud.clone(), config).unwrap());
    let mut builder = Composer::builder(provider);
    for layer in layers {
        builder = builder.coupled(layer.clone());
    }
    builder
        .connector(Arc::new(SimConnector::new(cloud)))
        .completion(check.check.clone())
        .build()
        .unwrap()
}

fn user_data(layers: &[Arc<dyn CoupledSoftware>], check: &Check) -> UserData {
    composer(layers, check)
        .user_data(&MachineSpec::new(MachineName::new("web-1").unwrap()))
        .unwrap()
        .expect("user data")
}

fn unique() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "iid-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Boots the user data in a fresh root; returns the root and the machine as the
/// composer would see it (its provider id ends in the instance id).
fn boot(user_data: &UserData, check: &Check) -> (Root, Machine) {
    let iid = unique();
    let mut root = Root::new(&user_data.bytes, &iid);
    if let Some(net) = &check.net {
        root = root.in_netns(net);
    }
    tokio::task::block_in_place(|| root.boot());
    let machine = Machine::new(
        MachineName::new("web-1").unwrap(),
        ProviderId::new(format!("sim:///{iid}")).unwrap(),
        Phase::Provisioned,
    );
    (root, machine)
}

fn lines(root: &Root, path: &str) -> Vec<String> {
    std::fs::read_to_string(root.upper(path))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Checks everything the layers asked for against the booted root, and the check's
/// verdict against whether a step was meant to fail.
async fn assert_outcome(specs: &[Spec], root: &Root, machine: &Machine, check: &Check) {
    for s in specs {
        let n = &s.name;
        assert_eq!(root.read(&file(n)), content(n), "layer {n}'s file");
        assert!(
            root.account("/etc/passwd", &user(n)).is_some(),
            "layer {n}'s user {} is missing",
            user(n)
        );
    }
    let scripts: Vec<&str> = specs
        .iter()
        .filter(|s| s.scripts())
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        lines(root, ORDER_LOG),
        scripts,
        "script parts in composed order"
    );
    // runcmd stops at its first failed command (a failing Bootstrap's).
    let mut runcmd = Vec::new();
    for s in specs.iter().filter(|s| s.runcmd()) {
        runcmd.push(s.name.as_str());
        if s.fails && s.kind == Kind::Bootstrap {
            break;
        }
    }
    assert_eq!(
        lines(root, RUNCMD_LOG),
        runcmd,
        "runcmd of every layer, in order"
    );

    let verdict = check.check.check(machine, root).await.unwrap();
    match specs.iter().find(|s| s.fails) {
        None => assert_eq!(verdict, Completion::Done, "{:?}", check.kind),
        Some(f) => {
            let Completion::Failed(msg) = &verdict else {
                panic!(
                    "{:?} said {verdict:?} after layer {} failed",
                    check.kind, f.name
                );
            };
            assert!(msg.contains("scripts-user"), "{msg}");
            let part = if f.kind == Kind::Bootstrap {
                // cloud-init says only "runcmd"; the composer's markers name the layer
                // and the command: the second of logged, failing, true.
                format!("runcmd of layer {} failed at its command 2 of 3", f.name)
            } else {
                f.name.clone()
            };
            assert!(msg.contains(&part), "the failing part is named: {msg}");
        }
    }
    if check.kind == CheckKind::Sentinel {
        let written = root.upper(check.sentinel.path()).exists();
        assert_eq!(written, !specs.iter().any(|s| s.fails), "sentinel");
    }
}

async fn compose_boot_and_check(specs: &[Spec], kind: CheckKind) {
    let check = Check::new(kind);
    let layers: Vec<_> = specs.iter().map(Spec::build).collect();
    let ud = user_data(&layers, &check);
    let (root, machine) = boot(&ud, &check);
    assert_outcome(specs, &root, &machine, &check).await;
}

/// Layers of every kind, named so that sorting by name is not their order, two of them
/// with a script part of the same name.
fn every_kind() -> Vec<Spec> {
    vec![
        Spec::new(Kind::CloudConfig, "zeta"),
        Spec::new(Kind::Bootstrap, "platform"),
        Spec::new(Kind::Raw, "raw-b"),
        Spec::new(Kind::Steps, "steps"),
        Spec::new(Kind::Raw, "raw-a"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_of_every_kind_lands_and_the_sentinel_says_done() {
    compose_boot_and_check(&every_kind(), CheckKind::Sentinel).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_of_every_kind_lands_and_phone_home_says_done() {
    compose_boot_and_check(&every_kind(), CheckKind::PhoneHome).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_of_every_kind_lands_and_cloud_init_status_says_done() {
    compose_boot_and_check(&every_kind(), CheckKind::Status).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_script_gives_the_sentinel_failed_with_cloud_init_own_lines() {
    let mut specs = every_kind();
    specs[3] = specs[3].clone().failing();
    compose_boot_and_check(&specs, CheckKind::Sentinel).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_script_gives_phone_home_failed_with_cloud_init_own_lines() {
    let mut specs = every_kind();
    specs[0] = specs[0].clone().failing();
    compose_boot_and_check(&specs, CheckKind::PhoneHome).await;
}

/// A lone script is the whole user data unless it goes as a multipart: cloud-init
/// would then report it as `part-001`, not by its layer (proptest found this).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_failing_steps_layer_is_named_in_every_verdict() {
    for kind in [CheckKind::Status, CheckKind::Sentinel, CheckKind::PhoneHome] {
        let specs = vec![Spec::new(Kind::Steps, "zz-finish").failing()];
        compose_boot_and_check(&specs, kind).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_command_mid_runcmd_gives_every_check_failed() {
    for kind in [CheckKind::Status, CheckKind::Sentinel, CheckKind::PhoneHome] {
        let mut specs = every_kind();
        specs[1] = specs[1].clone().failing();
        compose_boot_and_check(&specs, kind).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_named_zz_finish_runs_before_the_sentinel_is_written() {
    let sentinel = SentinelFile::default();
    let finish = CloudConfigLayer::new("zz-finish", CloudConfig::new())
        .unwrap()
        .with_script(
            "finish.sh",
            format!(
                "#!/bin/sh\nsleep 0.5\nif [ -e {0} ]; then echo after; else echo before; fi > /var/tmp/zz-finish\n",
                sentinel.path()
            ),
        )
        .unwrap();
    let check = Check::new(CheckKind::Sentinel);
    let layers: Vec<Arc<dyn CoupledSoftware>> = vec![
        Spec::new(Kind::CloudConfig, "base").build(),
        Arc::new(finish),
    ];
    let (root, machine) = boot(&user_data(&layers, &check), &check);
    assert_eq!(
        check.check.check(&machine, &root).await.unwrap(),
        Completion::Done
    );
    assert_eq!(
        root.read("/var/tmp/zz-finish"),
        "before\n",
        "zz-finish ran after the sentinel said success"
    );
}

#[test]
fn conflicts_cloud_init_would_resolve_silently_are_refused_naming_both_layers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let check = Check::new(CheckKind::Status);
    let web = CloudConfigLayer::new("base", CloudConfig::new().with_hostname("web-1")).unwrap();
    let db = CloudConfigLayer::new("inner", CloudConfig::new().with_hostname("db-1")).unwrap();
    let platform = Bootstrap::new("platform", vec![db]).unwrap();
    let layers: Vec<Arc<dyn CoupledSoftware>> = vec![Arc::new(web), Arc::new(platform)];
    let e = composer(&layers, &check)
        .user_data(&MachineSpec::new(MachineName::new("web-1").unwrap()))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec);
    assert_eq!(e.field(), Some("hostname"));
    let msg = e.to_string();
    assert!(
        msg.contains("\"base\"") && msg.contains("\"platform\""),
        "{msg}"
    );

    // Host keys from two layers: cloud-init keeps one set, the composer pins both.
    let derived =
        DerivedHostKeys::new(Secret::new("test master secret, 32 bytes or more")).unwrap();
    let own = bootstrap_cloudinit::HostKey::generate_ed25519("web-1").unwrap();
    let keyed = CloudConfigLayer::new(
        "base",
        CloudConfig {
            ssh_keys: Some(own.ssh_keys()),
            ..CloudConfig::new()
        },
    )
    .unwrap();
    let layers: Vec<Arc<dyn CoupledSoftware>> = vec![Arc::new(keyed), Arc::new(derived)];
    let e = composer(&layers, &check)
        .user_data(&MachineSpec::new(MachineName::new("web-1").unwrap()))
        .unwrap_err();
    assert_eq!(e.field(), Some("ssh_keys"));
    let msg = e.to_string();
    assert!(
        msg.contains("\"base\"") && msg.contains("\"host-keys\""),
        "{msg}"
    );
    assert!(!msg.contains("PRIVATE"), "{msg}");
}

/// Layer A creates `deploy`; layer B, declaring it as an account another layer
/// creates, writes a file owned by it. Without `defer` cloud-init's init stage would
/// fail the chown (the account does not exist yet) and skip the files after it: the
/// composer and a merged `Bootstrap` refuse it naming both layers; deferred, the real
/// cloud-init writes it owned by `deploy`, and the next file too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_owned_by_an_account_another_layer_creates_lands_owned_by_it_once_deferred() {
    let accounts = || {
        CloudConfigLayer::new(
            "accounts",
            CloudConfig::new().with_user(User::new("deploy")),
        )
        .unwrap()
    };
    let files = |deferred: bool| {
        let mut owned = WriteFile::new("/srv/deploy.conf", "owned\n").owner("deploy:deploy");
        if deferred {
            owned = owned.deferred();
        }
        CloudConfigLayer::with_system_users(
            "files",
            CloudConfig::new()
                .with_file(owned)
                .with_file(WriteFile::new("/srv/next.conf", "next\n")),
            vec!["deploy".into()],
        )
        .unwrap()
    };
    let check = Check::new(CheckKind::Status);
    let spec = MachineSpec::new(MachineName::new("web-1").unwrap());
    let layers: Vec<Arc<dyn CoupledSoftware>> = vec![Arc::new(accounts()), Arc::new(files(false))];
    let e = composer(&layers, &check).user_data(&spec).unwrap_err();
    assert_eq!(e.field(), Some("write_files[0].defer"), "{e}");
    assert!(
        e.to_string().contains("\"files\"") && e.to_string().contains("\"accounts\""),
        "{e}"
    );
    let e = Bootstrap::new("merged", vec![accounts(), files(false)]).unwrap_err();
    assert_eq!(e.field(), Some("write_files[0].defer"), "{e}");

    let layers: Vec<Arc<dyn CoupledSoftware>> = vec![Arc::new(accounts()), Arc::new(files(true))];
    let (root, machine) = boot(&user_data(&layers, &check), &check);
    assert_eq!(
        check.check.check(&machine, &root).await.unwrap(),
        Completion::Done
    );
    let passwd = root
        .account("/etc/passwd", "deploy")
        .expect("deploy was created");
    let uid: u32 = passwd.split(':').nth(2).unwrap().parse().unwrap();
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(root.upper("/srv/deploy.conf")).unwrap();
    assert_eq!(meta.uid(), uid, "the deferred file is owned by deploy");
    assert_eq!(root.read("/srv/next.conf"), "next\n");
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::CloudConfig),
        Just(Kind::Bootstrap),
        Just(Kind::Steps),
        Just(Kind::Raw),
    ]
}

fn check_kind() -> impl Strategy<Value = CheckKind> {
    prop_oneof![
        Just(CheckKind::Sentinel),
        Just(CheckKind::PhoneHome),
        Just(CheckKind::Status),
    ]
}

/// Names chosen so that file-name order and composed order disagree.
const NAMES: &[&str] = &["zz-finish", "aa", "00-first", "web", "m", "z9", "app", "b1"];

/// 1 to 5 layers of random kinds with distinct random names in random order, at most
/// one with a failing step, and a random completion check.
fn composition() -> impl Strategy<Value = (Vec<Spec>, CheckKind)> {
    (
        prop::collection::vec(kind(), 1..=5),
        Just(NAMES.to_vec()).prop_shuffle(),
        prop::option::of(0usize..5),
        check_kind(),
    )
        .prop_map(|(kinds, names, fail, check)| {
            let specs = kinds
                .iter()
                .zip(names)
                .enumerate()
                .map(|(i, (k, n))| {
                    let s = Spec::new(*k, n);
                    if fail == Some(i) { s.failing() } else { s }
                })
                .collect();
            (specs, check)
        })
}

proptest! {
    // Each case boots cloud-init (1-2 s): few cases, no shrinking runs to speak of.
    #![proptest_config(ProptestConfig {
        cases: 12,
        max_shrink_iters: 4,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_compositions_get_what_they_asked_and_a_true_verdict((specs, check) in composition()) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(compose_boot_and_check(&specs, check));
    }
}
