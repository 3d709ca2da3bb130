//! Renders N machines' recipe layers (default 1,000): for each machine a 10-recipe
//! layer (account, packages, files, a directory, a line in a file, a systemd unit with
//! a drop-in, host name, time zone, sysctl, kernel modules) is built and checked, its
//! coupled cloud-init layer rendered and validated, and its decoupled steps planned and
//! hashed. One thread; prints layers per second.
//!
//! ```text
//! cargo run --release -p recipes --example bench_recipes [machines]
//! ```

use std::time::Instant;

use recipes::RecipeLayer;

// The layer the pinned-output test checks; its `KEY` is used there, not here.
#[allow(dead_code)]
#[path = "../bench/layer.rs"]
mod shared;

fn layer(i: usize) -> machine_core::Result<RecipeLayer> {
    RecipeLayer::new("base", shared::bench_layer(i))
}

/// This thread's CPU time in seconds (Linux's schedstat): the figure for "one core" on a
/// machine whose cores other work shares, where wall time would count the waits.
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |ns| ns / 1e9)
}

fn main() -> machine_core::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("the number of machines"))
        .unwrap_or(1000);
    // One warm-up round, so the figure is steady-state work.
    let mut bytes = 0usize;
    let mut steps = 0usize;
    for round in 0..2 {
        let start = Instant::now();
        let cpu_start = cpu_seconds();
        bytes = 0;
        steps = 0;
        let (mut t_build, mut t_coupled, mut t_decoupled, mut t_plan) = (0.0, 0.0, 0.0, 0.0);
        for i in 0..n {
            let t0 = Instant::now();
            let layer = layer(i)?;
            let t1 = Instant::now();
            let coupled = layer.coupled()?;
            bytes += coupled.render()?.len();
            let t2 = Instant::now();
            let planned = layer.steps();
            let t25 = Instant::now();
            steps += machine_core::steps::StepLayer::new("base", planned)?
                .steps()
                .len();
            let t3 = Instant::now();
            t_plan += (t25 - t2).as_secs_f64();
            t_build += (t1 - t0).as_secs_f64();
            t_coupled += (t2 - t1).as_secs_f64();
            t_decoupled += (t3 - t2).as_secs_f64();
        }
        let secs = start.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu_start;
        if round == 1 {
            println!(
                "per layer: build and check {:.1} us, coupled {:.1} us, decoupled {:.1} us (of which planning steps {:.1} us)",
                t_build / n as f64 * 1e6,
                t_coupled / n as f64 * 1e6,
                t_decoupled / n as f64 * 1e6,
                t_plan / n as f64 * 1e6
            );
            println!(
                "{n} machines' recipe layers (coupled rendered + decoupled planned): {secs:.3} s wall, {cpu:.3} s CPU; {:.0} layers per CPU second ({:.0}/s wall) on one thread; {} KiB of cloud-config, {steps} steps",
                n as f64 / cpu,
                n as f64 / secs,
                bytes / 1024
            );
        }
    }
    let _ = (bytes, steps);
    Ok(())
}
