//! Benchmark of provider-vsphere against pyvmomi on vcsim, in one run: for each
//! inventory size (`--inventory 200,1000,2000`: vcsim's `-vm`, VMs of nobody's already in
//! the datacenter, powered on), a fresh vcsim per side, the provider first unless
//! `--pyvmomi-first`.
//!
//! Each side takes N VMs (default 200, concurrency 16) through clone from a diskless
//! template (vcsim's `DC0_H0_VM0`; see [`diskless_template`] for why) into the folder
//! `DC0/vm/machines`, with owner and name tags and 2 KiB of user data in extraConfig,
//! 1 CPU and 64 MiB, power on, wait until the guest has an IP (polled every 100 ms), and
//! destroy. The provider does it through `create`, `get` and `delete` (with its adoption
//! lookup before the clone, the race check after it, the ownership check and the soft
//! stop before destroy), watching `DC0/vm/machines` (its `defaults.folder`; with
//! `--watch-datacenter` it watches `DC0/vm`, every VM of the inventory); pyvmomi through
//! the minimal calls with `WaitForTask` on 16 threads (provider-vsphere/bench/pyvmomi_bench.py).
//! vcsim gives no guest IP by itself: a VMware Tools stand-in (the same script with
//! `--tools`, its own process and session) sets one with extraConfig `SET.guest.ipAddress`
//! on every VM powered on during the run, for both sides alike; each side starts only once
//! the stand-in says it is ready (it has read the tasks that were there before the run,
//! which are not the bench's). Client CPU is getrusage of
//! each side's own process (this one for the provider, the Python child for pyvmomi);
//! vcsim and the Tools stand-in are excluded. Calls: pyvmomi counts its own SOAP requests
//! exactly; for the provider, vcsim's `callCount` of its session (read from
//! `SessionManager.sessionList`). vcsim bumps that count without a lock, so under
//! concurrency it can miss some: the pyvmomi row shows vcsim's count beside the exact
//! one, to see how many. A call whose connection vcsim dropped is repeated (at most three
//! times) on both sides, and counted in `retries`. No wait is unbounded: a VM without a
//! guest address 120 s after its power-on fails the run, naming it, and so does a side
//! that has not finished in 300 s plus 3 s per VM (the provider's says where each
//! unfinished VM is: in create, waiting for its address, in delete).
//!
//! ```sh
//! WITH_BENCH_PEERS=1 bash scripts/peers/50-vcsim.sh   # vcsim, and pyvmomi in a venv
//! cargo run --release -p provider-vsphere --example bench_vsphere -- --count 200 --concurrency 16 --inventory 200,1000,2000
//! ```

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

// vcsim runs as several processes, counted by its own reader below, not by pid.
#[allow(dead_code)]
#[path = "../../bench/measure.rs"]
mod measure;
use anyhow::{Context, Result, bail};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use machine_core::{
    AddressKind, MachineName, MachineProvisioner, SecretString, UserData, UserDataFormat,
};
use measure::{arg, cpu_seconds};
use provider_vsphere::{VmSettings, VsphereConfig, VsphereProvider};

/// The tests' vcsim launcher and raw SOAP administrator.
#[path = "../tests/common/mod.rs"]
mod common;

use common::Vcsim;
use common::admin::Admin;

/// Where scripts/peers/50-vcsim.sh puts pyvmomi with WITH_BENCH_PEERS=1.
fn venv() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    cache.join("machine-provisioning/pyvmomi")
}

fn python() -> Result<PathBuf> {
    let py = venv().join("bin/python");
    if !py.is_file() {
        bail!(
            "pyvmomi is not installed at {}: run WITH_BENCH_PEERS=1 bash scripts/peers/50-vcsim.sh",
            py.display()
        );
    }
    Ok(py)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/pyvmomi_bench.py")
}

/// `host:port` of vcsim's URL.
fn host_port(vcsim: &Vcsim) -> Result<String> {
    let rest = vcsim
        .url
        .strip_prefix("https://")
        .context("vcsim URL is not https")?;
    Ok(rest.split('/').next().unwrap_or(rest).to_owned())
}

/// The VMware Tools stand-in: its own process and session, killed (by PID) when dropped.
struct Tools(Child);

/// How long the stand-in may take to start (Python, pyVmomi's import, its login and its
/// first reads) on a loaded machine.
const TOOLS_READY: Duration = Duration::from_secs(60);

impl Tools {
    /// Starts the stand-in and waits until it says "ready": it has read the tasks that
    /// were there before (not the bench's). A bench that started before that had its
    /// first power-ons taken for the inventory's, and those VMs never got an address.
    fn start(vcsim: &Vcsim) -> Result<Tools> {
        let mut child = Command::new(python()?)
            .arg(script())
            .args(["--host", &host_port(vcsim)?])
            .args(["--thumbprint", &vcsim.fingerprint.to_string()])
            .arg("--tools")
            .args(["--folder", FOLDER])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the VMware Tools stand-in")?;
        let stdout = child.stdout.take().context("the stand-in's stdout")?;
        let tools = Tools(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let read = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(read.map(|_| line));
        });
        match rx.recv_timeout(TOOLS_READY) {
            Ok(Ok(line)) if line.trim() == "ready" => Ok(tools),
            Ok(Ok(line)) => bail!("the VMware Tools stand-in printed {line:?}, not \"ready\""),
            Ok(Err(e)) => bail!("reading the VMware Tools stand-in's output: {e}"),
            Err(_) => bail!("the VMware Tools stand-in was not ready in {TOOLS_READY:?}"),
        }
    }
}

impl Drop for Tools {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// vcsim's call count for the session of `user` (0 when it has none).
async fn vcsim_calls(admin: &Admin, user: &str) -> usize {
    let text = admin
        .call(
            "RetrievePropertiesEx",
            "<_this type=\"PropertyCollector\">propertyCollector</_this><specSet><propSet><type>SessionManager</type><pathSet>sessionList</pathSet></propSet><objectSet><obj type=\"SessionManager\">SessionManager</obj></objectSet></specSet><options/>",
        )
        .await;
    let needle = format!("<userName>{user}</userName>");
    text.split("<UserSession")
        .filter(|s| s.contains(&needle))
        .filter_map(|s| {
            let from = s.find("<callCount>")? + "<callCount>".len();
            s[from..].split('<').next()?.parse::<usize>().ok()
        })
        .sum()
}

/// CPU seconds (user + system) used so far by this process's vcsim children, from /proc:
/// the server side of the same calls, to see whether one client's calls cost vcsim more.
fn vcsim_cpu_seconds() -> Result<f64> {
    let me = std::process::id().to_string();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.context("no CLK_TCK")? as f64;
    let mut ticks = 0u64;
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ... utime(14) stime(15)": fields after the comm.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if head.ends_with("(vcsim") && f.get(1) == Some(&me.as_str()) {
            ticks += f.get(11).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
            ticks += f.get(12).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    Ok(ticks as f64 / hz)
}

/// The template both sides clone: vcsim's `DC0_H0_VM0`, made diskless by
/// [`diskless_template`].
const TEMPLATE: &str = "DC0/vm/DC0_H0_VM0";

/// The folder both sides clone into.
const FOLDER: &str = "DC0/vm/machines";

/// Starts vcsim with `inventory` VMs (two resource pools, half in each; at least the
/// model's four), the diskless template and the machines' folder.
async fn prepared_vcsim(inventory: usize) -> Result<(Vcsim, Admin)> {
    let per_pool = (inventory / 2).max(2).to_string();
    let vcsim = Vcsim::start_with(&["-vm", &per_pool]);
    let admin = Admin::login(&vcsim).await;
    diskless_template(&admin).await?;
    let found = admin
        .call(
            "FindByInventoryPath",
            "<_this type=\"SearchIndex\">SearchIndex</_this><inventoryPath>DC0/vm</inventoryPath>",
        )
        .await;
    let vm_folder = after(&found, "type=\"Folder\">").context("no DC0/vm")?;
    admin
        .call(
            "CreateFolder",
            &format!("<_this type=\"Folder\">{vm_folder}</_this><name>machines</name>"),
        )
        .await;
    Ok((vcsim, admin))
}

/// Makes a diskless template of vcsim's `DC0_H0_VM0` (powered off, its disk removed,
/// marked as a template). vcsim 0.24's clone shares the template's disk object with
/// every clone and blanks its file name while it copies; a Destroy_Task racing with a
/// clone then panics, and in one run vcsim answered nothing more after it (200 VMs,
/// concurrency 16). Without a disk neither side meets that race; vcsim
/// copies no disk data anyway. (vcsim refuses to reconfigure a template, hence a VM of
/// its own rather than the tests' template.)
async fn diskless_template(admin: &Admin) -> Result<()> {
    let found = admin
        .call(
            "FindByInventoryPath",
            &format!(
                "<_this type=\"SearchIndex\">SearchIndex</_this><inventoryPath>{TEMPLATE}</inventoryPath>"
            ),
        )
        .await;
    let vm = after(&found, "type=\"VirtualMachine\">").context("no DC0_H0_VM0 in vcsim")?;
    let this = format!("<_this type=\"VirtualMachine\">{vm}</_this>");
    admin.call("PowerOffVM_Task", &this).await;
    let devices = admin.property(&vm, "config.hardware.device").await;
    let disk = devices
        .find("type=\"VirtualDisk\">")
        .and_then(|i| after(&devices[i..], "<key>"))
        .context("the template has no disk")?;
    admin
        .call(
            "ReconfigVM_Task",
            &format!(
                "<_this type=\"VirtualMachine\">{vm}</_this><spec><deviceChange><operation>remove</operation><device xsi:type=\"VirtualDisk\"><key>{disk}</key><capacityInKB>0</capacityInKB></device></deviceChange></spec>"
            ),
        )
        .await;
    let left = admin.property(&vm, "config.hardware.device").await;
    if left.contains("type=\"VirtualDisk\">") {
        bail!("vcsim kept the disk of {TEMPLATE}");
    }
    admin.call("MarkAsTemplate", &this).await;
    Ok(())
}

/// The text after the first `start`, up to the next `<`.
fn after(text: &str, start: &str) -> Option<String> {
    let from = text.find(start)? + start.len();
    Some(text[from..].split('<').next()?.to_owned())
}

struct Figures {
    wall: f64,
    cpu: f64,
    /// The side's own count (pyvmomi), else vcsim's.
    calls: usize,
    /// vcsim's count of the side's session.
    vcsim_calls: usize,
    /// Deletes repeated after vcsim dropped the connection.
    retries: usize,
    /// vcsim's CPU seconds during the side's run.
    server_cpu: f64,
    /// The provider's mean time per VM in create, waiting for the address, and delete
    /// (seconds); pyvmomi's are not timed.
    phases: Option<[f64; 3]>,
}

/// Calls `op` until it succeeds or fails other than transiently, at most four times;
/// `retries` counts the repeats. vcsim 0.24 panics in a request now and then under
/// concurrency (in Destroy_Task when a concurrent clone has blanked the disk backing
/// it shares with the template) and drops the connection; a controller retries such
/// errors (Retrying), and pyvmomi's side repeats the same way. Create adopts and
/// delete counts gone as done, so a repeat is safe.
async fn again<T, F, Fut>(retries: &AtomicUsize, op: F) -> machine_core::Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = machine_core::Result<T>>,
{
    let mut tries = 0;
    loop {
        match op().await {
            Err(e) if e.kind().is_retryable() && tries < 3 => {
                tries += 1;
                retries.fetch_add(1, Ordering::Relaxed);
            }
            other => return other,
        }
    }
}

const POLL: Duration = Duration::from_millis(100);

/// How long a VM may wait for its guest address (the stand-in gives one within a poll or
/// two of the power-on).
const ADDRESS_LIMIT: Duration = Duration::from_secs(120);

/// What each VM of the provider's side is doing, by the number `stages` holds.
const STAGES: [&str; 5] = [
    "not started",
    "in create",
    "waiting for its address",
    "in delete",
    "done",
];

/// A generous bound on one side's run of `count` VMs (the 200-VM runs take 5-7 s): it
/// fails with where the VMs are instead of waiting until killed.
fn deadline(count: usize) -> Duration {
    Duration::from_secs(300 + 3 * count as u64)
}

/// How many VMs are at each stage, and the first few names of the unfinished ones.
fn where_they_are(stages: &[AtomicU8]) -> String {
    let mut out = Vec::new();
    for (n, what) in STAGES.iter().enumerate() {
        let at: Vec<usize> = (0..stages.len())
            .filter(|&i| usize::from(stages[i].load(Ordering::Relaxed)) == n)
            .collect();
        if at.is_empty() {
            continue;
        }
        let mut line = format!("{} {what}", at.len());
        if (1..4).contains(&n) {
            let names: Vec<String> = at.iter().take(5).map(|i| format!("bench-{i:04}")).collect();
            line.push_str(&format!(
                " ({}{})",
                names.join(", "),
                if at.len() > 5 { ", ..." } else { "" }
            ));
        }
        out.push(line);
    }
    out.join(", ")
}

async fn bench_provider(
    count: usize,
    concurrency: usize,
    inventory: usize,
    watch_datacenter: bool,
) -> Result<Figures> {
    let (vcsim, admin) = prepared_vcsim(inventory).await?;
    let _tools = Tools::start(&vcsim)?;
    let defaults = VmSettings {
        folder: Some(if watch_datacenter { "DC0/vm" } else { FOLDER }.to_owned()),
        ..VmSettings::default()
    };
    let config = VsphereConfig::builder()
        .url(&vcsim.url)
        .username("bench-provider")
        .password(SecretString::from("pass"))
        .pinned_sha256(vcsim.fingerprint)
        .datacenter("DC0")
        .owner("bench-provider")
        .defaults(defaults)
        .build()?;
    let p = Arc::new(VsphereProvider::new(config)?);
    let data = Arc::new(UserData::new(
        UserDataFormat::CloudConfig,
        [&b"#cloud-config\n"[..], &b"# padding\n".repeat(203)].concat(),
    ));
    let retries = AtomicUsize::new(0);
    // Microseconds spent in create, waiting for the address, and delete, summed.
    let spent: [AtomicU64; 3] = Default::default();
    let server0 = vcsim_cpu_seconds()?;
    let cpu0 = cpu_seconds()?;
    let start = Instant::now();
    // Where each VM is (see STAGES), for the message when the run passes its deadline.
    let stages: Vec<AtomicU8> = (0..count).map(|_| AtomicU8::new(0)).collect();
    let run = stream::iter(0..count)
        .map(|i| {
            let p = p.clone();
            let data = data.clone();
            let retries = &retries;
            let spent = &spent;
            let stage = &stages[i];
            async move {
                let name = MachineName::new(format!("bench-{i:04}"))?;
                let spec =
                    common::spec(&name)
                        .with_image(TEMPLATE)
                        .with_provider(serde_json::json!({
                            "resourcePool": common::POOL,
                            "sshUser": common::SSH_USER,
                            "folder": FOLDER,
                        }));
                stage.store(1, Ordering::Relaxed);
                let mut since = Instant::now();
                let mut lap = |phase: usize| {
                    let now = Instant::now();
                    let us = u64::try_from((now - since).as_micros()).unwrap_or(u64::MAX);
                    spent[phase].fetch_add(us, Ordering::Relaxed);
                    since = now;
                };
                let m = again(retries, || p.create(&spec, Some(&data)))
                    .await
                    .with_context(|| format!("creating {name}"))?;
                stage.store(2, Ordering::Relaxed);
                lap(0);
                let asked = Instant::now();
                while again(retries, || p.get(&m.provider_id))
                    .await
                    .with_context(|| format!("reading {name}"))?
                    .address(AddressKind::InternalIP)
                    .is_none()
                {
                    if asked.elapsed() > ADDRESS_LIMIT {
                        bail!(
                            "{name} ({}): no guest address {ADDRESS_LIMIT:?} after its create \
                             returned it powered on; the VMware Tools stand-in gave none",
                            m.provider_id
                        );
                    }
                    tokio::time::sleep(POLL).await;
                }
                stage.store(3, Ordering::Relaxed);
                lap(1);
                again(retries, || p.delete(&m.provider_id))
                    .await
                    .with_context(|| format!("deleting {name}"))?;
                stage.store(4, Ordering::Relaxed);
                lap(2);
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>();
    let limit = deadline(count);
    match tokio::time::timeout(limit, run).await {
        Ok(done) => done?,
        Err(_) => bail!(
            "the provider's side did not finish {count} VMs in {limit:?}: {}",
            where_they_are(&stages)
        ),
    };
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds()? - cpu0;
    let server_cpu = vcsim_cpu_seconds()? - server0;
    // Read before logout, which ends the session and its count.
    let calls = vcsim_calls(&admin, "bench-provider").await;
    p.logout().await?;
    Ok(Figures {
        wall,
        cpu,
        calls,
        vcsim_calls: calls,
        retries: retries.into_inner(),
        server_cpu,
        phases: Some(spent.map(|s| s.into_inner() as f64 / 1e6 / count as f64)),
    })
}

async fn bench_pyvmomi(count: usize, concurrency: usize, inventory: usize) -> Result<Figures> {
    let (mut vcsim, admin) = prepared_vcsim(inventory).await?;
    let _tools = Tools::start(&vcsim)?;
    let server0 = vcsim_cpu_seconds()?;
    let out = Command::new(python()?)
        .arg(script())
        .args(["--host", &host_port(&vcsim)?])
        .args(["--thumbprint", &vcsim.fingerprint.to_string()])
        .args(["--count", &count.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .args(["--poll", &POLL.as_secs_f64().to_string()])
        .args(["--template", TEMPLATE])
        .args(["--folder", FOLDER])
        .args(["--deadline", &deadline(count).as_secs().to_string()])
        .stderr(Stdio::inherit())
        .output()
        .context("running pyvmomi_bench.py")?;
    // Includes the script's start-up and login, a few calls.
    let server_cpu = vcsim_cpu_seconds()? - server0;
    if !out.status.success() {
        bail!(
            "pyvmomi_bench.py failed: {}; {}",
            out.status,
            vcsim.log_tail()
        );
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim())
        .with_context(|| format!("pyvmomi bench printed {line:?}"))?;
    let f = |k: &str| v[k].as_f64().with_context(|| format!("no {k} in {line}"));
    Ok(Figures {
        wall: f("wall_s")?,
        cpu: f("cpu_s")?,
        calls: f("calls")? as usize,
        // The script exits without logging out, so its session (and count) remain.
        vcsim_calls: vcsim_calls(&admin, "bench-pyvmomi").await,
        retries: f("retries")? as usize,
        server_cpu,
        phases: None,
    })
}

/// The inventory sizes of `--inventory 200,1000,2000` (default 200).
fn inventories() -> Result<Vec<usize>> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--inventory") {
        Some(i) => args
            .get(i + 1)
            .context("--inventory needs sizes, such as 200,1000,2000")?
            .split(',')
            .map(|n| n.trim().parse().context("--inventory needs numbers"))
            .collect(),
        None => Ok(vec![200]),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    // RUST_LOG=provider_vsphere=debug shows what a slow or stuck run waits for.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let count = arg("--count", 200)?;
    let concurrency = arg("--concurrency", 16)?;
    let pyvmomi_first = std::env::args().any(|a| a == "--pyvmomi-first");
    let watch_datacenter = std::env::args().any(|a| a == "--watch-datacenter");
    println!(
        "{count} VMs, concurrency {concurrency}, a fresh vcsim per side; provider-vsphere on a current-thread tokio runtime (watching {}), pyvmomi on {concurrency} threads",
        if watch_datacenter { "DC0/vm" } else { FOLDER }
    );
    let mut rows = Vec::new();
    for inventory in inventories()? {
        println!();
        println!("inventory {inventory} VMs");
        println!(
            "{:<17} {:>8} {:>8} {:>7} {:>12} {:>10} {:>12} {:>13} {:>8} {:>14}",
            "client",
            "wall s",
            "cpu s",
            "calls",
            "vcsim calls",
            "per VM",
            "cpu ms/call",
            "cpu ms/VM",
            "retries",
            "vcsim ms/VM"
        );
        // Each side's row as soon as it is measured: a side that fails or hangs does
        // not take the other's figures with it.
        let row = |name: &str, f: &Figures| {
            println!(
                "{name:<17} {:>8.2} {:>8.2} {:>7} {:>12} {:>10.1} {:>12.3} {:>13.2} {:>8} {:>14.2}",
                f.wall,
                f.cpu,
                f.calls,
                f.vcsim_calls,
                f.calls as f64 / count as f64,
                1e3 * f.cpu / f.calls.max(1) as f64,
                1e3 * f.cpu / count as f64,
                f.retries,
                1e3 * f.server_cpu / count as f64
            );
            if let Some([create, address, delete]) = f.phases {
                println!(
                    "{:<17} per VM: create {:.0} ms, address {:.0} ms, delete {:.0} ms",
                    "",
                    1e3 * create,
                    1e3 * address,
                    1e3 * delete
                );
            }
        };
        let (rust, py) = if pyvmomi_first {
            let py = bench_pyvmomi(count, concurrency, inventory).await?;
            row("pyvmomi", &py);
            let rust = bench_provider(count, concurrency, inventory, watch_datacenter).await?;
            row("provider-vsphere", &rust);
            (rust, py)
        } else {
            let rust = bench_provider(count, concurrency, inventory, watch_datacenter).await?;
            row("provider-vsphere", &rust);
            let py = bench_pyvmomi(count, concurrency, inventory).await?;
            row("pyvmomi", &py);
            (rust, py)
        };
        println!(
            "provider-vsphere / pyvmomi: wall {:.2}x, cpu per VM {:.2}x, calls per VM {:.2}x",
            rust.wall / py.wall,
            rust.cpu / py.cpu,
            rust.calls as f64 / py.calls.max(1) as f64
        );
        rows.push((inventory, rust, py));
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last())
        && rows.len() > 1
    {
        let per_vm = |f: &Figures| (f.calls as f64 / count as f64, 1e3 * f.cpu / count as f64);
        let ((c0, p0), (c1, p1)) = (per_vm(&first.1), per_vm(&last.1));
        println!();
        println!(
            "provider-vsphere from {} to {} VMs in the inventory: calls per VM {c0:.2} -> {c1:.2} ({:+.1}%), cpu per VM {p0:.2} -> {p1:.2} ms ({:+.1}%) (target: within 10%, at most 12 calls); wall at {}: {:.2}x pyvmomi's (target <= 0.5x)",
            first.0,
            last.0,
            100.0 * (c1 / c0 - 1.0),
            100.0 * (p1 / p0 - 1.0),
            last.0,
            last.1.wall / last.2.wall
        );
    }
    Ok(())
}
