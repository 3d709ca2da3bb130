//! Benchmark: provision 10,000 machines on the simulator (zero latency) through the
//! composer, with a coupled step layer and a decoupled step layer, on one core.
//!
//! ```text
//! cargo run --release -p examples --example bench_composer [-- [--runcmd N] MACHINES [CONCURRENCY]]
//! ```
//!
//! `--runcmd N` adds a third coupled layer, a cloud-config whose `runcmd` holds N
//! commands, so that the composer composes `runcmd` (strict part, markers); without it
//! (N = 0) the user data has no `runcmd`.
//!
//! Prints machines per second, the user data of one machine, the time to make the user
//! data alone (after the run, every machine's again) and peak RSS (VmHWM from
//! /proc/self/status).

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{CancellationToken, Composer, MachineName, MachineSpec, SentinelFile};

fn main() -> anyhow::Result<()> {
    let mut runcmd = 0usize;
    let mut rest = Vec::new();
    let mut all = std::env::args().skip(1);
    while let Some(a) = all.next() {
        if a == "--runcmd" {
            runcmd = all
                .next()
                .context("--runcmd N")?
                .parse()
                .context("--runcmd N")?;
        } else {
            rest.push(a);
        }
    }
    let mut args = rest.into_iter();
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
        let mut builder = Composer::builder(provider).coupled(Arc::new(base));
        if runcmd > 0 {
            let config = (0..runcmd).fold(CloudConfig::new(), |c, i| {
                c.with_runcmd(format!("systemctl enable --now bench-service-{i}.service"))
            });
            builder = builder.coupled(Arc::new(CloudConfigLayer::new("platform", config)?));
        }
        let composer = builder
            .decoupled(Arc::new(app))
            .connector(Arc::new(SimConnector::new(cloud.clone())))
            .completion(Arc::new(SentinelFile::default()))
            .build()?;
        let specs = (0..machines)
            .map(|i| MachineName::new(format!("bench-{i:06}")).map(MachineSpec::new))
            .collect::<Result<Vec<_>, _>>()?;
        let sample = composer.user_data(&specs[0])?.context("no user data")?;
        let rss_before = peak_rss_kib();

        let start = Instant::now();
        let results = composer
            .provision_fleet(&specs, concurrency, &CancellationToken::new())
            .await?;
        let elapsed = start.elapsed();

        let failed = results.iter().filter(|r| r.outcome.is_err()).count();
        anyhow::ensure!(failed == 0, "{failed} machines failed");
        // The user data alone (compose, assemble, fit), as the composer makes it for
        // each create, without the simulator.
        let compose_start = Instant::now();
        for spec in &specs {
            std::hint::black_box(composer.user_data(spec)?);
        }
        let compose = compose_start.elapsed();
        let rate = machines as f64 / elapsed.as_secs_f64();
        println!("machines:          {machines}");
        println!("concurrency:       {concurrency}");
        println!("runcmd commands:   {runcmd}");
        println!(
            "user data:         {} bytes per machine ({:?}, {:?})",
            sample.bytes.len(),
            sample.format,
            sample.encoding
        );
        println!(
            "user data alone:   {:.1} us per machine",
            compose.as_secs_f64() * 1e6 / machines as f64
        );
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
