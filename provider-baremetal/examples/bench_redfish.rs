//! Benchmark of provider-baremetal's Redfish provider against the sushy client library
//! (OpenStack Ironic's Redfish library), on sushy-tools' emulator, in one run (a fresh
//! emulator per side).
//!
//! Each side takes N machines (default 100, concurrency 16) from a pool of N fake
//! systems through claim + insert media + power on + release: the provider's `create`
//! then `delete`; the sushy script the same Redfish calls (see
//! `bench/sushy_bench.py`). Both wait alike: sushy-tools applies a reset 1-11 s after it
//! answers, and release lets the pending power-on land, forces the server off and waits
//! until it shows Off before it ejects and releases; both poll PowerState every 0.25 s.
//! The wall time is therefore mostly the emulator's random delays, the same law on both
//! sides. The seeds are the same bytes on both sides (the provider's NoCloud ISO with
//! the same user data), each side serving its own from its own process. The emulator's
//! log counts the requests each side sends; each side measures its own CPU time
//! (getrusage of its own process, the emulator excluded).
//!
//! ```sh
//! WITH_BENCH_PEERS=1 bash scripts/peers/60-sushy-tools.sh
//! cargo run --release -p provider-baremetal --example bench_redfish -- --count 100 --concurrency 16
//! # sushy first, then the provider (each side has its own emulator; this checks the order)
//! cargo run --release -p provider-baremetal --example bench_redfish -- --sushy-first
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

#[path = "../../bench/measure.rs"]
mod measure;
use anyhow::{Context, Result, bail};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use machine_core::{MachineName, MachineProvisioner, MachineSpec, UserData, UserDataFormat};
use measure::{arg, cpu_seconds, process_cpu_seconds};
use provider_baremetal::redfish::seed_iso::Seed;
use provider_baremetal::{RedfishPoolConfig, RedfishProvider};
use provider_http::HttpSettings;

/// The tests' sushy-emulator launcher: fake driver, own state directory, free port.
#[path = "../tests/common/sushy.rs"]
#[allow(dead_code)]
mod sushy;

use sushy::Sushy;

/// The virtualenv `WITH_BENCH_PEERS=1 scripts/peers/60-sushy-tools.sh` installs the
/// sushy client library into.
fn client_venv() -> PathBuf {
    sushy::venv().with_file_name("sushy-client")
}

/// The user data both sides seed: a 2 KiB cloud-config.
fn user_data() -> UserData {
    UserData::new(
        UserDataFormat::CloudConfig,
        [&b"#cloud-config\n"[..], &b"# padding\n".repeat(203)].concat(),
    )
}

/// The requests sushy-emulator has logged so far (werkzeug: one line per request, the
/// method coloured when it is not a GET, hence no match on `"POST`).
fn logged_calls(sushy: &Sushy) -> usize {
    sushy
        .log()
        .lines()
        .filter(|l| l.starts_with("127.0.0.1 - ") && l.contains(" HTTP/1."))
        .count()
}

/// CPU seconds the emulator has used so far: the server side of the same calls.
fn sushy_cpu_seconds(sushy: &Sushy) -> Result<f64> {
    process_cpu_seconds(sushy.pid())
}

struct Figures {
    wall: f64,
    cpu: f64,
    sushy_cpu: f64,
    calls: usize,
}

/// A pool YAML of every fake system of `sushy` (plain HTTP, so `insecure`).
fn pool_yaml(sushy: &Sushy, claim_dir: &Path) -> String {
    let mut y = format!(
        "owner: bench-rust\nclaimDir: {}\nservers:\n",
        claim_dir.display()
    );
    for (i, s) in sushy.systems.iter().enumerate() {
        y.push_str(&format!(
            "  - name: s{i}\n    bmc: {}\n    systemId: {}\n    insecure: true\n    \
             credentials: {{username: admin, password: bench}}\n",
            sushy.endpoint, s.id
        ));
    }
    y
}

async fn bench_rust(sushy: &Sushy, count: usize, concurrency: usize) -> Result<Figures> {
    let claims = tempfile::tempdir()?;
    let config = RedfishPoolConfig::from_yaml(&pool_yaml(sushy, claims.path()))?;
    let p = Arc::new(RedfishProvider::new(config, &HttpSettings::default()).await?);
    let data = Arc::new(user_data());
    let calls0 = logged_calls(sushy);
    let cpu0 = cpu_seconds()?;
    let sushy0 = sushy_cpu_seconds(sushy)?;
    let start = Instant::now();
    stream::iter(0..count)
        .map(|i| {
            let p = p.clone();
            let data = data.clone();
            async move {
                let spec = MachineSpec::new(MachineName::new(format!("bench-{i:04}"))?);
                let m = p.create(&spec, Some(&data)).await?;
                p.delete(&m.provider_id).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds()? - cpu0;
    let sushy_cpu = sushy_cpu_seconds(sushy)? - sushy0;
    Ok(Figures {
        wall,
        cpu,
        sushy_cpu,
        calls: logged_calls(sushy) - calls0,
    })
}

/// The sushy side: the same seeds written to a directory its own server serves.
fn bench_python(sushy: &Sushy, count: usize, concurrency: usize) -> Result<Figures> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/sushy_bench.py");
    let python = client_venv().join("bin/python");
    if !python.exists() {
        bail!(
            "no sushy client venv at {}: run WITH_BENCH_PEERS=1 bash scripts/peers/60-sushy-tools.sh",
            client_venv().display()
        );
    }
    let work = tempfile::tempdir()?;
    let (seeds, claims) = (work.path().join("seeds"), work.path().join("claims"));
    std::fs::create_dir_all(&seeds)?;
    std::fs::create_dir_all(&claims)?;
    let data = user_data();
    for i in 0..count {
        let name = format!("bench-{i:04}");
        let meta = format!("instance-id: {name}\nlocal-hostname: {name}\n");
        let iso = Seed {
            user_data: &data.bytes,
            meta_data: meta.as_bytes(),
            network_config: None,
        }
        .to_iso()?;
        std::fs::write(seeds.join(format!("{name}.iso")), iso)?;
    }
    let systems = work.path().join("systems");
    let ids: Vec<&str> = sushy.systems.iter().map(|s| s.id.as_str()).collect();
    std::fs::write(&systems, ids.join("\n"))?;
    let calls0 = logged_calls(sushy);
    let sushy0 = sushy_cpu_seconds(sushy)?;
    let out = Command::new(&python)
        .arg(&script)
        .args(["--endpoint", &sushy.endpoint])
        .arg("--systems")
        .arg(&systems)
        .arg("--seeds")
        .arg(&seeds)
        .arg("--claims")
        .arg(&claims)
        .args(["--count", &count.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let sushy_cpu = sushy_cpu_seconds(sushy)? - sushy0;
    if !out.status.success() {
        bail!("{} failed: {}", script.display(), out.status);
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .with_context(|| format!("sushy bench printed {line:?}"))?;
    let f = |k: &str| v[k].as_f64().with_context(|| format!("no {k} in {line}"));
    Ok(Figures {
        wall: f("wall_s")?,
        cpu: f("cpu_s")?,
        sushy_cpu,
        calls: logged_calls(sushy) - calls0,
    })
}

fn main() -> Result<()> {
    // A current-thread runtime, as provider-aws's benchmark: the calls are I/O-bound.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> Result<()> {
    let count = arg("--count", 100)?;
    let concurrency = arg("--concurrency", 16)?;
    println!(
        "{count} machines on {count} fake systems, concurrency {concurrency}, a fresh sushy-emulator per side; provider on a current-thread tokio runtime"
    );
    let (rust, py) = if std::env::args().any(|a| a == "--sushy-first") {
        let py = bench_python(&Sushy::start(count), count, concurrency)?;
        (
            bench_rust(&Sushy::start(count), count, concurrency).await?,
            py,
        )
    } else {
        let rust = bench_rust(&Sushy::start(count), count, concurrency).await?;
        (
            rust,
            bench_python(&Sushy::start(count), count, concurrency)?,
        )
    };

    println!();
    println!(
        "{:<20} {:>9} {:>9} {:>7} {:>10} {:>14} {:>16}",
        "client", "wall s", "cpu s", "calls", "per mach.", "cpu ms/call", "sushy ms/call"
    );
    for (name, f) in [("provider-baremetal", &rust), ("sushy (Python)", &py)] {
        println!(
            "{name:<20} {:>9.2} {:>9.2} {:>7} {:>10.2} {:>14.3} {:>16.3}",
            f.wall,
            f.cpu,
            f.calls,
            f.calls as f64 / count as f64,
            1e3 * f.cpu / f.calls.max(1) as f64,
            1e3 * f.sushy_cpu / f.calls.max(1) as f64
        );
    }
    let per_call = |f: &Figures| f.cpu / f.calls.max(1) as f64;
    println!();
    println!(
        "provider-baremetal / sushy: wall {:.2}x (target <= 1.0x), cpu per call {:.2}x (target <= 0.3x)",
        rust.wall / py.wall,
        per_call(&rust) / per_call(&py)
    );
    Ok(())
}
