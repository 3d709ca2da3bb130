//! provider-aws at fleet scale: the lifecycle of many machines (create with user data,
//! wait until running, delete, wait until gone) costs the minimal calls per machine plus
//! one ownership check, with name lookups shared across the fleet; and a fleet of 1,000
//! converges through EC2's token buckets (the proxy's throttling) with a bounded count
//! of `RequestLimitExceeded` and no failure.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use machine_core::{ErrorKind, MachineProvisioner, Phase, RetryPolicy, UserData, UserDataFormat};
use provider_aws::AwsProvider;

use common::Moto;
use common::proxy::{FaultProxy, Faults, Throttling};

/// 2 KiB of cloud-config, as the lifecycle sends.
fn user_data() -> UserData {
    let mut text = String::from("#cloud-config\nwrite_files:\n");
    while text.len() < 2048 {
        text.push_str("  - path: /etc/fleet/marker\n    content: fleet test padding\n");
    }
    UserData::new(UserDataFormat::CloudConfig, text.into_bytes())
}

/// One machine's lifecycle through the provider, each call retried as a controller
/// would (transient and throttled errors only): create, get until running, delete, get
/// until deleted.
async fn lifecycle(p: Arc<AwsProvider>, i: usize, data: Arc<UserData>) -> anyhow::Result<()> {
    // A controller keeps retrying what EC2 throttles.
    let retry = RetryPolicy::default()
        .with_max_retries(30)
        .with_max_elapsed(Some(Duration::from_secs(300)));
    let spec = common::spec(&format!("fleet-{i:04}"));
    let m = retry
        .retry("create", || p.create(&spec, Some(&data)))
        .await?;
    let mut polls = 0;
    while !retry
        .retry("get", || p.get(&m.provider_id))
        .await?
        .phase
        .is_running()
    {
        polls += 1;
        anyhow::ensure!(polls < 100, "{} never ran", spec.name);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    retry.retry("delete", || p.delete(&m.provider_id)).await?;
    loop {
        let now = retry.retry("get", || p.get(&m.provider_id)).await?;
        if now.phase == Phase::Deleted {
            return Ok(());
        }
        polls += 1;
        anyhow::ensure!(polls < 100, "{} never went away", spec.name);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `count` lifecycles, `width` at a time; the wall time and every machine's
/// failure (none when all converged).
async fn fleet_outcomes(
    p: &Arc<AwsProvider>,
    count: usize,
    width: usize,
) -> (Duration, Vec<anyhow::Error>) {
    let data = Arc::new(user_data());
    let start = Instant::now();
    let failures = stream::iter(0..count)
        .map(|i| lifecycle(p.clone(), i, data.clone()))
        .buffer_unordered(width)
        .filter_map(|r| async move { r.err() })
        .collect::<Vec<_>>()
        .await;
    (start.elapsed(), failures)
}

/// Runs `count` lifecycles, `width` at a time; the wall time. Panics if one failed.
async fn fleet(p: &Arc<AwsProvider>, count: usize, width: usize) -> Duration {
    let (wall, failures) = fleet_outcomes(p, count, width).await;
    if let Some(e) = failures.first() {
        panic!("{} machines failed, the first: {e:#}", failures.len());
    }
    wall
}

/// Every instance of `p`'s owner, in any state. Listing a thousand of them keeps moto
/// busy for seconds, so the listing is retried as a controller would.
async fn owned(p: &AwsProvider) -> Vec<machine_core::Machine> {
    RetryPolicy::default()
        .retry("list", || p.owned_instances())
        .await
        .expect("listing the owner's instances")
}

/// Instances of `p`'s owner that are not terminated or shutting down.
async fn live(p: &AwsProvider) -> usize {
    owned(p)
        .await
        .iter()
        .filter(|m| !matches!(m.phase, Phase::Deleting | Phase::Deleted))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_lifecycle_costs_five_calls_per_machine() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 21).await;
    let owner = common::owner("floor");
    // Host keys are not asked for: no console is read.
    let config = common::config_via_proxy(&proxy.endpoint, &owner)
        .host_key_discovery(false)
        .build()
        .unwrap();
    let p = Arc::new(AwsProvider::new(config).await.unwrap());
    let count = 100;
    let wall = fleet(&p, count, 64).await;
    let total = proxy.total_seen();
    let n = count as f64;
    let per = |action: &str| proxy.seen(action) as f64 / n;
    let filtered = proxy.filtered_describes() as f64 / n;
    eprintln!(
        "{count} machines in {wall:.1?}: per machine {:.2} calls: RunInstances {:.2}, \
         DescribeInstances {:.2} ({filtered:.2} tag-filtered), TerminateInstances {:.2}, \
         GetConsoleOutput {:.2}",
        total as f64 / n,
        per("RunInstances"),
        per("DescribeInstances"),
        per("TerminateInstances"),
        per("GetConsoleOutput"),
    );
    assert_eq!(live(&p).await, 0);
    assert_eq!(proxy.seen("RunInstances"), count);
    assert_eq!(proxy.seen("TerminateInstances"), count);
    assert_eq!(proxy.seen("GetConsoleOutput"), 0, "a console was read");
    assert!(
        filtered <= 0.1,
        "{filtered:.2} tag-filtered DescribeInstances per machine (at most 0.1)"
    );
    // The minimal four (launch, running, terminate, gone) and one ownership check.
    assert!(
        total as f64 <= 5.0 * n,
        "{:.2} calls per machine (at most 5)",
        total as f64 / n
    );
}

/// The fleet of issue 12 through EC2's own token buckets (sizes as documented, refills
/// ten times faster so that what takes EC2 about ten minutes, 1,000 launches at two a
/// second, takes one here). The provider's client paces itself after the first
/// `RequestLimitExceeded` (the SDK's adaptive rate limiter, src/client.rs), so the
/// refusals stay a small share of the calls and no machine runs out of retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_machines_converge_through_ec2_token_buckets() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 22).await;
    proxy.set_throttling(Some(Throttling::ec2(SPEED)));
    let owner = common::owner("buckets");
    let config = common::config(&proxy.endpoint, &owner)
        .host_key_discovery(false)
        .build()
        .unwrap();
    let p = Arc::new(AwsProvider::new(config).await.unwrap());
    let count = 1000;
    let (wall, failures) = fleet_outcomes(&p, count, 64).await;
    proxy.set_throttling(None);
    let throttled = proxy.total_throttled();
    eprintln!(
        "{count} machines in {wall:.1?}: {} calls, {throttled} RequestLimitExceeded \
         (RunInstances {}, TerminateInstances {}, DescribeInstances {}), {} failed",
        proxy.total_seen(),
        proxy.throttled("RunInstances"),
        proxy.throttled("TerminateInstances"),
        proxy.throttled("DescribeInstances"),
        failures.len(),
    );
    let permanent = failures
        .iter()
        .filter(|e| {
            e.downcast_ref::<machine_core::Error>()
                .is_some_and(|e| e.kind() == ErrorKind::Permanent)
        })
        .count();
    assert_eq!(permanent, 0, "permanent failures: {:?}", failures.first());
    assert!(
        failures.is_empty(),
        "{} machines did not converge, the first: {:#}",
        failures.len(),
        failures[0]
    );
    // Exactly one launch reached moto per machine: no duplicate.
    assert_eq!(proxy.forwarded("RunInstances"), count, "a launch too many");
    // What moto itself holds, asked without the proxy or the provider.
    let held = common::moto_instances(&moto.endpoint, &owner).await;
    let names: HashSet<&str> = held.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(held.len(), count, "instances of the owner (any state)");
    assert_eq!(names.len(), count, "one instance per name");
    let live: Vec<_> = held.iter().filter(|(_, s)| s != "terminated").collect();
    assert!(live.is_empty(), "instances left: {live:?}");
    assert!(
        throttled > 0,
        "the buckets never ran dry: the test proves nothing"
    );
    assert!(
        throttled <= MAX_THROTTLED,
        "{throttled} RequestLimitExceeded for {count} machines (at most {MAX_THROTTLED})"
    );
}

/// How much faster than EC2's the proxy's buckets refill.
const SPEED: f64 = 10.0;

/// The most `RequestLimitExceeded` answers the 1,000-machine fleet may get: a quarter
/// of the launches (runs saw 51 and 92).
const MAX_THROTTLED: usize = 250;
