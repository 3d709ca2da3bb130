//! Benchmark: provision 10,000 machines on the simulator (zero latency) through the
//! composer, with a coupled step layer and a decoupled step layer, on one core.
//!
//! ```text
//! cargo run --release -p examples --example bench_composer [-- MACHINES [CONCURRENCY]]
//! ```
//!
//! Prints machines per second and peak RSS (VmHWM from /proc/self/status).

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{CancellationToken, Composer, MachineName, MachineSpec, SentinelFile};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let machines: usize = args
        .next()
        .map_or(Ok(10_000), |a| a.parse())
        .context("MACHINES")?;
    let concurrency: usize = args
        .next()
        .map_or(Ok(256), |a| a.parse())
        .context("CONCURRENCY")?;
    let concurrency = NonZeroUsize::new(concurrency).context("CONCURRENCY must be at least 1")?;

    // One thread: the figure is per core.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let cloud = SimCloud::new();
        let provider = Arc::new(SimProvider::new(cloud.clone(), SimConfig::default())?);
        let base = StepLayer::new(
            "base",
            vec![
                Step::write_file("/etc/motd", "hello\n"),
                Step::run("useradd -m ops"),
            ],
        )?;
        let app = StepLayer::new(
            "app",
            vec![
                Step::write_file_mode("/opt/app/run.sh", "#!/bin/sh\nexec app\n", 0o755),
                Step::run("systemctl start app"),
            ],
        )?;
        let composer = Composer::builder(provider)
            .coupled(Arc::new(base))
            .decoupled(Arc::new(app))
            .connector(Arc::new(SimConnector::new(cloud.clone())))
            .completion(Arc::new(SentinelFile::default()))
            .build()?;
        let specs = (0..machines)
            .map(|i| MachineName::new(format!("bench-{i:06}")).map(MachineSpec::new))
            .collect::<Result<Vec<_>, _>>()?;
        let rss_before = peak_rss_kib();

        let start = Instant::now();
        let results = composer
            .provision_fleet(&specs, concurrency, &CancellationToken::new())
            .await?;
        let elapsed = start.elapsed();

        let failed = results.iter().filter(|r| r.outcome.is_err()).count();
        anyhow::ensure!(failed == 0, "{failed} machines failed");
        let rate = machines as f64 / elapsed.as_secs_f64();
        println!("machines:          {machines}");
        println!("concurrency:       {concurrency}");
        println!("provider calls:    {}", cloud.api_calls());
        println!("wall time:         {:.3} s", elapsed.as_secs_f64());
        println!("machines/s:        {rate:.0} (one core)");
        println!(
            "peak RSS:          {:.1} MiB (before the run: {:.1} MiB)",
            peak_rss_kib() as f64 / 1024.0,
            rss_before as f64 / 1024.0
        );
        Ok(())
    })
}

/// Peak resident set size of this process in KiB, from /proc/self/status (0 when unknown).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
