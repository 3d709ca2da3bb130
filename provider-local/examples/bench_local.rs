//! Create-to-Ready on real local machines, for 1 machine and for N in parallel
//! (default 20), coupled (cloud-config in user data, cloud-init's status as the
//! completion check over SSH), coupled by reference (the same layer, the machine given
//! only a stub that fetches the document from a served-once HTTPS store on the run's
//! bridge) and decoupled (the same work as steps over SSH), against the floor: the same
//! user data through plain cloud-init stages in a chroot (an overlay over the same root,
//! no network, no sshd), in the same run. Prints the Ready p50 ratio of by reference to
//! inline; with R (default 1), the coupled rounds inline and by reference alternate R
//! times each and the ratio is of their medians.
//!
//! ```text
//! cargo run --release -p provider-local --example bench_local [-- N [R]]
//! ```
//!
//! As root, after scripts/peers/40-local-root.sh. Peak memory is the largest sum of
//! resident memory of one machine's processes, sampled every 50 ms in the 1-machine
//! rounds.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, CloudInitStatus, User, WriteFile};
use bootstrap_ssh::{Auth, HostKeyPolicy, SshConfig, SshConnector};
use bootstrap_store::{HttpsStore, HttpsStoreConfig, Network};
use machine_core::bootstrap_data::ByReference;
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, Composer, ComposerSettings, MachineName, MachineSpec, SshAccess, Timeline,
};
use provider_local::{LocalConfig, LocalProvider};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Tears the run's machines, bridge and run directory down, also on failure.
struct Teardown(Arc<LocalProvider>);

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Err(e) = self.0.teardown() {
            eprintln!("teardown failed: {e}");
        }
    }
}

fn cloud_config() -> Res<CloudConfig> {
    Ok(CloudConfig::new()
        .with_user(User::new("ops"))
        .with_file(WriteFile::new("/etc/app.conf", "port=8080\n"))
        .with_runcmd("touch /var/lib/app-ready"))
}

fn steps() -> Res<StepLayer> {
    Ok(StepLayer::new(
        "app",
        vec![
            Step::run("id ops >/dev/null 2>&1 || useradd --create-home ops"),
            Step::write_file("/etc/app.conf", "port=8080\n"),
            Step::run("touch /var/lib/app-ready"),
        ],
    )?)
}

struct Round {
    wall: Duration,
    timelines: Vec<Timeline>,
    peak_rss_kib: u64,
}

/// Sums VmRSS of the processes in network namespace `ns`.
fn rss_in_netns(ns: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(ns) else {
        return 0;
    };
    let want = format!("net:[{}]", meta.ino());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|l| l.to_string_lossy() == want)
        })
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum()
}

async fn round(
    composer: &Composer,
    prefix: &str,
    n: usize,
    ssh: &SshAccess,
    bridge: &str,
) -> Res<Round> {
    let specs: Vec<MachineSpec> = (0..n)
        .map(|i| {
            let mut s = MachineSpec::new(MachineName::new(format!("{prefix}-{i}"))?);
            s.ssh = Some(ssh.clone());
            Ok(s)
        })
        .collect::<Res<_>>()?;
    // Sample the first machine's memory (its slot is 1 in a fresh run directory).
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        let ns = PathBuf::from(format!("/run/netns/{bridge}-1"));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_in_netns(&ns), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let start = Instant::now();
    let out = composer
        .provision_fleet(
            &specs,
            NonZeroUsize::new(n.max(1)).unwrap_or(NonZeroUsize::MIN),
            &CancellationToken::new(),
        )
        .await?;
    let wall = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let mut timelines = Vec::new();
    for r in out {
        timelines.push(r.outcome.map_err(|e| format!("{}: {e}", r.name))?.timeline);
    }
    let names: Vec<MachineName> = specs.into_iter().map(|s| s.name).collect();
    for (name, r) in composer
        .deprovision_fleet(
            &names,
            NonZeroUsize::new(8).unwrap_or(NonZeroUsize::MIN),
            &CancellationToken::new(),
        )
        .await
    {
        r.map_err(|e| format!("deleting {name}: {e}"))?;
    }
    Ok(Round {
        wall,
        timelines,
        peak_rss_kib: peak.load(Ordering::Relaxed),
    })
}

/// The floor: `n` chroots over the same root, each running cloud-init's four stages
/// on the same user data, in parallel; wall time until the last one ends.
fn floor(root: &Path, user_data: &str, n: usize) -> Res<Duration> {
    let base = tempfile::tempdir()?;
    let mut dirs = Vec::new();
    for i in 0..n {
        let d = base.path().join(format!("m{i}"));
        let seed = d.join("upper/var/lib/cloud/seed/nocloud");
        std::fs::create_dir_all(&seed)?;
        std::fs::create_dir_all(d.join("work"))?;
        std::fs::create_dir_all(d.join("root"))?;
        std::fs::write(seed.join("user-data"), user_data)?;
        std::fs::write(
            seed.join("meta-data"),
            format!("instance-id: floor-{i}\nlocal-hostname: floor-{i}\n"),
        )?;
        let cfg = d.join("upper/etc/cloud/cloud.cfg.d");
        std::fs::create_dir_all(&cfg)?;
        std::fs::write(
            cfg.join("90-floor.cfg"),
            "datasource_list: [ NoCloud, None ]\nnetwork: {config: disabled}\nlocale: false\nresize_rootfs: false\ngrowpart: {mode: 'off'}\nssh_genkeytypes: [ed25519, ecdsa]\n",
        )?;
        dirs.push(d);
    }
    let start = Instant::now();
    let children: Vec<_> = dirs
        .iter()
        .map(|d| {
            Command::new("unshare")
                .args(["--mount", "--uts", "--ipc", "--net", "--pid", "--fork", "--propagation", "private", "sh", "-c"])
                .arg(
                    "mount -t overlay overlay -o lowerdir=\"$L\",upperdir=\"$D/upper\",workdir=\"$D/work\" \"$D/root\" && \
                     mount -t proc proc \"$D/root/proc\" && chroot \"$D/root\" sh -c \
                     'cloud-init init --local; cloud-init init; cloud-init modules --mode config; cloud-init modules --mode final' >/dev/null 2>&1",
                )
                .env("L", root)
                .env("D", d)
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    for mut c in children {
        c.wait()?;
    }
    let wall = start.elapsed();
    for d in &dirs {
        let result = std::fs::read_to_string(d.join("upper/run/cloud-init/result.json"))?;
        if !result.contains("\"errors\": []") {
            return Err(format!("floor run failed: {result}").into());
        }
    }
    Ok(wall)
}

/// The median of `v` (the upper one of an even count).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Prints a round's row; returns its Ready p50 in seconds.
fn stats(label: &str, r: &Round) -> f64 {
    let mut ready: Vec<f64> = r
        .timelines
        .iter()
        .filter_map(|t| t.ready)
        .map(|d| d.as_secs_f64())
        .collect();
    ready.sort_by(f64::total_cmp);
    let mid = |v: &[f64]| v.get(v.len() / 2).copied().unwrap_or(0.0);
    let mut boot: Vec<f64> = r
        .timelines
        .iter()
        .filter_map(Timeline::boot_time)
        .map(|d| d.as_secs_f64())
        .collect();
    boot.sort_by(f64::total_cmp);
    let mut boots: Vec<f64> = r
        .timelines
        .iter()
        .filter_map(Timeline::bootstrap_time)
        .map(|d| d.as_secs_f64())
        .collect();
    boots.sort_by(f64::total_cmp);
    println!(
        "{label:<26} {:>3} {:>8.2}s {:>8.2}s {:>8.2}s {:>8.2}s {:>10.2}s {:>9}",
        r.timelines.len(),
        r.wall.as_secs_f64(),
        mid(&ready),
        ready.last().copied().unwrap_or(0.0),
        mid(&boot),
        mid(&boots),
        if r.peak_rss_kib > 0 {
            format!("{} MiB", r.peak_rss_kib / 1024)
        } else {
            "-".into()
        }
    );
    mid(&ready)
}

#[tokio::main]
async fn main() -> Res<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20);
    let repeats: usize = std::env::args()
        .nth(2)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1)
        .max(1);
    let tag = format!("{:04x}", std::process::id() & 0xffff);
    let bridge = format!("mpb{tag}");
    let config = LocalConfig::new("bench")
        .with_bridge(&bridge)
        .with_subnet(format!("10.214.{}.0/24", 100 + std::process::id() % 150))
        .with_run_dir(format!("/run/machine-provisioning/bench-{tag}"));
    let root = config.root.clone();
    let provider = Arc::new(LocalProvider::new(config)?);
    let _teardown = Teardown(provider.clone());

    let keys = tempfile::tempdir()?;
    let key = keys.path().join("id");
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()?;
    if !ok.success() {
        return Err("ssh-keygen failed".into());
    }
    std::fs::write(keys.path().join("known_hosts"), "")?;
    let ssh = SshAccess {
        user: "root".into(),
        authorized_keys: vec![
            std::fs::read_to_string(key.with_extension("pub"))?
                .trim()
                .to_owned(),
        ],
    };
    let connector = Arc::new(SshConnector::new(
        SshConfig::new(vec![Auth::key_file(&key, None)?]).with_host_keys(HostKeyPolicy::Verify {
            known_hosts: Some(keys.path().join("known_hosts")),
        }),
    ));
    let settings = ComposerSettings::default().with_poll_interval(Duration::from_millis(50));
    let layer = Arc::new(CloudConfigLayer::new("app", cloud_config()?)?);
    let coupled = Composer::builder(provider.clone())
        .settings(settings.clone())
        .coupled(layer.clone())
        .connector(connector.clone())
        .completion(Arc::new(CloudInitStatus::new()))
        .build()?;
    let decoupled = Composer::builder(provider.clone())
        .settings(settings.clone())
        .decoupled(Arc::new(steps()?))
        .connector(connector.clone())
        .build()?;
    // By reference: the store listens on the bridge's own address (made here, as the
    // provider makes it on its first create), and answers the run's subnet only.
    let subnet = provider.config().subnet()?;
    let gateway = subnet.gateway();
    for args in [
        vec!["link", "add", bridge.as_str(), "type", "bridge"],
        vec![
            "addr",
            "replace",
            &format!("{gateway}/{}", subnet.prefix()),
            "dev",
            &bridge,
        ],
        vec!["link", "set", bridge.as_str(), "up"],
    ] {
        let out = Command::new("ip").args(&args).output()?;
        if !out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("File exists") {
            return Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
    }
    let store = Arc::new(
        HttpsStore::start(
            HttpsStoreConfig::new(std::net::SocketAddr::new(gateway.into(), 0))
                .allow(Network::parse(&provider.config().subnet)?),
        )
        .await?,
    );
    let by_reference = Composer::builder(provider.clone())
        .settings(settings)
        .coupled(layer.clone())
        .connector(connector)
        .completion(Arc::new(CloudInitStatus::new()))
        .by_reference(ByReference::new(store.clone()))
        .build()?;
    let user_data = layer.render()?;

    println!(
        "provider-local create-to-Ready, {n} in parallel, on {} cores (load {})",
        std::thread::available_parallelism().map_or(0, |c| c.get()),
        std::fs::read_to_string("/proc/loadavg")?
            .split_whitespace()
            .next()
            .unwrap_or("?")
    );
    println!(
        "{:<26} {:>3} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}",
        "round", "n", "wall", "ready p50", "ready max", "boot p50", "bootstr p50", "peak mem"
    );
    // Inline and by reference alternate, `repeats` times each, so that both see the
    // same spread of load; the ratio is of their medians.
    let (mut inline_1, mut by_ref_1) = (Vec::new(), Vec::new());
    for r in 1..=repeats {
        let tag = if repeats > 1 {
            format!(" #{r}")
        } else {
            String::new()
        };
        inline_1.push(stats(
            &format!("coupled, 1{tag}"),
            &round(&coupled, &format!("c1-{r}"), 1, &ssh, &bridge).await?,
        ));
        by_ref_1.push(stats(
            &format!("coupled by reference, 1{tag}"),
            &round(&by_reference, &format!("r1-{r}"), 1, &ssh, &bridge).await?,
        ));
    }
    stats(
        "decoupled, 1",
        &round(&decoupled, "d1", 1, &ssh, &bridge).await?,
    );
    let (mut inline_n, mut by_ref_n) = (Vec::new(), Vec::new());
    for r in 1..=repeats {
        let tag = if repeats > 1 {
            format!(" #{r}")
        } else {
            String::new()
        };
        inline_n.push(stats(
            &format!("coupled, {n}{tag}"),
            &round(&coupled, &format!("cn-{r}"), n, &ssh, &bridge).await?,
        ));
        by_ref_n.push(stats(
            &format!("coupled by reference, {n}{tag}"),
            &round(&by_reference, &format!("rn-{r}"), n, &ssh, &bridge).await?,
        ));
    }
    stats(
        &format!("decoupled, {n}"),
        &round(&decoupled, "dn", n, &ssh, &bridge).await?,
    );
    let served = store.stats();
    println!(
        "by reference / inline, Ready p50 (median of {repeats}): {:.2} at 1, {:.2} at {n}; the store served {} documents, refused {}",
        median(&mut by_ref_1) / median(&mut inline_1),
        median(&mut by_ref_n) / median(&mut inline_n),
        served.served,
        served.gone + served.wrong_clients + served.failed_handshakes + served.unknown_tokens
    );
    println!("floor: cloud-init stages in a chroot, same user data");
    println!(
        "{:<26} {:>3} {:>8.2}s",
        "chroot, 1",
        1,
        floor(&root, &user_data, 1)?.as_secs_f64()
    );
    println!(
        "{:<26} {:>3} {:>8.2}s",
        format!("chroot, {n}"),
        n,
        floor(&root, &user_data, n)?.as_secs_f64()
    );
    Ok(())
}
