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

use recipes::{
    Account, Directory, DropIn, File, Hostname, KernelModules, LineInFile, Package, Packages,
    RecipeLayer, Sysctl, SystemdUnit, Timezone,
};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBm9yXk2nL3sWq0cJ8pHh6YfTzQe1nM5bVrX2aD4uKgE ops@laptop";

fn layer(i: usize) -> machine_core::Result<RecipeLayer> {
    // Each machine's layer differs (host name, file content), so nothing is shared.
    RecipeLayer::new(
        "base",
        vec![
            Hostname::new(format!("web-{i}")).into(),
            Timezone::new("Europe/Paris").into(),
            Account::admin("ops", [KEY]).with_group("deploy").into(),
            Packages::apt([Package::pinned("nginx", "1.22.1-9"), Package::new("curl")]).into(),
            File::new("/etc/app/app.conf", format!("port = 8080\nid = {i}\n"))
                .with_mode(0o640)
                .with_owner("ops:deploy")
                .into(),
            Directory::new("/srv/app").with_owner("ops").into(),
            LineInFile::new("/etc/motd", format!("machine {i}")).into(),
            SystemdUnit::new(
                "app.service",
                "[Service]\nExecStart=/usr/bin/app\n[Install]\nWantedBy=multi-user.target\n",
            )
            .with_drop_in(DropIn::new("limits", "[Service]\nLimitNOFILE=65536\n"))
            .into(),
            Sysctl::new("90-app", [("net.ipv4.ip_forward", "1")]).into(),
            KernelModules::new("app", ["overlay", "br_netfilter"]).into(),
        ],
    )
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
