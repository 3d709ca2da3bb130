//! Deadlines and cancellation of `provision` and `deprovision`, on tokio's paused clock:
//! each phase's time counts from when that phase began, the error names the phase that
//! overran, cancellation is seen at once, and durations a user can write never panic.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::{
    CancellationToken, Composer, ComposerSettings, Deadlines, DecoupledSoftware, ErrorKind,
    FailurePolicy, Machine, MachineName, MachineProvisioner, MachineSpec, Phase, Result, Software,
    Transport,
};
use tokio::time::Instant;

fn spec(name: &str) -> MachineSpec {
    MachineSpec::new(MachineName::new(name).unwrap())
}

fn settings(create: u64, boot: u64, bootstrap: u64, poll: Duration) -> ComposerSettings {
    ComposerSettings::default()
        .with_deadlines(
            Deadlines::default()
                .with_create(Duration::from_secs(create))
                .with_boot(Duration::from_secs(boot))
                .with_bootstrap(Duration::from_secs(bootstrap))
                .with_delete(Duration::from_secs(600)),
        )
        .with_poll_interval(poll)
        .with_on_failure(FailurePolicy::KeepForDebugging)
}

/// A decoupled layer whose apply takes `takes` of (tokio) time.
struct Slow {
    takes: Duration,
}

impl Software for Slow {
    fn name(&self) -> &str {
        "slow"
    }
}

#[async_trait]
impl DecoupledSoftware for Slow {
    async fn is_applied(&self, _: &Machine, _: &dyn Transport) -> Result<bool> {
        Ok(false)
    }
    async fn apply(&self, _: &Machine, _: &dyn Transport) -> Result<()> {
        tokio::time::sleep(self.takes).await;
        Ok(())
    }
}

fn composer(cloud: &SimCloud, layer_takes: Duration, settings: ComposerSettings) -> Composer {
    // Machines take 5 s (of tokio time) to boot, so there is a wait after creation.
    let config = SimConfig::default().with_boot_latency(Duration::from_secs(5));
    let provider = Arc::new(SimProvider::new(cloud.clone(), config).unwrap());
    Composer::builder(provider)
        .decoupled(Arc::new(Slow { takes: layer_takes }))
        .connector(Arc::new(SimConnector::new(cloud.clone())))
        .settings(settings)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_long_layer_is_charged_to_bootstrap_not_to_create() {
    // Created in microseconds, then a 150 s layer: well within the 20 min bootstrap
    // deadline, though longer than the 2 min create deadline.
    let cloud = SimCloud::new();
    let c = composer(
        &cloud,
        Duration::from_secs(150),
        ComposerSettings::default(),
    );
    let done = c
        .provision(&spec("long-layer"), &CancellationToken::new())
        .await
        .expect("a 150 s layer fits the bootstrap deadline");
    assert_eq!(done.machine.phase, Phase::Ready);
    let t = done.timeline;
    assert!(
        t.bootstrap_time().unwrap() >= Duration::from_secs(150),
        "{t}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_create_deadline_shorter_than_the_poll_interval_still_provisions() {
    let cloud = SimCloud::new();
    let c = composer(
        &cloud,
        Duration::from_millis(1),
        settings(1, 600, 1200, Duration::from_secs(2)),
    );
    let done = c
        .provision(&spec("short-create"), &CancellationToken::new())
        .await
        .expect("the create deadline covers creation only, not the wait after it");
    assert_eq!(done.machine.phase, Phase::Ready);
}

#[tokio::test(start_paused = true)]
async fn an_overrunning_layer_fails_naming_the_bootstrap_deadline() {
    let cloud = SimCloud::new();
    let c = composer(
        &cloud,
        Duration::from_secs(150),
        settings(1, 10, 100, Duration::from_secs(2)),
    );
    let start = Instant::now();
    let e = c
        .provision(&spec("overrun"), &CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    let msg = e.to_string();
    assert!(
        msg.contains("did not finish bootstrapping within 1m 40s")
            && msg.contains("deadlines.bootstrap"),
        "{msg}"
    );
    // Running at 5-6 s (boot time, seen at the next 2 s poll), then 100 s of bootstrap.
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(105) && took < Duration::from_secs(107),
        "timed out after {took:?}, not 100 s after the machine ran"
    );
}

#[tokio::test(start_paused = true)]
async fn provision_sees_a_cancel_within_100ms_even_mid_layer() {
    let cloud = SimCloud::new();
    let c = composer(
        &cloud,
        Duration::from_secs(3600),
        settings(60, 60, 7200, Duration::from_secs(60)),
    );
    let cancel = CancellationToken::new();
    let s = spec("cancel-me");
    let start = Instant::now();
    let (r, ()) = tokio::join!(c.provision(&s, &cancel), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
    });
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Cancelled);
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn deprovision_sees_a_cancel_within_100ms_not_after_the_poll_interval() {
    let cloud = SimCloud::new();
    // Deleting takes ten real minutes in the simulator, so the machine stays Deleting.
    let provider = Arc::new(
        SimProvider::new(
            cloud.clone(),
            SimConfig::default().with_delete_latency(Duration::from_secs(600)),
        )
        .unwrap(),
    );
    let c = Composer::builder(provider.clone())
        .settings(settings(60, 60, 60, Duration::from_secs(60)))
        .build()
        .unwrap();
    let s = spec("slow-delete");
    c.provision(&s, &CancellationToken::new()).await.unwrap();
    let cancel = CancellationToken::new();
    let start = Instant::now();
    let (r, ()) = tokio::join!(c.deprovision(&s.name, &cancel), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
    });
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Cancelled);
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "cancel seen after {:?}",
        start.elapsed()
    );
    let m = provider.find(&s.name).await.unwrap().unwrap();
    assert_eq!(m.phase, Phase::Deleting);
}

#[test]
fn durations_too_large_to_add_to_an_instant_are_refused_naming_the_field() {
    let huge = Duration::from_secs(u64::MAX);
    for field in [
        "deadlines.create",
        "deadlines.boot",
        "deadlines.bootstrap",
        "deadlines.delete",
        "pollInterval",
    ] {
        let mut s = ComposerSettings::default();
        match field {
            "deadlines.create" => s.deadlines.create = huge,
            "deadlines.boot" => s.deadlines.boot = huge,
            "deadlines.bootstrap" => s.deadlines.bootstrap = huge,
            "deadlines.delete" => s.deadlines.delete = huge,
            _ => s.poll_interval = huge,
        }
        let e = s.validate().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some(field), "{e}");
        assert!(
            e.to_string().contains("longer than the largest allowed"),
            "{e}"
        );
    }
    let e = ComposerSettings::from_yaml(
        "deadlines: {create: 18446744073709551615s, boot: 1m, bootstrap: 1m, delete: 1m}\n",
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    let e = ComposerSettings::from_yaml("pollInterval: 2h\n").unwrap_err();
    assert_eq!(e.field(), Some("pollInterval"), "{e}");
}

#[tokio::test]
async fn a_composer_built_from_huge_durations_is_refused_before_anything_runs() {
    let cloud = SimCloud::new();
    let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default()).unwrap());
    let mut s = ComposerSettings::default();
    s.deadlines.delete = Duration::MAX;
    let e = Composer::builder(provider).settings(s).build().unwrap_err();
    assert_eq!(e.field(), Some("settings.deadlines.delete"), "{e}");
    assert_eq!(cloud.api_calls(), 0);
}
