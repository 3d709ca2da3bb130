//! Benchmark of provider-aws against boto3 and a raw signed-HTTP client, on moto, in one
//! run (a fresh moto server per side).
//!
//! Each side takes N machines (default 500, concurrency 32) through the lifecycle of
//! issue 12: create with 2 KiB of user data, wait until running, terminate, wait until
//! gone. boto3 and the raw client make the minimal four calls per machine (RunInstances,
//! DescribeInstances by id until running, TerminateInstances, DescribeInstances by id
//! until terminated); the provider makes its own (name lookups batched across the
//! fleet, no check by id before deleting an instance it launched). moto's recorder counts the requests
//! each side sends; each side measures its own CPU time (getrusage of its own process,
//! moto excluded).
//!
//! ```sh
//! bash scripts/peers/30-moto.sh
//! cargo run --release -p provider-aws --example bench_aws -- --count 500 --concurrency 32
//! # what BENCHMARKS.md shows for 2026-12-03 (debug build, 200 machines)
//! cargo build -p provider-aws --example bench_aws && target/debug/examples/bench_aws --count 200 --concurrency 32
//! # the same with the provider on a multi-thread runtime
//! cargo run --release -p provider-aws --example bench_aws -- --count 500 --concurrency 32 --multi-thread
//! # the provider settling every create, as it must on moto with concurrent creators
//! cargo build -p provider-aws --example bench_aws && target/debug/examples/bench_aws --count 200 --concurrency 32 --tokens-ignored
//! # boto3 first, then the provider (each side has its own moto; this checks the order)
//! cargo run --release -p provider-aws --example bench_aws -- --count 500 --concurrency 32 --boto3-first
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[path = "../../bench/measure.rs"]
mod measure;
use anyhow::{Context, Result, bail};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use machine_core::{
    MachineName, MachineProvisioner, MachineSpec, Phase, SecretString, UserData, UserDataFormat,
};
use measure::{arg, cpu_seconds, process_cpu_seconds};
use provider_aws::{AwsConfig, AwsProvider, ClientTokens};

/// The tests' moto launcher: moto picks its own port, its log is drained.
#[path = "../tests/common/moto.rs"]
mod shared_moto;

/// One side's moto server and the file its recorder writes each request to.
struct Moto {
    server: shared_moto::Moto,
    recording: PathBuf,
}

impl Moto {
    fn addr(&self) -> SocketAddr {
        self.server.addr
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.recording);
    }
}

fn start_moto() -> Result<Moto> {
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    let recording = std::env::temp_dir().join(format!(
        "bench-aws-recording-{}-{}.jsonl",
        std::process::id(),
        STARTED.fetch_add(1, Ordering::Relaxed)
    ));
    let path = recording.to_str().context("temp dir is not UTF-8")?;
    let server = shared_moto::Moto::start_with(&[("MOTO_RECORDER_FILEPATH", path)]);
    Ok(Moto { server, recording })
}

/// One POST to moto's control API (reset, recorder), with no body.
fn moto_api(addr: SocketAddr, path: &str) -> Result<()> {
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    if !answer.starts_with("HTTP/1.1 2") && !answer.starts_with("HTTP/1.0 2") {
        bail!("moto {path}: {}", answer.lines().next().unwrap_or(""));
    }
    Ok(())
}

fn recorded_calls(path: &Path) -> Result<usize> {
    Ok(std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count())
}

/// CPU seconds moto's process has used so far: the server side of the same calls, to
/// see whether one client's requests cost moto more.
fn moto_cpu_seconds(moto: &Moto) -> Result<f64> {
    process_cpu_seconds(moto.server.pid())
}

struct Figures {
    wall: f64,
    cpu: f64,
    moto_cpu: f64,
    calls: usize,
}

async fn bench_rust(moto: &Moto, count: usize, concurrency: usize) -> Result<Figures> {
    let config = AwsConfig::builder()
        .region("us-east-1")
        .endpoint_url(format!("http://{}", moto.addr()))
        .static_credentials("testing", SecretString::from("testing"))
        .owner("bench-rust")
        .image("ami-760aaa0f")
        // Host keys are not asked for (the other sides read no consoles either).
        .host_key_discovery(false)
        // EC2 honours client tokens and moto does not; each name here has one creator,
        // so no launch can race another, and the provider takes the path it takes on
        // EC2 (no settlement unless a launch ends near a token epoch's end).
        // `--tokens-ignored` measures the path for moto (every create settles).
        .client_tokens(if std::env::args().any(|a| a == "--tokens-ignored") {
            ClientTokens::Ignored
        } else {
            ClientTokens::Honoured
        })
        .build()?;
    let p = Arc::new(AwsProvider::new(config).await?);
    let data = Arc::new(UserData::new(
        UserDataFormat::CloudConfig,
        [&b"#cloud-config\n"[..], &b"# padding\n".repeat(203)].concat(),
    ));
    moto_api(moto.addr(), "/moto-api/recorder/reset-recording")?;
    moto_api(moto.addr(), "/moto-api/recorder/start-recording")?;
    let cpu0 = cpu_seconds()?;
    let moto0 = moto_cpu_seconds(moto)?;
    let start = Instant::now();
    stream::iter(0..count)
        .map(|i| {
            let p = p.clone();
            let data = data.clone();
            async move {
                let spec = MachineSpec::new(MachineName::new(format!("bench-{i:04}"))?)
                    .with_size("t3.micro");
                let m = p.create(&spec, Some(&data)).await?;
                while !p.get(&m.provider_id).await?.phase.is_running() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                p.delete(&m.provider_id).await?;
                while p.get(&m.provider_id).await?.phase != Phase::Deleted {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds()? - cpu0;
    let moto_cpu = moto_cpu_seconds(moto)? - moto0;
    moto_api(moto.addr(), "/moto-api/recorder/stop-recording")?;
    Ok(Figures {
        wall,
        cpu,
        moto_cpu,
        calls: recorded_calls(&moto.recording)?,
    })
}

/// The boto3 side, or with `raw` the raw signed-HTTP client (same script).
fn bench_python(moto: &Moto, count: usize, concurrency: usize, raw: bool) -> Result<Figures> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/boto3_bench.py");
    moto_api(moto.addr(), "/moto-api/recorder/reset-recording")?;
    moto_api(moto.addr(), "/moto-api/recorder/start-recording")?;
    let moto0 = moto_cpu_seconds(moto)?;
    let out = Command::new(shared_moto::venv().join("bin/python"))
        .arg(&script)
        .args(["--endpoint", &format!("http://{}", moto.addr())])
        .args(["--count", &count.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .args(raw.then_some("--raw"))
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let moto_cpu = moto_cpu_seconds(moto)? - moto0;
    moto_api(moto.addr(), "/moto-api/recorder/stop-recording")?;
    if !out.status.success() {
        bail!("{} failed: {}", script.display(), out.status);
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .with_context(|| format!("boto3 bench printed {line:?}"))?;
    let f = |k: &str| v[k].as_f64().with_context(|| format!("no {k} in {line}"));
    let own_calls = f("calls")? as usize;
    let recorded = recorded_calls(&moto.recording)?;
    if own_calls != recorded {
        eprintln!("note: boto3 counted {own_calls} calls, moto recorded {recorded}");
    }
    Ok(Figures {
        wall: f("wall_s")?,
        cpu: f("cpu_s")?,
        moto_cpu,
        calls: recorded,
    })
}

fn main() -> Result<()> {
    // A current-thread runtime by default: the calls are I/O-bound, and one thread saves
    // the cross-thread wake-ups a work-stealing runtime pays per response (a controller
    // embedding the provider chooses its own runtime; `--multi-thread` measures the other).
    let multi = std::env::args().any(|a| a == "--multi-thread");
    let runtime = if multi {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    };
    runtime.block_on(run(multi))
}

/// A moto server of its own for one side, warmed up (its first EC2 request loads the
/// backend) and reset, so that neither side inherits the other's moto process.
async fn fresh_moto() -> Result<Moto> {
    let moto = start_moto()?;
    bench_rust(&moto, 4, 4).await?;
    moto_api(moto.addr(), "/moto-api/reset")?;
    Ok(moto)
}

async fn run(multi: bool) -> Result<()> {
    let count = arg("--count", 500)?;
    let concurrency = arg("--concurrency", 32)?;
    println!(
        "{count} machines, concurrency {concurrency}, a fresh moto server per side; provider-aws on a {} tokio runtime",
        if multi {
            "multi-thread"
        } else {
            "current-thread"
        }
    );

    // `--boto3-first` runs the Python sides first, to see whether order favours a side.
    let (rust, boto, raw) = if std::env::args().any(|a| a == "--boto3-first") {
        let boto = bench_python(&fresh_moto().await?, count, concurrency, false)?;
        let raw = bench_python(&fresh_moto().await?, count, concurrency, true)?;
        (
            bench_rust(&fresh_moto().await?, count, concurrency).await?,
            boto,
            raw,
        )
    } else {
        let rust = bench_rust(&fresh_moto().await?, count, concurrency).await?;
        let boto = bench_python(&fresh_moto().await?, count, concurrency, false)?;
        let raw = bench_python(&fresh_moto().await?, count, concurrency, true)?;
        (rust, boto, raw)
    };

    println!();
    println!(
        "{:<14} {:>9} {:>9} {:>7} {:>10} {:>14} {:>15}",
        "client", "wall s", "cpu s", "calls", "per mach.", "cpu ms/call", "moto ms/call"
    );
    for (name, f) in [
        ("provider-aws", &rust),
        ("boto3", &boto),
        ("raw client", &raw),
    ] {
        println!(
            "{name:<14} {:>9.2} {:>9.2} {:>7} {:>10.2} {:>14.3} {:>15.3}",
            f.wall,
            f.cpu,
            f.calls,
            f.calls as f64 / count as f64,
            1e3 * f.cpu / f.calls.max(1) as f64,
            1e3 * f.moto_cpu / f.calls.max(1) as f64
        );
    }
    let per_call = |f: &Figures| f.cpu / f.calls.max(1) as f64;
    println!();
    println!(
        "provider-aws / raw client: wall {:.2}x (target <= 1.3x); / boto3: wall {:.2}x, cpu per call {:.2}x",
        rust.wall / raw.wall,
        rust.wall / boto.wall,
        per_call(&rust) / per_call(&boto)
    );
    Ok(())
}
