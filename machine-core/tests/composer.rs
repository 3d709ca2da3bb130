//! The composer on the simulator: coupled, decoupled and mixed layers; reconcile steps;
//! deadlines, failures and fleets.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    Action, CAPI_SENTINEL, CancellationToken, Composer, ComposerSettings, ContentEncoding,
    Deadlines, ErrorKind, ExecOutput, FailurePolicy, MachineName, MachineProvisioner, MachineSpec,
    Phase, SentinelFile, UserDataFormat,
};

fn spec(name: &str) -> MachineSpec {
    MachineSpec::new(MachineName::new(name).unwrap())
}

fn sim(cloud: &SimCloud, config: SimConfig) -> Arc<SimProvider> {
    Arc::new(SimProvider::new(cloud.clone(), config).unwrap())
}

fn fast_settings() -> ComposerSettings {
    ComposerSettings::default()
        .with_deadlines(
            Deadlines::default()
                .with_create(Duration::from_secs(5))
                .with_boot(Duration::from_secs(5))
                .with_bootstrap(Duration::from_millis(400))
                .with_delete(Duration::from_secs(5)),
        )
        .with_poll_interval(Duration::from_millis(10))
        .with_on_failure(FailurePolicy::KeepForDebugging)
}

fn base() -> Arc<StepLayer> {
    Arc::new(
        StepLayer::new(
            "base",
            vec![
                Step::write_file("/etc/motd", "welcome\n"),
                Step::run("useradd -m ops"),
            ],
        )
        .unwrap(),
    )
}

fn app() -> Arc<StepLayer> {
    Arc::new(
        StepLayer::new(
            "app",
            vec![
                Step::write_file_mode("/opt/app/run.sh", "#!/bin/sh\nexec app\n", 0o755),
                Step::run("systemctl enable --now app"),
            ],
        )
        .unwrap(),
    )
}

#[tokio::test]
async fn coupled_layer_goes_into_user_data_and_completion_is_checked() {
    let cloud = SimCloud::new();
    let provider = sim(&cloud, SimConfig::default());
    let composer = Composer::builder(provider.clone())
        .coupled(base())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .completion(Arc::new(SentinelFile::default()))
        .settings(fast_settings())
        .build()
        .unwrap();
    let done = composer
        .provision(&spec("coupled"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    assert!(done.machine.condition("BootstrapComplete").unwrap().status);

    let ud = provider
        .user_data(&done.machine.provider_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ud.format,
        UserDataFormat::Mime,
        "layer script + sentinel script"
    );
    // Parts are quoted-printable: join its soft line breaks, which fall anywhere.
    let text = String::from_utf8(ud.decoded().unwrap())
        .unwrap()
        .replace("=\r\n", "");
    assert!(text.contains("machine-core step layer \"base\""), "{text}");
    assert!(text.contains(CAPI_SENTINEL), "{text}");

    let host = cloud.host(&done.machine.provider_id).unwrap();
    assert!(host.files.contains_key(CAPI_SENTINEL));
    assert!(
        host.commands.iter().all(|c| c.starts_with("[init]")),
        "coupled mode runs nothing over the transport: {:?}",
        host.commands
    );
}

#[tokio::test]
async fn the_provider_hears_once_that_the_bootstrap_finished_and_not_on_a_resync() {
    let cloud = SimCloud::new();
    let provider = sim(&cloud, SimConfig::default());
    let composer = Composer::builder(provider.clone())
        .coupled(base())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .completion(Arc::new(SentinelFile::default()))
        .settings(fast_settings())
        .build()
        .unwrap();
    let s = spec("finished");
    let done = composer
        .provision(&s, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    assert_eq!(cloud.bootstrap_finished_calls(&done.machine.provider_id), 1);
    // A controller's periodic resync of a Ready machine does not call it again.
    let again = composer.reconcile(&s, Some(&done.machine)).await.unwrap();
    assert_eq!(again.machine.unwrap().phase, Phase::Ready);
    assert_eq!(cloud.bootstrap_finished_calls(&done.machine.provider_id), 1);
}

#[tokio::test]
async fn the_provider_is_not_told_the_bootstrap_finished_when_the_composer_cannot_see_it() {
    // Coupled layers and no completion check: Ready as soon as it runs, but cloud-init
    // may not have read its user data yet, so nothing may be withdrawn.
    let cloud = SimCloud::new();
    let provider = sim(&cloud, SimConfig::default());
    let composer = Composer::builder(provider.clone())
        .coupled(base())
        .settings(fast_settings())
        .build()
        .unwrap();
    let done = composer
        .provision(&spec("unseen"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    assert_eq!(cloud.bootstrap_finished_calls(&done.machine.provider_id), 0);
}

#[tokio::test]
async fn decoupled_layers_run_over_the_transport_in_order() {
    let cloud = SimCloud::new();
    let composer = Composer::builder(sim(&cloud, SimConfig::default()))
        .decoupled(base())
        .decoupled(app())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(fast_settings())
        .build()
        .unwrap();
    let done = composer
        .provision(&spec("decoupled"), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.machine.phase, Phase::Ready);
    assert!(done.machine.condition("LayerApplied/base").unwrap().status);
    assert!(done.machine.condition("LayerApplied/app").unwrap().status);
    let host = cloud.host(&done.machine.provider_id).unwrap();
    assert_eq!(
        host.commands,
        ["useradd -m ops", "systemctl enable --now app"]
    );
    assert_eq!(host.file_text("/etc/motd").unwrap(), "welcome\n");
    assert_eq!(host.files["/opt/app/run.sh"].mode, 0o755);
    assert_eq!(
        host.file_text("/var/lib/machine-core/layers/app.done")
            .unwrap()
            .lines()
            .count(),
        2
    );
    assert!(
        !host
            .files
            .contains_key("/var/lib/cloud/instance/user-data.txt"),
        "no user data when decoupled"
    );
    let t = done.timeline;
    assert!(
        t.created.is_some() && t.running.is_some() && t.reachable.is_some() && t.ready.is_some()
    );
}

#[tokio::test]
async fn mixed_layers_split_between_user_data_and_transport() {
    let cloud = SimCloud::new();
    let provider = sim(&cloud, SimConfig::default());
    let composer = Composer::builder(provider.clone())
        .coupled(base())
        .decoupled(app())
        .completion(Arc::new(SentinelFile::default()))
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(fast_settings())
        .build()
        .unwrap();
    let done = composer
        .provision(&spec("mixed"), &CancellationToken::new())
        .await
        .unwrap();
    let ud = provider
        .user_data(&done.machine.provider_id)
        .await
        .unwrap()
        .unwrap();
    // The base layer's script and the completion check's part, as MIME.
    assert_eq!(ud.format, UserDataFormat::Mime);
    let script = String::from_utf8(ud.bytes).unwrap();
    assert!(
        script.contains("useradd -m ops") && !script.contains("systemctl"),
        "{script}"
    );
    let host = cloud.host(&done.machine.provider_id).unwrap();
    assert!(
        host.commands
            .contains(&"systemctl enable --now app".to_owned())
    );
    assert!(!host.commands.contains(&"useradd -m ops".to_owned()));
}

#[tokio::test]
async fn compressible_user_data_over_the_limit_is_gzipped() {
    let cloud = SimCloud::new();
    let provider = sim(&cloud, SimConfig::default());
    let big = "# a comment that repeats and compresses well\n".repeat(1000);
    let layer = StepLayer::new("big", vec![Step::write_file("/etc/big", big.clone())]).unwrap();
    let composer = Composer::builder(provider.clone())
        .coupled(Arc::new(layer))
        .build()
        .unwrap();
    let done = composer
        .provision(&spec("gzipped"), &CancellationToken::new())
        .await
        .unwrap();
    let ud = provider
        .user_data(&done.machine.provider_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ud.encoding, ContentEncoding::Gzip);
    assert!(ud.bytes.len() <= 16 * 1024);
}

#[tokio::test]
async fn reconcile_never_waits_for_boot_and_says_when_to_look_again() {
    let cloud = SimCloud::new();
    let provider = sim(
        &cloud,
        SimConfig::default().with_boot_latency(Duration::from_millis(150)),
    );
    let composer = Composer::builder(provider)
        .decoupled(base())
        .decoupled(app())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(fast_settings())
        .build()
        .unwrap();
    let s = spec("stepwise");
    let r = composer.reconcile(&s, None).await.unwrap();
    assert_eq!(r.machine.as_ref().unwrap().phase, Phase::Provisioning);
    assert_eq!(r.action, Action::Requeue(Duration::from_millis(10)));
    let r = composer.reconcile(&s, None).await.unwrap();
    assert_eq!(
        r.machine.unwrap().phase,
        Phase::Provisioning,
        "still booting, and no second machine"
    );
    assert_eq!(cloud.machine_count(), 1);

    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = composer.reconcile(&s, None).await.unwrap();
    assert_eq!(r.machine.unwrap().phase, Phase::Bootstrapping);
    assert_eq!(
        r.action,
        Action::Requeue(Duration::ZERO),
        "one layer applied, one to go"
    );
    let r = composer.reconcile(&s, None).await.unwrap();
    assert_eq!(r.machine.unwrap().phase, Phase::Ready);
    assert_eq!(r.action, Action::AwaitChange);
    let r = composer.reconcile(&s, None).await.unwrap();
    let m = r.machine.unwrap();
    assert_eq!(m.phase, Phase::Ready);
    let host = cloud.host(&m.provider_id).unwrap();
    assert_eq!(
        host.commands.len(),
        2,
        "a Ready machine is left alone: {:?}",
        host.commands
    );

    let gone = composer.reconcile_deletion(&s.name).await.unwrap();
    assert!(gone.machine.is_none());
    assert_eq!(gone.action, Action::AwaitChange);
}

#[tokio::test]
async fn a_cut_link_requeues_and_the_rerun_resumes_without_redoing_steps() {
    let cloud = SimCloud::new();
    let composer = Composer::builder(sim(&cloud, SimConfig::default()))
        .decoupled(base())
        .decoupled(app())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(fast_settings())
        .build()
        .unwrap();
    let s = spec("link-cut");
    let r = composer.reconcile(&s, None).await.unwrap();
    let id = r.machine.unwrap().provider_id;
    assert_eq!(cloud.host(&id).unwrap().commands, ["useradd -m ops"]);

    cloud.set_reachable(&id, false).unwrap();
    let r = composer.reconcile(&s, None).await.unwrap();
    let m = r.machine.unwrap();
    assert_eq!(m.phase, Phase::Bootstrapping);
    let reach = m.condition("Reachable").unwrap();
    assert!(
        !reach.status && reach.message.contains("link cut"),
        "{reach:?}"
    );
    assert_eq!(r.action, Action::Requeue(Duration::from_millis(10)));

    cloud.set_reachable(&id, true).unwrap();
    let r = composer.reconcile(&s, None).await.unwrap();
    assert_eq!(r.machine.unwrap().phase, Phase::Ready);
    assert_eq!(
        cloud.host(&id).unwrap().commands,
        ["useradd -m ops", "systemctl enable --now app"],
        "nothing done twice"
    );
}

#[tokio::test]
async fn a_failing_step_is_a_permanent_error_and_a_rerun_resumes_at_it() {
    let cloud = SimCloud::new();
    let layer = StepLayer::new(
        "pkgs",
        vec![
            Step::run("apt-get update"),
            Step::run("apt-get install -y nginx"),
            Step::run("echo done"),
        ],
    )
    .unwrap();
    let composer = Composer::builder(sim(&cloud, SimConfig::default()))
        .decoupled(Arc::new(layer))
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(fast_settings())
        .build()
        .unwrap();
    cloud.on_exec(
        "apt-get install",
        ExecOutput::new(
            Some(100),
            vec![],
            b"E: Unable to locate package nginx\n".to_vec(),
        ),
    );
    let s = spec("failing-step");
    let e = composer
        .provision(&s, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permanent);
    let msg = e.to_string();
    assert!(msg.contains("layer pkgs"), "{msg}");
    assert!(msg.contains("status 100"), "{msg}");
    assert!(msg.contains("Unable to locate package nginx"), "{msg}");

    cloud.on_exec("apt-get install", ExecOutput::new(Some(0), vec![], vec![]));
    let done = composer
        .provision(&s, &CancellationToken::new())
        .await
        .unwrap();
    let host = cloud.host(&done.machine.provider_id).unwrap();
    assert_eq!(
        host.commands,
        [
            "apt-get update",
            "apt-get install -y nginx",
            "apt-get install -y nginx",
            "echo done"
        ],
        "the rerun starts at the failed step"
    );
}

#[tokio::test]
async fn delete_on_failure_removes_the_machine_and_keep_leaves_it() {
    let cloud = SimCloud::new();
    cloud.on_exec("false", ExecOutput::new(Some(1), vec![], b"no\n".to_vec()));
    let failing = Arc::new(StepLayer::new("bad", vec![Step::run("false")]).unwrap());
    for (policy, survives) in [
        (FailurePolicy::DeleteOnFailure, false),
        (FailurePolicy::KeepForDebugging, true),
    ] {
        let provider = sim(&cloud, SimConfig::default());
        let composer = Composer::builder(provider.clone())
            .decoupled(failing.clone())
            .connector(Arc::new(SimConnector::new(cloud.clone())))
            .settings(fast_settings().with_on_failure(policy))
            .build()
            .unwrap();
        let s = spec(&format!("policy-{}", survives as u8));
        composer
            .provision(&s, &CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(
            provider.find(&s.name).await.unwrap().is_some(),
            survives,
            "{policy:?}"
        );
    }
}

#[tokio::test]
async fn an_unreachable_machine_times_out_in_bootstrap_saying_why() {
    let cloud = SimCloud::new();
    let provider = sim(&cloud, SimConfig::default());
    let composer = Composer::builder(provider.clone())
        .decoupled(base())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(fast_settings())
        .build()
        .unwrap();
    let s = spec("unreachable");
    // Create it first, then cut it off before provisioning goes on.
    let r = Composer::builder(provider.clone())
        .build()
        .unwrap()
        .reconcile(&s, None)
        .await
        .unwrap();
    cloud
        .set_reachable(&r.machine.unwrap().provider_id, false)
        .unwrap();
    let e = composer
        .provision(&s, &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    let msg = e.to_string();
    assert!(
        msg.contains("did not finish bootstrapping within 400ms"),
        "{msg}"
    );
    assert!(
        msg.contains("Reachable=false") && msg.contains("link cut"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_boot_failure_fails_fast_with_the_provider_reason() {
    let cloud = SimCloud::new();
    let provider = sim(&cloud, SimConfig::default().with_boot_failure_rate(1.0));
    let composer = Composer::builder(provider)
        .settings(fast_settings())
        .build()
        .unwrap();
    let e = composer
        .provision(&spec("doomed"), &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permanent);
    assert!(e.to_string().contains("BootFailed"), "{e}");
}

#[tokio::test]
async fn fleets_run_with_bounded_concurrency_and_report_per_machine() {
    let cloud = SimCloud::new();
    let provider = sim(
        &cloud,
        SimConfig::default()
            .with_boot_latency(Duration::from_millis(5))
            .with_boot_jitter(Duration::from_millis(10)),
    );
    let composer = Composer::builder(provider)
        .coupled(base())
        .decoupled(app())
        .completion(Arc::new(SentinelFile::default()))
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(fast_settings())
        .build()
        .unwrap();
    let specs: Vec<_> = (0..20).map(|i| spec(&format!("node-{i:02}"))).collect();
    let results = composer
        .provision_fleet(
            &specs,
            NonZeroUsize::new(4).unwrap(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(results.len(), 20);
    for (r, s) in results.iter().zip(&specs) {
        assert_eq!(r.name, s.name, "results are in the order given");
        assert_eq!(r.outcome.as_ref().unwrap().machine.phase, Phase::Ready);
    }
    let names: Vec<_> = specs.iter().map(|s| s.name.clone()).collect();
    let gone = composer
        .deprovision_fleet(
            &names,
            NonZeroUsize::new(8).unwrap(),
            &CancellationToken::new(),
        )
        .await;
    assert!(gone.iter().all(|(_, r)| r.is_ok()));
}

#[tokio::test]
async fn duplicate_names_in_a_fleet_are_refused_before_anything_starts() {
    let cloud = SimCloud::new();
    let composer = Composer::builder(sim(&cloud, SimConfig::default()))
        .build()
        .unwrap();
    let specs = [spec("a"), spec("b"), spec("a")];
    let e = composer
        .provision_fleet(
            &specs,
            NonZeroUsize::new(2).unwrap(),
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec);
    assert_eq!(e.field(), Some("machines[2].name"));
    assert_eq!(cloud.api_calls(), 0);
}

#[tokio::test]
async fn builder_refuses_combinations_that_cannot_work() {
    let cloud = SimCloud::new();
    let e = Composer::builder(sim(&cloud, SimConfig::default()))
        .decoupled(app())
        .build()
        .unwrap_err();
    assert_eq!(e.field(), Some("layers[0]"));
    assert!(e.to_string().contains("needs a connector"), "{e}");
    let e = Composer::builder(sim(&cloud, SimConfig::default()))
        .coupled(base())
        .coupled(base())
        .build()
        .unwrap_err();
    assert_eq!(e.field(), Some("layers[1]"));
    let e = Composer::builder(sim(&cloud, SimConfig::default()))
        .completion(Arc::new(SentinelFile::default()))
        .build()
        .unwrap_err();
    assert_eq!(e.field(), Some("completion"));
    let e = Composer::builder(sim(&cloud, SimConfig::default()))
        .coupled(base())
        .decoupled(app())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .build()
        .unwrap_err();
    assert_eq!(e.field(), Some("completion"));
    assert!(
        e.to_string()
            .contains("coupled layer \"base\" and decoupled layer \"app\" need a completion check"),
        "{e}"
    );
    let mut settings = fast_settings();
    settings.deadlines.boot = Duration::ZERO;
    let e = Composer::builder(sim(&cloud, SimConfig::default()))
        .settings(settings)
        .build()
        .unwrap_err();
    assert_eq!(e.field(), Some("settings.deadlines.boot"));
}

#[tokio::test]
async fn progress_events_follow_the_machine() {
    let cloud = SimCloud::new();
    let composer = Composer::builder(sim(&cloud, SimConfig::default()))
        .decoupled(base())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(fast_settings())
        .build()
        .unwrap();
    let mut rx = composer.events().subscribe();
    composer
        .provision(&spec("watched"), &CancellationToken::new())
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        assert_eq!(ev.machine.as_str(), "watched");
        seen.push(ev.message);
    }
    assert!(seen[0].starts_with("created sim:///"), "{seen:?}");
    assert!(seen.contains(&"layer base applied".to_owned()), "{seen:?}");
    assert_eq!(seen.last().unwrap(), "phase Ready", "{seen:?}");
}

#[tokio::test]
async fn provision_can_run_on_a_spawned_task() {
    let cloud = SimCloud::new();
    let composer = Arc::new(
        Composer::builder(sim(&cloud, SimConfig::default()))
            .build()
            .unwrap(),
    );
    let c = composer.clone();
    let handle = tokio::spawn(async move {
        c.provision(&spec("spawned"), &CancellationToken::new())
            .await
    });
    assert_eq!(handle.await.unwrap().unwrap().machine.phase, Phase::Ready);
}

#[tokio::test]
async fn fleets_can_run_on_a_spawned_task() {
    let cloud = SimCloud::new();
    let composer = Arc::new(
        Composer::builder(sim(&cloud, SimConfig::default()))
            .build()
            .unwrap(),
    );
    let c = composer.clone();
    let handle = tokio::spawn(async move {
        let specs = [spec("s-1"), spec("s-2")];
        c.provision_fleet(
            &specs,
            NonZeroUsize::new(2).unwrap(),
            &CancellationToken::new(),
        )
        .await
    });
    let results = handle.await.unwrap().unwrap();
    assert!(results.iter().all(|r| r.outcome.is_ok()));
}

/// A layer that records how many machines it is applied to at the same time.
struct Gauge {
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
}

impl machine_core::Software for Gauge {
    fn name(&self) -> &str {
        "gauge"
    }
}

#[async_trait::async_trait]
impl machine_core::DecoupledSoftware for Gauge {
    async fn is_applied(
        &self,
        _: &machine_core::Machine,
        _: &dyn machine_core::Transport,
    ) -> machine_core::Result<bool> {
        Ok(false)
    }
    async fn apply(
        &self,
        _: &machine_core::Machine,
        _: &dyn machine_core::Transport,
    ) -> machine_core::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.max.fetch_max(n, SeqCst);
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.now.fetch_sub(1, SeqCst);
        Ok(())
    }
}

#[tokio::test]
async fn fleet_concurrency_is_bounded() {
    let cloud = SimCloud::new();
    let gauge = Arc::new(Gauge {
        now: 0.into(),
        max: 0.into(),
    });
    let composer = Composer::builder(sim(&cloud, SimConfig::default()))
        .decoupled(gauge.clone())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(fast_settings())
        .build()
        .unwrap();
    let specs: Vec<_> = (0..30).map(|i| spec(&format!("g-{i}"))).collect();
    let results = composer
        .provision_fleet(
            &specs,
            NonZeroUsize::new(3).unwrap(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(results.iter().all(|r| r.outcome.is_ok()));
    assert_eq!(gauge.max.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn sim_exec_output_keeps_the_tail_within_the_bound() {
    use machine_core::{Connector, ExecRequest};
    let cloud = SimCloud::new();
    let provider = sim(&cloud, SimConfig::default());
    let m = provider.create(&spec("chatty"), None).await.unwrap();
    cloud.on_exec(
        "yes",
        ExecOutput::new(Some(0), b"0123456789".to_vec(), vec![]),
    );
    let t = SimConnector::new(cloud.clone()).connect(&m).await.unwrap();
    let mut req = ExecRequest::new("yes");
    req.max_output = 4;
    let out = t.exec(&req).await.unwrap();
    assert_eq!(out.stdout, b"6789");
    assert!(out.truncated);
}

/// A coupled layer that puts a fixed host key on every machine.
struct PinnedKey;

impl machine_core::Software for PinnedKey {
    fn name(&self) -> &str {
        "hostkey"
    }
}

impl machine_core::CoupledSoftware for PinnedKey {
    fn user_data_parts(
        &self,
        _: &MachineSpec,
    ) -> machine_core::Result<Vec<machine_core::UserDataPart>> {
        Ok(vec![machine_core::UserDataPart::new(
            UserDataFormat::CloudConfig,
            "keys.yaml",
            "#cloud-config\n",
        )])
    }
    fn host_keys(&self, spec: &MachineSpec) -> machine_core::Result<Vec<String>> {
        Ok(vec![format!("ssh-ed25519 AAAAPINNED {}", spec.name)])
    }
}

/// Records the access info of every machine it is asked to connect to.
struct AccessSpy {
    inner: SimConnector,
    seen: std::sync::Mutex<Vec<machine_core::Access>>,
}

#[async_trait::async_trait]
impl machine_core::Connector for AccessSpy {
    async fn connect(
        &self,
        machine: &machine_core::Machine,
    ) -> machine_core::Result<Arc<dyn machine_core::Transport>> {
        self.seen.lock().unwrap().push(machine.access.clone());
        self.inner.connect(machine).await
    }
}

#[tokio::test]
async fn host_keys_of_coupled_layers_reach_the_connector() {
    let cloud = SimCloud::new();
    let spy = Arc::new(AccessSpy {
        inner: SimConnector::new(cloud.clone()),
        seen: Default::default(),
    });
    let composer = Composer::builder(sim(&cloud, SimConfig::default()))
        .coupled(Arc::new(PinnedKey))
        .decoupled(app())
        .completion(Arc::new(SentinelFile::default()))
        .connector(spy.clone())
        .settings(fast_settings())
        .build()
        .unwrap();
    let done = composer
        .provision(&spec("pinned"), &CancellationToken::new())
        .await
        .unwrap();
    assert!(
        done.machine
            .access
            .host_keys
            .contains(&"ssh-ed25519 AAAAPINNED pinned".to_owned())
    );
    let seen = spy.seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|a| {
        a.host_keys
            .contains(&"ssh-ed25519 AAAAPINNED pinned".to_owned())
    }));
}

#[tokio::test]
async fn reconciling_a_ready_machine_with_its_last_status_changes_nothing_and_connects_to_nothing()
{
    let cloud = SimCloud::new();
    let spy = Arc::new(AccessSpy {
        inner: SimConnector::new(cloud.clone()),
        seen: Default::default(),
    });
    let composer = Composer::builder(sim(&cloud, SimConfig::default()))
        .decoupled(base())
        .decoupled(app())
        .connector(spy.clone())
        .settings(fast_settings())
        .build()
        .unwrap();
    let s = spec("steady");
    let mut last = None;
    while last
        .as_ref()
        .is_none_or(|m: &machine_core::Machine| m.phase != Phase::Ready)
    {
        last = composer.reconcile(&s, last.as_ref()).await.unwrap().machine;
    }
    let ready = last.unwrap();
    let connects = spy.seen.lock().unwrap().len();
    tokio::time::sleep(Duration::from_millis(20)).await;
    for _ in 0..3 {
        let r = composer.reconcile(&s, Some(&ready)).await.unwrap();
        assert_eq!(r.action, Action::AwaitChange);
        assert_eq!(
            r.machine.as_ref(),
            Some(&ready),
            "an unchanged Ready machine reconciles to the same status, transition times included"
        );
    }
    assert_eq!(
        spy.seen.lock().unwrap().len(),
        connects,
        "no connection to a machine already Ready"
    );
    // Without the last status the composer verifies from scratch, and still keeps the
    // status the same apart from the transition times it cannot know.
    let fresh = composer.reconcile(&s, None).await.unwrap().machine.unwrap();
    assert_eq!(fresh.phase, Phase::Ready);
    assert_eq!(spy.seen.lock().unwrap().len(), connects + 1);
}

#[tokio::test]
async fn a_stopped_machine_is_neither_ready_nor_failed_and_is_looked_at_again() {
    let cloud = SimCloud::new();
    let provider = sim(&cloud, SimConfig::default());
    let composer = Composer::builder(provider.clone())
        .decoupled(base())
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(fast_settings())
        .build()
        .unwrap();
    let s = spec("stopped");
    let ready = composer
        .provision(&s, &CancellationToken::new())
        .await
        .unwrap()
        .machine;
    assert_eq!(ready.phase, Phase::Ready);

    provider
        .power(&ready.provider_id, machine_core::PowerOp::Stop)
        .await
        .unwrap();
    let r = composer.reconcile(&s, Some(&ready)).await.unwrap();
    let m = r.machine.unwrap();
    assert_eq!(m.phase, Phase::Stopped, "not Ready, not Failed");
    assert!(m.failure.is_none());
    let infra = m.condition("InfrastructureReady").unwrap();
    assert!(!infra.status);
    assert_eq!(infra.reason, machine_core::conditions::STOPPED);
    assert_eq!(
        r.action,
        Action::Requeue(Duration::from_millis(10)),
        "looked at again: someone may start it"
    );

    // Started again, the next reconcile verifies the software and reports Ready.
    provider
        .power(&ready.provider_id, machine_core::PowerOp::Start)
        .await
        .unwrap();
    let r = composer.reconcile(&s, Some(&m)).await.unwrap();
    let m = r.machine.unwrap();
    assert_eq!(m.phase, Phase::Ready);
    assert_eq!(r.action, Action::AwaitChange);
    assert!(m.condition("InfrastructureReady").unwrap().status);
}
