//! An in-place update of a fleet of N real local machines (default 50) by the fleet
//! reconciler, batch by batch (maxUnavailable B, default 10; maxSurge 0), against
//! `ansible-playbook` applying the same change with `serial: B` to N other machines, in
//! the same run (issue 26).
//!
//! ```text
//! WITH_BENCH_PEERS=1 bash scripts/peers/10-openssh.sh    # ansible in a venv
//! WITH_BENCH_PEERS=1 bash scripts/peers/40-local-root.sh # the bench root
//! cargo run --release -p tests --example bench_fleet_inplace [-- --hosts 50 --batch 10 --settle 30 --ansible-first]
//! ```
//!
//! Untimed setup: a `MachineSet` of N provider-local machines (booted from the
//! `bookworm-bench` root with a coupled base layer) is driven by [`FleetReconciler`] until
//! steady with app layer v1 (a decoupled step layer: two files and a command that
//! records the deploy, restarting nothing); N other machines with the same base layer
//! are booted and get v1 from Ansible. After a pause (`--settle`, 30 s) for the setup's
//! processes to end, timed, each side alone: (a) the reconciler, given app layer v2, is
//! stepped (waiting what each step's action asks) until the fleet is steady again; (b) `ansible-playbook` applies v2 with `serial: B` (forks 50, the SSH
//! settings of bench_recipes_ansible, its control masters of the v1 run closed first, so
//! both sides start with no connection open). Afterwards every machine on both sides is
//! read back over SSH and must hold v2 (and v1 then v2 in its deploy history), and every
//! fleet machine must still be the machine it was (same provider ID: updated in place,
//! not replaced).
//!
//! Client CPU is user + system time of this process and its waited children over each
//! side's timed window: the reconciler and its SSH for ours; ansible-playbook, its
//! workers and ssh for Ansible (its ControlPersist masters are not waited, so not counted,
//! as in bench_ssh).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../../bench/ansible.rs"]
mod ansible;

use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, CloudInitStatus, WriteFile};
use bootstrap_ssh::{Auth, HostKeyPolicy, SshConfig, SshConnector};
use machine_core::fleet::{
    FleetReconciler, IntOrPercent, MachineSet, Rollout, SET_LABEL, conditions,
};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    Action, CancellationToken, Composer, ComposerSettings, Connector, ExecRequest, Labels, Machine,
    MachineName, MachineProvisioner, MachineSpec, ProviderId, SshAccess,
};
use provider_local::{LocalConfig, LocalProvider};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const SET: &str = "fleet";
/// The composer's poll interval: what the reconciler asks to wait between steps while
/// the fleet converges.
const POLL: Duration = Duration::from_millis(100);
/// A convergence that takes longer than this has failed.
const LIMIT: Duration = Duration::from_secs(1800);

fn app_conf(v: &str) -> String {
    format!("version = {v}\nlisten = 0.0.0.0:8080\nworkers = 4\n")
}

fn app_env(v: &str) -> String {
    format!("APP_RELEASE={v}\nAPP_OPTS=--config=/etc/app.conf\n")
}

/// The deploy's command: checks the new configuration is in place and records the
/// release; nothing is restarted.
fn record(v: &str) -> String {
    format!("grep -qx 'version = {v}' /etc/app.conf && echo {v} >> /var/lib/app.history")
}

/// App layer `v`, ours: two files and the command.
fn app_layer(v: &str) -> Res<Arc<StepLayer>> {
    Ok(Arc::new(StepLayer::new(
        "app",
        vec![
            Step::write_file_mode("/etc/app.conf", app_conf(v), 0o640),
            Step::write_file_mode("/etc/default/app", app_env(v), 0o644),
            Step::run(record(v)),
        ],
    )?))
}

/// App layer `v`, Ansible's: the same files by `copy`, the same command by `shell`.
fn playbook(v: &str, serial: Option<usize>) -> String {
    let mut p = String::from("- hosts: targets\n  gather_facts: false\n");
    if let Some(b) = serial {
        let _ = writeln!(p, "  serial: {b}");
    }
    p.push_str("  tasks:\n");
    let _ = writeln!(
        p,
        "    - ansible.builtin.copy: {{dest: /etc/app.conf, content: {:?}, mode: \"0640\"}}",
        app_conf(v)
    );
    let _ = writeln!(
        p,
        "    - ansible.builtin.copy: {{dest: /etc/default/app, content: {:?}, mode: \"0644\"}}",
        app_env(v)
    );
    let _ = writeln!(p, "    - ansible.builtin.shell: {:?}", record(v));
    p
}

/// What every machine must read back after v2, on both sides.
const READ_BACK: &str = "stat -c '%n %a %U:%G' /etc/app.conf /etc/default/app; cat /etc/app.conf /etc/default/app /var/lib/app.history";

fn expected() -> String {
    format!(
        "/etc/app.conf 640 root:root\n/etc/default/app 644 root:root\n{}{}v1\nv2\n",
        app_conf("v2"),
        app_env("v2")
    )
}

/// User + system CPU seconds of this process and its waited children.
fn cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<f64> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // stat(5) fields 14-17 (utime, stime, cutime, cstime); index 0 is field 3, in
    // USER_HZ (100).
    f.get(11..15).map_or(0.0, |t| t.iter().sum::<f64>()) / 100.0
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn run_ansible(dir: &Path, play: &str) -> Res<String> {
    let out = Command::new(ansible::playbook_bin())
        .arg("-i")
        .arg(dir.join("inventory"))
        .arg(dir.join(play))
        .env("ANSIBLE_CONFIG", dir.join("ansible.cfg"))
        .env("ANSIBLE_LOCAL_TEMP", dir.join("tmp"))
        .env("ANSIBLE_HOME", dir.join("home"))
        .stdin(Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "ansible-playbook {play} failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(stdout)
}

/// Closes Ansible's ControlPersist masters (one socket per host under `dir/cp`).
fn close_masters(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir.join("cp")) else {
        return;
    };
    for e in entries.flatten() {
        let _ = Command::new("ssh")
            .args(["-F", "/dev/null", "-o"])
            .arg(format!("ControlPath={}", e.path().display()))
            .args(["-O", "exit", "master"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The set's machines not being deleted: name to provider ID.
async fn fleet_ids(provider: &LocalProvider) -> Res<BTreeMap<MachineName, ProviderId>> {
    Ok(provider
        .list(&Labels::from([(SET_LABEL.to_owned(), SET.to_owned())]))
        .await?
        .into_iter()
        .filter(|m| !m.phase.is_deleting())
        .map(|m| (m.name, m.provider_id))
        .collect())
}

struct Converged {
    decisions: Vec<String>,
    steps: usize,
    /// The most in-place updates one step started.
    widest: usize,
}

/// Steps `r` until the fleet is steady, waiting between steps what each step asks.
async fn converge(r: &FleetReconciler) -> Res<Converged> {
    let start = Instant::now();
    let mut c = Converged {
        decisions: Vec::new(),
        steps: 0,
        widest: 0,
    };
    loop {
        let done = r.reconcile().await?;
        c.steps += 1;
        let updates = done
            .decisions
            .iter()
            .filter(|d| d.starts_with("update "))
            .count();
        c.widest = c.widest.max(updates);
        c.decisions.extend(done.decisions.iter().cloned());
        if let Some(p) = done.status.condition(conditions::ROLLOUT_PAUSED)
            && p.status
        {
            return Err(format!("the rollout paused: {}", p.message).into());
        }
        let progressing = done
            .status
            .condition(conditions::PROGRESSING)
            .is_none_or(|p| p.status);
        if !progressing {
            return Ok(c);
        }
        if start.elapsed() > LIMIT {
            return Err(format!("not steady after {LIMIT:?}: {:#?}", c.decisions).into());
        }
        let wait = match done.action {
            Action::Requeue(d) => d,
            _ => POLL,
        };
        tokio::time::sleep(wait).await;
    }
}

async fn read_back(connector: &SshConnector, m: &Machine) -> Res<String> {
    let t = connector.connect(m).await?;
    let out = t.exec(&ExecRequest::new(READ_BACK)).await?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status != Some(0) {
        return Err(format!(
            "read-back on {}: {text}{}",
            m.name,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(text)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Res<()> {
    let (mut hosts, mut batch, mut ansible_first) = (50usize, 10usize, false);
    let mut settle = 30u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--hosts" => hosts = args.next().ok_or("--hosts N")?.parse()?,
            "--batch" => batch = args.next().ok_or("--batch B")?.parse()?,
            "--ansible-first" => ansible_first = true,
            "--settle" => settle = args.next().ok_or("--settle SECONDS")?.parse()?,
            other => {
                return Err(format!(
                    "unknown argument {other} (--hosts N, --batch B, --settle SECONDS, --ansible-first)"
                )
                .into());
            }
        }
    }
    if hosts == 0 || batch == 0 || batch > 50 {
        return Err("--hosts must be at least 1 and --batch 1 to 50 (Ansible's forks)".into());
    }
    let ansible = ansible::playbook_bin();
    if !ansible.exists() {
        return Err(format!(
            "{} is missing: run WITH_BENCH_PEERS=1 bash scripts/peers/10-openssh.sh",
            ansible.display()
        )
        .into());
    }
    let root = ansible::cache_dir().join("bookworm-bench");
    if !root.join("usr/bin/python3").exists() {
        return Err(format!(
            "{} is missing: run WITH_BENCH_PEERS=1 bash scripts/peers/40-local-root.sh",
            root.display()
        )
        .into());
    }

    // The lab tears every machine down when dropped, also on error.
    let lab = tests::Lab::new();
    let mut config = LocalConfig::new("bench")
        .with_bridge(&lab.bridge)
        .with_subnet(&lab.subnet)
        .with_run_dir(&lab.run_dir);
    config.root = root;
    let provider = Arc::new(LocalProvider::new(config)?);

    let tmp = tempfile::tempdir()?;
    let key = tmp.path().join("id");
    let public = ansible::keygen(&key)?;
    let kh = tmp.path().join("known_hosts");
    std::fs::write(&kh, "")?;
    let ssh = SshAccess {
        user: "root".into(),
        authorized_keys: vec![public],
    };
    let connector = Arc::new(SshConnector::new(
        SshConfig::new(vec![Auth::key_file(&key, None)?])
            .with_host_keys(HostKeyPolicy::Verify {
                known_hosts: Some(kh.clone()),
            })
            .with_connect_timeout(Duration::from_secs(20)),
    ));
    let base = Arc::new(CloudConfigLayer::new(
        "base",
        CloudConfig::new().with_file(WriteFile::new("/etc/base.conf", "base v1\n")),
    )?);
    let composer = |app: Option<Arc<StepLayer>>| -> Res<Composer> {
        let mut b = Composer::builder(provider.clone())
            .settings(ComposerSettings::default().with_poll_interval(POLL))
            .coupled(base.clone())
            .connector(connector.clone())
            .completion(Arc::new(CloudInitStatus::new()));
        if let Some(app) = app {
            b = b.decoupled(app);
        }
        Ok(b.build()?)
    };
    let replicas = u32::try_from(hosts)?;
    let set = || {
        let mut template = MachineSpec::new(MachineName::new("web").expect("a name"));
        template.ssh = Some(ssh.clone());
        MachineSet::new(SET, replicas, template).with_rollout(
            Rollout::default()
                .with_max_surge(IntOrPercent::Int(0))
                .with_max_unavailable(IntOrPercent::Int(u32::try_from(batch).unwrap_or(1))),
        )
    };

    // Setup, not timed: the fleet at v1 by the reconciler; Ansible's machines booted, then
    // v1 by Ansible.
    let t0 = Instant::now();
    let mut reconciler = FleetReconciler::new(composer(Some(app_layer("v1")?))?, set())?;
    let booted = converge(&reconciler).await?;
    let created = booted
        .decisions
        .iter()
        .filter(|d| d.starts_with("create "))
        .count();
    if created != hosts {
        return Err(format!(
            "{created} machines created for {hosts}: {:#?}",
            booted.decisions
        )
        .into());
    }
    let fleet_boot = t0.elapsed().as_secs_f64();
    let before = fleet_ids(&provider).await?;
    if before.len() != hosts {
        return Err(format!("{} fleet machines listed, not {hosts}", before.len()).into());
    }

    let t0 = Instant::now();
    let plain = composer(None)?;
    let specs: Vec<MachineSpec> = (0..hosts)
        .map(|i| {
            let mut s = MachineSpec::new(MachineName::new(format!("ansible-{i}"))?);
            s.ssh = Some(ssh.clone());
            Ok(s)
        })
        .collect::<Res<_>>()?;
    let mut theirs = Vec::new();
    for r in plain
        .provision_fleet(
            &specs,
            std::num::NonZeroUsize::new(25).unwrap_or(std::num::NonZeroUsize::MIN),
            &CancellationToken::new(),
        )
        .await?
    {
        theirs.push(
            r.outcome
                .map_err(|e| format!("booting {}: {e}", r.name))?
                .machine,
        );
    }
    let ansible_boot = t0.elapsed().as_secs_f64();
    let mut known = String::new();
    let mut inventory = Vec::new();
    for (i, m) in theirs.iter().enumerate() {
        let host = &m.access.ssh.as_ref().ok_or("a machine without SSH")?.host;
        for k in &m.access.host_keys {
            let _ = writeln!(known, "{host} {k}");
        }
        inventory.push(format!("a{i} ansible_host={host}"));
    }
    let akh = tmp.path().join("ansible_known_hosts");
    std::fs::write(&akh, known)?;
    let adir = tmp.path().join("ansible");
    ansible::write_setup(&adir, &inventory, &key, &akh)?;
    std::fs::write(adir.join("v1.yml"), playbook("v1", None))?;
    std::fs::write(adir.join("v2.yml"), playbook("v2", Some(batch)))?;
    run_ansible(&adir, "v1.yml")?;
    close_masters(&adir);

    // Timed, each side alone, after a pause for the setup's processes (100 boots, an
    // Ansible run) to end.
    tokio::time::sleep(Duration::from_secs(settle)).await;
    reconciler.update(composer(Some(app_layer("v2")?))?, set())?;
    let load_before = load();
    let ansible_side = || -> Res<(f64, f64, String)> {
        let (c0, w0) = (cpu(), Instant::now());
        let recap = run_ansible(&adir, "v2.yml")?;
        Ok((w0.elapsed().as_secs_f64(), cpu() - c0, recap))
    };
    let mut ansible_run = None;
    if ansible_first {
        ansible_run = Some(ansible_side()?);
    }
    let (c0, w0) = (cpu(), Instant::now());
    let rolled = converge(&reconciler).await?;
    let (ours_wall, ours_cpu) = (w0.elapsed().as_secs_f64(), cpu() - c0);
    let (ans_wall, ans_cpu, recap) = match ansible_run {
        Some(run) => run,
        None => ansible_side()?,
    };
    let load_after = load();
    close_masters(&adir);

    // Checks: every fleet machine updated in place once, none replaced, batches of at
    // most B; every machine on both sides holds v2.
    let updates = rolled
        .decisions
        .iter()
        .filter(|d| d.starts_with("update "))
        .count();
    if updates != hosts || rolled.decisions.len() != hosts {
        return Err(format!(
            "expected {hosts} in-place updates and nothing else: {:#?}",
            rolled.decisions
        )
        .into());
    }
    if rolled.widest > batch {
        return Err(format!("{} updates in one step, over {batch}", rolled.widest).into());
    }
    let after = fleet_ids(&provider).await?;
    if after != before {
        return Err(format!("fleet machines replaced: before {before:?}, after {after:?}").into());
    }
    // The default callback heads each serial batch with the play's name.
    let batches = recap.matches("PLAY [").count();
    let want = expected();
    let ours: Vec<Machine> = provider
        .list(&Labels::from([(SET_LABEL.to_owned(), SET.to_owned())]))
        .await?;
    for m in ours.iter().chain(&theirs) {
        let got = read_back(&connector, m).await?;
        if got != want {
            return Err(format!("{} reads back\n{got}not\n{want}", m.name).into());
        }
    }

    // Where our time goes, in part: each in-place update runs the completion check
    // (`cloud-init status`, a Python process on the machine) before the layer. Its wall
    // on one batch of fleet machines at once, over connections already open.
    let gate = Arc::new(tokio::sync::Barrier::new(batch.min(ours.len())));
    let mut checks = Vec::new();
    for m in ours.iter().take(batch) {
        let (connector, gate, m) = (connector.clone(), gate.clone(), m.clone());
        checks.push(tokio::spawn(async move {
            let t = connector.connect(&m).await?;
            gate.wait().await;
            let w0 = Instant::now();
            t.exec(&ExecRequest::new(bootstrap_cloudinit::STATUS_COMMAND))
                .await?;
            Res::Ok((w0, Instant::now()))
        }));
    }
    let mut span: Option<(Instant, Instant)> = None;
    for c in checks {
        let (a, b) = c.await??;
        span = Some(span.map_or((a, b), |(x, y)| (x.min(a), y.max(b))));
    }
    let check_wall = span.map_or(0.0, |(a, b)| (b - a).as_secs_f64());

    let version = Command::new(&ansible)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("?")
                .to_owned()
        })
        .unwrap_or_else(|_| "?".into());
    println!(
        "fleet in place vs Ansible serial: app layer v1 -> v2 (2 files, 1 command) on {hosts} + {hosts} provider-local machines (setup not timed: fleet booted to v1 in {fleet_boot:.1} s, Ansible's booted in {ansible_boot:.1} s); {} first",
        if ansible_first { "Ansible" } else { "ours" },
    );
    println!(
        "ours: FleetReconciler, maxUnavailable {batch}, maxSurge 0, poll {} ms: {} steps, at most {} updates per step; peer: {version}, serial {batch}, forks 50, pipelining, cold connections: {batches} batches",
        POLL.as_millis(),
        rolled.steps,
        rolled.widest,
    );
    println!(
        "load average before the timed runs ({settle} s after the setup) {load_before}, after {load_after}; cloud-init status on {} fleet machines at once: {check_wall:.2} s",
        batch.min(hosts)
    );
    println!(
        "| hosts | batch | ours wall | ours client CPU | Ansible wall | Ansible client CPU | wall ratio | CPU ratio |"
    );
    println!(
        "| {hosts} | {batch} | {ours_wall:.2} s | {ours_cpu:.2} s | {ans_wall:.2} s | {ans_cpu:.2} s | {:.3}x | {:.3}x |",
        ours_wall / ans_wall,
        ours_cpu / ans_cpu.max(0.01)
    );
    println!(
        "verified: {hosts} fleet machines updated in place (same provider IDs, no create or delete), every machine on both sides reads back v2 and history v1, v2"
    );
    Ok(())
}
