//! The conformance suite against the simulator, bare and through every decorator.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use machine_core::conformance::{self, Clients, Fixture};
use machine_core::decorators::{FaultConfig, FaultInjecting, RateLimited, Retrying};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::{MachineProvisioner, MachineSpec, RetryPolicy};

/// The sim's fixture: any size reads back as given, its connector reaches running
/// machines, and its cloud refuses creates on the suite's demand.
fn fixture(cloud: &SimCloud) -> Fixture {
    let mut fx = Fixture::new("sim:///m-99999999", |name| {
        MachineSpec::new(name.clone())
            .with_image("debian-12")
            .with_size("small")
    });
    fx.sizes = vec!["small".into(), "Large-2x4096".into()];
    fx.connector = Some(Arc::new(SimConnector::new(cloud.clone())));
    fx.faults = Some(cloud.fault_hook());
    fx
}

fn sim(cloud: &SimCloud, config: SimConfig) -> Arc<SimProvider> {
    Arc::new(SimProvider::new(cloud.clone(), config).unwrap())
}

/// The provider, a replica and another owner, each made by `make(cloud, owner)`.
/// New instances for the crash and replica cases come from `make` too.
fn clients(
    cloud: &SimCloud,
    make: impl Fn(&SimCloud, SimConfig) -> Arc<dyn MachineProvisioner> + Clone + Send + Sync + 'static,
    config: SimConfig,
) -> Clients {
    let other = config.clone().with_owner(format!("{}-other", config.owner));
    let fresh = {
        let (cloud, config, make) = (cloud.clone(), config.clone(), make.clone());
        move || {
            let p = make(&cloud, config.clone());
            Box::pin(async move { p }) as futures_util::future::BoxFuture<'static, _>
        }
    };
    Clients::new(
        make(cloud, config.clone()),
        make(cloud, config),
        make(cloud, other),
    )
    .with_fresh(fresh)
}

fn bare(cloud: &SimCloud, config: SimConfig) -> Arc<dyn MachineProvisioner> {
    sim(cloud, config)
}

async fn setup() -> (Clients, Fixture, ()) {
    let cloud = SimCloud::new();
    let fx = fixture(&cloud);
    (clients(&cloud, bare, SimConfig::default()), fx, ())
}

// One test per case, as a third-party provider's tests would have them.
machine_core::conformance_tests!(setup);

#[tokio::test]
async fn sim_with_boot_and_delete_latency_passes_conformance() {
    let cloud = SimCloud::new();
    let config = SimConfig::default()
        .with_boot_latency(Duration::from_millis(30))
        .with_boot_jitter(Duration::from_millis(20))
        .with_delete_latency(Duration::from_millis(30));
    conformance::run_all(&clients(&cloud, bare, config), &fixture(&cloud)).await;
}

fn faulty(cloud: &SimCloud, config: SimConfig) -> Arc<dyn MachineProvisioner> {
    // Fixed seeds, a different one per client, so a failure can be replayed.
    static SEED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(7);
    let faults = FaultConfig::default()
        .with_error_rate(0.2)
        .with_throttle_rate(0.1)
        .with_retry_after(Some(Duration::from_millis(2)))
        .with_lost_response_rate(0.2)
        .with_latency_jitter(Duration::from_millis(2))
        .with_seed(Some(
            SEED.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        ));
    let policy = RetryPolicy::default()
        .with_max_retries(12)
        .with_initial_delay(Duration::from_millis(1))
        .with_max_delay(Duration::from_millis(5));
    Arc::new(Retrying::new(
        FaultInjecting::new(sim(cloud, config), faults).unwrap(),
        policy,
    ))
}

/// Retries over injected errors, throttling and lost responses keep every promise:
/// in particular a create whose answer was lost and was retried makes one machine.
#[tokio::test]
async fn retrying_over_faults_passes_conformance() {
    let cloud = SimCloud::new();
    // Lost responses are retried, a lost quota answer too: the hook's count of quota
    // answers would then be right to exceed one, so this run has no hook.
    let mut fx = fixture(&cloud);
    fx.faults = None;
    conformance::run_all(&clients(&cloud, faulty, SimConfig::default()), &fx).await;
}

#[tokio::test]
async fn rate_limited_passes_conformance() {
    let cloud = SimCloud::new();
    let limited = |cloud: &SimCloud, config| -> Arc<dyn MachineProvisioner> {
        Arc::new(RateLimited::new(
            sim(cloud, config),
            NonZeroU32::new(2000).unwrap(),
        ))
    };
    conformance::run_all(
        &clients(&cloud, limited, SimConfig::default()),
        &fixture(&cloud),
    )
    .await;
}

#[tokio::test]
async fn decorators_show_what_they_wrap() {
    let cloud = SimCloud::new();
    let p = Retrying::new(
        RateLimited::new(
            sim(&cloud, SimConfig::default()),
            NonZeroU32::new(5).unwrap(),
        ),
        RetryPolicy::default(),
    );
    assert_eq!(
        p.to_string(),
        "Retrying(RateLimited(sim(owner=machine-provisioning), 5/s))"
    );
}

#[tokio::test]
async fn faults_without_retries_surface_as_transient_errors() {
    let cloud = SimCloud::new();
    let p = FaultInjecting::new(
        sim(&cloud, SimConfig::default()),
        FaultConfig::default().with_error_rate(1.0),
    )
    .unwrap();
    let e = p
        .find(&machine_core::MachineName::new("a").unwrap())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), machine_core::ErrorKind::Transient);
    assert_eq!(
        cloud.api_calls(),
        0,
        "an injected fault must not reach the provider"
    );
}

#[test]
fn fault_rates_outside_zero_to_one_are_refused() {
    let cloud = SimCloud::new();
    let e = FaultInjecting::new(
        sim(&cloud, SimConfig::default()),
        FaultConfig::default().with_throttle_rate(1.5),
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("throttleRate"));
}

#[tokio::test]
async fn rate_limit_spaces_calls() {
    let cloud = SimCloud::new();
    let p = RateLimited::new(
        sim(&cloud, SimConfig::default()),
        NonZeroU32::new(50).unwrap(),
    );
    let name = machine_core::MachineName::new("a").unwrap();
    // The burst allowance is one second's worth (50); the 51st to 60th calls must wait
    // for new permits at 50/s, so 60 calls take at least 10 * 20 ms.
    let start = std::time::Instant::now();
    for _ in 0..60 {
        p.find(&name).await.unwrap();
    }
    assert!(
        start.elapsed() >= Duration::from_millis(180),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(cloud.api_calls(), 60);
}

#[tokio::test]
async fn sim_host_keys_are_well_formed_openssh_ed25519_keys() {
    use base64::Engine;
    let cloud = SimCloud::new();
    let p = sim(&cloud, SimConfig::default());
    let m = p
        .create(
            &MachineSpec::new(machine_core::MachineName::new("keys").unwrap()),
            None,
        )
        .await
        .unwrap();
    let key = &m.access.host_keys[0];
    let mut fields = key.split(' ');
    assert_eq!(fields.next(), Some("ssh-ed25519"));
    let blob = base64::engine::general_purpose::STANDARD
        .decode(fields.next().unwrap())
        .unwrap();
    assert_eq!(&blob[..4], &11u32.to_be_bytes());
    assert_eq!(&blob[4..15], b"ssh-ed25519");
    assert_eq!(&blob[15..19], &32u32.to_be_bytes());
    assert_eq!(blob.len(), 19 + 32);
}
