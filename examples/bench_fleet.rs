//! Benchmark: the fleet reconciler on the simulator.
//!
//! ```text
//! cargo run --release -p examples --example bench_fleet [-- --steady N --rollout M --boot-ms B]
//! ```
//!
//! 1. **Steady**: a set of N machines (default 10,000, a coupled and a decoupled step
//!    layer, a completion check) brought to Ready, then ten passes over it unchanged:
//!    provider calls and transport connections per pass, CPU per machine per pass, and
//!    peak RSS (VmHWM).
//! 2. **Rollout**: a set of M machines (default 1,000) whose coupled layer changes, with
//!    maxSurge 10% and maxUnavailable 0, on a simulator whose machines take B ms to boot
//!    (default 200): wall time against the floor the boot time sets (M / surge waves of
//!    one boot each), and the ratio.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_trait::async_trait;
use machine_core::fleet::{FleetReconciler, IntOrPercent, MachineSet, Rollout, conditions};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    Composer, ComposerSettings, Connector, Machine, MachineName, MachineSpec, SentinelFile,
    Transport,
};

/// CPU seconds this thread has used (the runtime is single-threaded), from Linux's
/// /proc/thread-self/schedstat.
fn cpu_seconds() -> anyhow::Result<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    let ns: u64 = text
        .split_whitespace()
        .next()
        .context("schedstat")?
        .parse()?;
    Ok(ns as f64 / 1e9)
}

/// The number after flag `name`, or `default`.
fn arg(name: &str, default: usize) -> anyhow::Result<usize> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args
            .get(i + 1)
            .context("a number after the flag")?
            .parse()?),
        None => Ok(default),
    }
}

/// Counts connections, then connects through the simulator.
struct Counting {
    inner: SimConnector,
    connects: AtomicU64,
}

#[async_trait]
impl Connector for Counting {
    async fn connect(&self, m: &Machine) -> machine_core::Result<Arc<dyn Transport>> {
        self.connects.fetch_add(1, Ordering::Relaxed);
        self.inner.connect(m).await
    }
}

fn composer(
    cloud: &SimCloud,
    connector: Arc<Counting>,
    base: &str,
    poll: Duration,
) -> anyhow::Result<Composer> {
    let provider = Arc::new(SimProvider::new(
        cloud.clone(),
        SimConfig::default().with_boot_latency(cloud_boot(cloud)),
    )?);
    let base = StepLayer::new("base", vec![Step::write_file("/etc/motd", base)])?;
    let app = StepLayer::new("app", vec![Step::run("systemctl start app")])?;
    Ok(Composer::builder(provider)
        .coupled(Arc::new(base))
        .decoupled(Arc::new(app))
        .connector(connector)
        .completion(Arc::new(SentinelFile::default()))
        .settings(ComposerSettings::default().with_poll_interval(poll))
        .build()?)
}

/// The boot latency the benchmark gives a cloud (kept beside it, so that every
/// provider of the cloud boots machines alike).
fn cloud_boot(_cloud: &SimCloud) -> Duration {
    Duration::from_millis(BOOT_MS.load(Ordering::Relaxed))
}

static BOOT_MS: AtomicU64 = AtomicU64::new(0);

async fn converge(r: &FleetReconciler, poll: Duration, max: usize) -> anyhow::Result<usize> {
    for step in 1..=max {
        let done = r.reconcile().await?;
        if !done
            .status
            .condition(conditions::PROGRESSING)
            .context("no condition")?
            .status
        {
            return Ok(step);
        }
        tokio::time::sleep(poll).await;
    }
    bail!("no convergence in {max} steps")
}

fn template() -> anyhow::Result<MachineSpec> {
    Ok(MachineSpec::new(MachineName::new("web")?).with_image("debian-12"))
}

fn main() -> anyhow::Result<()> {
    let steady = arg("--steady", 10_000)?;
    let rollout = arg("--rollout", 1_000)?;
    let boot_ms = arg("--boot-ms", 200)?;
    // One thread: the CPU figures are per core.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        // 1. Steady state.
        let cloud = SimCloud::new();
        let connector = Arc::new(Counting {
            inner: SimConnector::new(cloud.clone()),
            connects: AtomicU64::new(0),
        });
        let poll = Duration::from_millis(1);
        let set = MachineSet::new("web", u32::try_from(steady)?, template()?);
        let r = FleetReconciler::new(composer(&cloud, connector.clone(), "v1", poll)?, set)?
            .with_concurrency(256);
        let t = Instant::now();
        let steps = converge(&r, poll, 10_000).await?;
        println!(
            "steady: {steady} machines Ready in {steps} steps, {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let (calls0, connects0, cpu0) = (
            cloud.api_calls(),
            connector.connects.load(Ordering::Relaxed),
            cpu_seconds()?,
        );
        let passes = 10;
        for _ in 0..passes {
            let done = r.reconcile().await?;
            if !done.decisions.is_empty() {
                bail!("an unchanged fleet decided {:?}", done.decisions);
            }
        }
        let cpu = cpu_seconds()? - cpu0;
        println!(
            "steady: per pass {:.1} provider calls, {:.1} connections; {:.2} us of CPU per machine per pass; peak RSS {} KiB",
            (cloud.api_calls() - calls0) as f64 / passes as f64,
            (connector.connects.load(Ordering::Relaxed) - connects0) as f64 / passes as f64,
            cpu * 1e6 / (passes * steady) as f64,
            peak_rss_kib()?
        );

        // 2. Rollout of a coupled change.
        BOOT_MS.store(u64::try_from(boot_ms)?, Ordering::Relaxed);
        let cloud = SimCloud::new();
        let connector = Arc::new(Counting {
            inner: SimConnector::new(cloud.clone()),
            connects: AtomicU64::new(0),
        });
        let poll = Duration::from_millis(10);
        let strategy = Rollout::default()
            .with_max_surge(IntOrPercent::Percent(10))
            .with_max_unavailable(IntOrPercent::Int(0));
        let set = MachineSet::new("web", u32::try_from(rollout)?, template()?).with_rollout(strategy);
        let mut r =
            FleetReconciler::new(composer(&cloud, connector.clone(), "v1", poll)?, set.clone())?
                .with_concurrency(256);
        converge(&r, poll, 100_000).await?;
        r.update(composer(&cloud, connector.clone(), "v2", poll)?, set)?;
        let t = Instant::now();
        let steps = converge(&r, poll, 100_000).await?;
        let wall = t.elapsed().as_secs_f64();
        let surge = IntOrPercent::Percent(10).resolve(u32::try_from(rollout)?, true) as usize;
        let waves = rollout.div_ceil(surge);
        let floor = waves as f64 * boot_ms as f64 / 1000.0;
        println!(
            "rollout: {rollout} machines replaced in {wall:.2} s ({steps} steps); floor {waves} waves x {boot_ms} ms boot = {floor:.2} s; ratio {:.2}x",
            wall / floor
        );
        Ok(())
    })
}

fn peak_rss_kib() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("VmHWM value")?
        .parse()?)
}
