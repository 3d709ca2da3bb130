//! provider-aws at fleet scale: the lifecycle of many machines (create with user data,
//! wait until running, delete, wait until gone) costs the minimal calls per machine plus
//! one ownership check, with name lookups shared across the fleet.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt, TryStreamExt};
use machine_core::{MachineProvisioner, Phase, RetryPolicy, UserData, UserDataFormat};
use provider_aws::AwsProvider;

use common::Moto;
use common::proxy::{FaultProxy, Faults};

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

/// Runs `count` lifecycles, `width` at a time; the wall time.
async fn fleet(p: &Arc<AwsProvider>, count: usize, width: usize) -> Duration {
    let data = Arc::new(user_data());
    let start = Instant::now();
    stream::iter(0..count)
        .map(|i| lifecycle(p.clone(), i, data.clone()))
        .buffer_unordered(width)
        .try_collect::<Vec<()>>()
        .await
        .unwrap_or_else(|e| panic!("a machine failed: {e:#}"));
    start.elapsed()
}

/// Instances of `p`'s owner that are not terminated or shutting down.
async fn live(p: &AwsProvider) -> usize {
    p.owned_instances()
        .await
        .unwrap()
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
