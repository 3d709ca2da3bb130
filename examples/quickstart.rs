//! The quickstart: a small fleet on the built-in simulator, bootstrapped in all three
//! modes, with live progress and a timeline per machine. No cloud account, nothing to
//! install:
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! - coupled: the software is rendered into user data (a cloud-config layer and a
//!   script layer) and injected at creation; the
//!   composer waits for the bootstrap sentinel file;
//! - decoupled: the machine boots bare; the software is applied over a transport;
//! - mixed: a base layer coupled, an application layer decoupled.
//!
//! The decoupled machine can be a real host instead: give an inventory of existing hosts
//! (provider-baremetal's static hosts) and the SSH flags of the `ssh` example. It then
//! claims a host of the inventory, applies a harmless layer over SSH (a file under
//! `/var/tmp/machine-core-quickstart`, `uname`), shows the file and releases the host.
//!
//! ```text
//! cargo run --example quickstart -- --hosts inventory.yaml [--key PATH | --agent]
//!     [--known-hosts PATH] [--accept-new | --insecure]
//! ```
//!
//! Or all three as real machines on this host (provider-local; as root, after
//! `scripts/peers/40-local-root.sh`), with what each got read back over SSH:
//!
//! ```text
//! cargo run --example quickstart -- --local
//! ```

#[path = "quickstart_local.rs"]
mod local;

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, User, WriteFile};
use bootstrap_ssh::SshConnector;
use examples::{SSH_USAGE, SshFlags, print_progress, timeline_table};
use machine_core::sim::{SimCloud, SimConfig, SimConnector, SimProvider};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, Composer, ComposerSettings, Connector, EventSink, FleetSpec,
    MachineProvisioner, SentinelFile,
};
use provider_baremetal::{StaticHostsConfig, StaticHostsProvider};

const FLEET: &str = "
machines:
  - name: coupled-1
    image: debian-12
    labels: {mode: coupled}
  - name: decoupled-1
    image: debian-12
    labels: {mode: decoupled}
    ssh: {user: ops}
  - name: mixed-1
    image: debian-12
    labels: {mode: mixed}
    ssh: {user: ops}
";

/// Where the layer applied to a real host writes, and keeps its step state: a place any
/// user may write and that nothing else uses.
const REAL_HOST_DIR: &str = "/var/tmp/machine-core-quickstart";

/// The decoupled machine on a real host: the inventory's provider and the SSH connector.
struct RealHosts {
    provider: Arc<StaticHostsProvider>,
    connector: Arc<SshConnector>,
}

/// `--hosts FILE` and the SSH flags, or nothing for the all-simulated quickstart.
fn real_hosts() -> anyhow::Result<Option<RealHosts>> {
    let mut ssh = SshFlags::default();
    let mut hosts: Option<PathBuf> = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if ssh.take(&a, &mut it)? {
            continue;
        }
        match a.as_str() {
            "--hosts" => hosts = Some(it.next().context("--hosts needs a file")?.into()),
            "-h" | "--help" => {
                println!("usage: quickstart [--local | --hosts INVENTORY.yaml {SSH_USAGE}]");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (see --help)"),
        }
    }
    let Some(path) = hosts else {
        return Ok(None);
    };
    let yaml = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the inventory {}", path.display()))?;
    let inventory = StaticHostsConfig::from_yaml(&yaml)
        .with_context(|| format!("in the inventory {}", path.display()))?;
    let connector = Arc::new(SshConnector::new(ssh.config()?));
    let provider = Arc::new(StaticHostsProvider::new(inventory, connector.clone())?);
    Ok(Some(RealHosts {
        provider,
        connector,
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    if std::env::args().nth(1).as_deref() == Some("--local") {
        return local::run().await;
    }
    let real = real_hosts()?;

    // The simulated cloud: machines take 0.5 to 1.5 s to boot.
    let cloud = SimCloud::new();
    let provider: Arc<dyn MachineProvisioner> = Arc::new(SimProvider::new(
        cloud.clone(),
        SimConfig::default()
            .with_owner("quickstart")
            .with_boot_latency(Duration::from_millis(500))
            .with_boot_jitter(Duration::from_millis(1000))
            .with_delete_latency(Duration::from_millis(200)),
    )?);
    // Every command or upload over the simulated transport takes 50 ms, like a round trip.
    let connector =
        Arc::new(SimConnector::new(cloud.clone()).with_latency(Duration::from_millis(50)));

    // The base layer as cloud-init user data, for machines that get it at creation ...
    let base_cloud_init = Arc::new(CloudConfigLayer::new(
        "base",
        CloudConfig::new()
            .with_user(User::admin("ops", Vec::<String>::new()))
            .with_file(WriteFile::new(
                "/etc/motd",
                "Provisioned by machine-core.\n",
            ))
            .with_runcmd("systemctl enable --now ssh"),
    )?);
    // ... and the same base as steps run over a connection, for machines that boot bare.
    let base_steps = Arc::new(StepLayer::new(
        "base",
        vec![
            Step::write_file("/etc/motd", "Provisioned by machine-core.\n"),
            Step::run("useradd --create-home ops"),
        ],
    )?);
    // The application layer: steps that work either way.
    let app = Arc::new(StepLayer::new(
        "app",
        vec![
            Step::write_file_mode(
                "/opt/hello/run.sh",
                "#!/bin/sh\nexec python3 -m http.server --bind 127.0.0.1 --directory /opt/hello 8080\n",
                0o755,
            ),
            Step::run("systemd-run --unit hello /opt/hello/run.sh"),
        ],
    )?);

    // What a real host gets instead: harmless, idempotent, and readable afterwards.
    let hello = Arc::new(
        StepLayer::new(
            "hello",
            vec![
                Step::write_file(
                    format!("{REAL_HOST_DIR}/hello.txt"),
                    "Provisioned by machine-core's quickstart.\n",
                ),
                Step::run("uname -srm"),
            ],
        )?
        .with_state_dir(format!("{REAL_HOST_DIR}/state"))?,
    );

    // One composer per mode, all on one event stream; all on the simulator unless the
    // decoupled machine goes to a real host.
    let events = EventSink::default();
    let settings = ComposerSettings::default().with_poll_interval(Duration::from_millis(100));
    let build = |label: &str| -> anyhow::Result<Composer> {
        if let (Some(real), "decoupled") = (&real, label) {
            return Ok(Composer::builder(real.provider.clone())
                .settings(settings.clone())
                .events(events.clone())
                .connector(real.connector.clone())
                .decoupled(hello.clone())
                .build()?);
        }
        let b = Composer::builder(provider.clone())
            .settings(settings.clone())
            .events(events.clone())
            .connector(connector.clone());
        let b = match label {
            "coupled" => b
                .coupled(base_cloud_init.clone())
                .coupled(app.clone())
                .completion(Arc::new(SentinelFile::default())),
            "decoupled" => b.decoupled(base_steps.clone()).decoupled(app.clone()),
            _ => b
                .coupled(base_cloud_init.clone())
                .decoupled(app.clone())
                .completion(Arc::new(SentinelFile::default())),
        };
        Ok(b.build()?)
    };

    let fleet = FleetSpec::from_yaml(FLEET)?;
    match &real {
        None => println!(
            "Provisioning {} machines on the simulator (coupled, decoupled, mixed)\n",
            fleet.machines.len()
        ),
        Some(r) => println!(
            "Provisioning {} machines: coupled and mixed on the simulator, decoupled on {}\n",
            fleet.machines.len(),
            r.provider
        ),
    }
    let start = SystemTime::now();
    let stop = CancellationToken::new();
    let printer = print_progress(&events, start, stop.clone());

    let cancel = CancellationToken::new();
    let mut runs = Vec::new();
    for spec in &fleet.machines {
        let mode = spec.labels["mode"].clone();
        let composer = build(&mode)?;
        let spec = spec.clone();
        let cancel = cancel.clone();
        runs.push(tokio::spawn(async move {
            let out = composer
                .provision_fleet(std::slice::from_ref(&spec), NonZeroUsize::MIN, &cancel)
                .await;
            (mode, composer, out)
        }));
    }
    let mut done = Vec::new();
    for run in runs {
        let (mode, composer, out) = run.await?;
        for r in out? {
            let p = r
                .outcome
                .with_context(|| format!("provisioning {}", r.name))?;
            done.push((mode.clone(), p));
        }
        drop(composer);
    }
    stop.cancel();
    printer.await?;

    println!("\nWhere the time went:");
    print!("{}", timeline_table(&done));

    println!("\nWhat each machine got:");
    for (mode, p) in &done {
        let id = &p.machine.provider_id;
        if let (Some(r), "decoupled") = (&real, mode.as_str()) {
            let ssh = p
                .machine
                .access
                .ssh
                .as_ref()
                .context("the host's SSH endpoint")?;
            println!(
                "{} ({mode}, {id}, {}@{}:{})",
                p.machine.name, ssh.user, ssh.host, ssh.port
            );
            let path = format!("{REAL_HOST_DIR}/hello.txt");
            let t = r.connector.connect(&p.machine).await?;
            let text = t.read_file(&path, 4096).await?.unwrap_or_default();
            println!("  file: {path}: {}", String::from_utf8_lossy(&text).trim());
            continue;
        }
        let user_data = provider.user_data(id).await?;
        let host = cloud.host(id).context("simulated host")?;
        println!("{} ({mode}, {id})", p.machine.name);
        match user_data {
            Some(ud) => {
                println!(
                    "  user data: {:?}, {} bytes, sha256 {}",
                    ud.format,
                    ud.bytes.len(),
                    ud.short_hash()
                );
                let text = String::from_utf8_lossy(&ud.decoded()?).into_owned();
                for part in text
                    .lines()
                    .filter(|l| l.starts_with("Content-Type: text/"))
                {
                    println!("    part {}", part.trim_start_matches("Content-Type: "));
                }
            }
            None => println!("  user data: none"),
        }
        for c in &host.commands {
            println!("  ran: {c}");
        }
        for (path, f) in host
            .files
            .iter()
            .filter(|(p, _)| !p.starts_with("/var/lib"))
        {
            println!("  file: {path} ({:o}, {} bytes)", f.mode, f.content.len());
        }
    }

    println!("\nTearing down:");
    let teardown = Composer::builder(provider.clone())
        .settings(settings.clone())
        .build()?;
    let mut names = Vec::new();
    for (mode, p) in &done {
        let name = p.machine.name.clone();
        match (&real, mode.as_str()) {
            (Some(r), "decoupled") => {
                // Releasing a real host frees its claim; its software stays.
                Composer::builder(r.provider.clone())
                    .settings(settings.clone())
                    .build()?
                    .deprovision(&name, &cancel)
                    .await
                    .with_context(|| format!("releasing {name}"))?;
                println!("  {name}: host {} released", p.machine.provider_id);
            }
            _ => names.push(name),
        }
    }
    for (name, r) in teardown
        .deprovision_fleet(
            &names,
            NonZeroUsize::new(8).unwrap_or(NonZeroUsize::MIN),
            &cancel,
        )
        .await
    {
        r.with_context(|| format!("deprovisioning {name}"))?;
        println!("  {name}: deleted");
    }
    Ok(())
}
