//! `quickstart --local`: the same three machines (coupled, decoupled, mixed) as real
//! machines on this host (provider-local), with what each got read back from the
//! machine itself over SSH. Needs root and the Debian root built by
//! `scripts/peers/40-local-root.sh`.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, CloudInitStatus, User, WriteFile};
use bootstrap_ssh::{Auth, HostKeyPolicy, SshConfig, SshConnector};
use examples::{print_progress, timeline_table};
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, Composer, ComposerSettings, Connector, EventSink, ExecRequest, FleetSpec,
    SshAccess,
};
use provider_local::{LocalConfig, LocalProvider};

const FLEET: &str = "
machines:
  - name: coupled-1
    labels: {mode: coupled}
  - name: decoupled-1
    labels: {mode: decoupled}
  - name: mixed-1
    labels: {mode: mixed}
";

/// What each machine is asked, to show what it got.
const READ_BACK: &str =
    "cat /etc/motd; id ops; cat /opt/hello/hello.txt /opt/hello/python.txt; cloud-init status";

/// Deletes every machine, the bridge and the run directory when dropped, also when
/// the quickstart fails half-way.
struct Teardown(Arc<LocalProvider>);

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Err(e) = self.0.teardown() {
            eprintln!("tearing down {} failed: {e}", self.0);
        }
    }
}

/// Runs the local quickstart.
pub async fn run() -> anyhow::Result<()> {
    // A bridge, subnet and run directory of this run's own.
    let tag = format!("{:04x}", std::process::id() & 0xffff);
    let config = LocalConfig::new("quickstart")
        .with_bridge(format!("mpq{tag}"))
        .with_subnet(format!("10.213.{}.0/24", 100 + std::process::id() % 150))
        .with_run_dir(format!("/run/machine-provisioning/quickstart-{tag}"));
    let provider = Arc::new(
        LocalProvider::new(config)
            .context("provider-local (run as root, after scripts/peers/40-local-root.sh)")?,
    );
    let _teardown = Teardown(provider.clone());

    // A client key for this run; the machines' host keys are pinned from what the
    // provider reports, so known_hosts stays empty.
    let keys = tempfile::tempdir()?;
    let key = keys.path().join("id_ed25519");
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "quickstart", "-f"])
        .arg(&key)
        .status()
        .context("ssh-keygen (apt-get install openssh-client)")?;
    anyhow::ensure!(made.success(), "ssh-keygen failed");
    let public = std::fs::read_to_string(key.with_extension("pub"))?
        .trim()
        .to_owned();
    let known_hosts = keys.path().join("known_hosts");
    std::fs::write(&known_hosts, "")?;
    let connector = Arc::new(SshConnector::new(
        SshConfig::new(vec![Auth::key_file(&key, None)?]).with_host_keys(HostKeyPolicy::Verify {
            known_hosts: Some(known_hosts),
        }),
    ));

    let base_cloud_init = Arc::new(CloudConfigLayer::new(
        "base",
        CloudConfig::new()
            .with_user(User::new("ops"))
            .with_file(WriteFile::new(
                "/etc/motd",
                "Provisioned by machine-core (cloud-init).\n",
            )),
    )?);
    let base_steps = Arc::new(StepLayer::new(
        "base",
        vec![
            Step::write_file("/etc/motd", "Provisioned by machine-core (over SSH).\n"),
            Step::run("id ops >/dev/null 2>&1 || useradd --create-home ops"),
        ],
    )?);
    let app = Arc::new(StepLayer::new(
        "app",
        vec![
            Step::write_file("/opt/hello/hello.txt", "hello from the app layer\n"),
            Step::run(
                "python3 -c 'import sys; print(sys.version.split()[0])' > /opt/hello/python.txt",
            ),
        ],
    )?);

    let events = EventSink::default();
    let settings = ComposerSettings::default().with_poll_interval(Duration::from_millis(100));
    let build = |mode: &str| -> anyhow::Result<Composer> {
        let b = Composer::builder(provider.clone())
            .settings(settings.clone())
            .events(events.clone())
            .connector(connector.clone())
            .completion(Arc::new(CloudInitStatus::new()));
        let b = match mode {
            "coupled" => b.coupled(base_cloud_init.clone()).coupled(app.clone()),
            "decoupled" => b.decoupled(base_steps.clone()).decoupled(app.clone()),
            _ => b.coupled(base_cloud_init.clone()).decoupled(app.clone()),
        };
        Ok(b.build()?)
    };

    let mut fleet = FleetSpec::from_yaml(FLEET)?;
    for spec in &mut fleet.machines {
        spec.ssh = Some(SshAccess {
            user: "root".into(),
            authorized_keys: vec![public.clone()],
        });
    }
    println!(
        "Provisioning {} real machines on {provider} (coupled, decoupled, mixed)\n",
        fleet.machines.len()
    );
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
            (mode, out)
        }));
    }
    let mut done = Vec::new();
    for run in runs {
        let (mode, out) = run.await?;
        for r in out? {
            let p = r
                .outcome
                .with_context(|| format!("provisioning {}", r.name))?;
            done.push((mode.clone(), p));
        }
    }
    stop.cancel();
    printer.await?;

    println!("\nWhere the time went:");
    print!("{}", timeline_table(&done));

    println!("\nWhat each machine got (read from the machine over SSH):");
    for (mode, p) in &done {
        let m = &p.machine;
        let ssh = m.access.ssh.as_ref().context("SSH endpoint")?;
        println!(
            "{} ({mode}, {}, {}@{}, host key pinned: {})",
            m.name,
            m.provider_id,
            ssh.user,
            ssh.host,
            m.access
                .host_keys
                .first()
                .map_or("none", |k| &k[..k.len().min(40)])
        );
        let t = connector.connect(m).await?;
        let out = t.exec(&ExecRequest::new(READ_BACK)).await?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            println!("  {line}");
        }
    }

    println!("\nTearing down:");
    let names: Vec<_> = done.iter().map(|(_, p)| p.machine.name.clone()).collect();
    let teardown = Composer::builder(provider.clone())
        .settings(settings)
        .build()?;
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
