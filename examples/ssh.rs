//! Bootstraps existing hosts over SSH: detects each host's OS, then applies a small
//! step layer (a marker file and a command) with bounded concurrency, and prints each
//! host's result and timeline. Rerun it: finished steps are skipped.
//!
//! ```text
//! cargo run --example ssh -- [--user U] [--key PATH [--passphrase-env VAR] | --agent]
//!     [--known-hosts PATH] [--accept-new | --insecure] [--jump [USER@]HOST[:PORT]]
//!     [--sudo] [--concurrency N] HOST[:PORT]...
//! ```
//!
//! Host keys are verified against `~/.ssh/known_hosts` (or `--known-hosts PATH`);
//! `--accept-new` trusts and records the keys of hosts not in that file yet;
//! `--insecure` trusts any key and warns on every connection.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use bootstrap_ssh::{LayerRunner, SshConnector, SshTarget, os};
use examples::{SSH_USAGE, SshFlags};
use machine_core::steps::{Step, StepLayer};
use machine_core::{Access, Machine, MachineName, Phase, ProviderId, SshEndpoint};

struct Args {
    ssh: SshFlags,
    concurrency: usize,
    hosts: Vec<SshTarget>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut ssh = SshFlags::default();
    let (mut concurrency, mut hosts) = (16, Vec::new());
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if ssh.take(&a, &mut it)? {
            continue;
        }
        match a.as_str() {
            "--concurrency" => {
                concurrency = it
                    .next()
                    .context("--concurrency needs a value")?
                    .parse()
                    .context("--concurrency")?
            }
            "-h" | "--help" => {
                println!("usage: ssh {SSH_USAGE} [--concurrency N] HOST[:PORT]...");
                std::process::exit(0);
            }
            flag if flag.starts_with("--") => bail!("unknown option {flag}"),
            host => hosts.push(host.to_owned()),
        }
    }
    if hosts.is_empty() {
        bail!("give at least one HOST[:PORT] (see --help)");
    }
    let user = ssh.user();
    let hosts = hosts
        .iter()
        .map(|h| SshTarget::parse(h, &user))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Args {
        ssh,
        concurrency,
        hosts,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .init();
    let args = parse_args()?;
    let config = args.ssh.config()?;
    let machines: Vec<Machine> = args
        .hosts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut m = Machine::new(
                MachineName::new(format!("host-{}", i + 1))?,
                ProviderId::new(format!("static:///{}", t.address()))?,
                Phase::Provisioned,
            );
            m.access = Access::ssh(SshEndpoint::new(t.host.clone(), t.port, t.user.clone()));
            Ok(m)
        })
        .collect::<anyhow::Result<_>>()?;
    let user = args.ssh.user();
    let state_dir = if user == "root" || args.ssh.sudo {
        "/var/lib/machine-core/layers".to_owned()
    } else {
        format!("/home/{user}/.machine-core")
    };
    let layer = StepLayer::new(
        "bootstrap-ssh-example",
        vec![
            Step::write_file(
                format!("{state_dir}/bootstrap-ssh-example.txt"),
                "applied by the bootstrap-ssh example\n",
            ),
            Step::run("uname -srm"),
        ],
    )?
    .with_state_dir(state_dir)?;
    let connector = Arc::new(SshConnector::new(config));
    let runner = LayerRunner::new(connector.clone())
        .layer(Arc::new(layer))
        .concurrency(args.concurrency);
    let start = Instant::now();
    let reports = runner.run(&machines).await;
    let mut failed = 0;
    for ((m, r), target) in machines.iter().zip(&reports).zip(&args.hosts) {
        // A short second connection: the runner's closed when the machine was done.
        let os = match connector.connect_client(m).await {
            Ok(c) if r.result.is_ok() => os::detect(c.as_ref()).await.map(|o| {
                let pm = o
                    .package_manager()
                    .map_or_else(|| "unknown".to_owned(), |p| format!("{p:?}").to_lowercase());
                format!("{} (package manager {pm})", o.pretty_name.unwrap_or(o.id))
            }),
            _ => Ok("-".into()),
        };
        println!("{target}  os: {}", os.unwrap_or_else(|e| e.to_string()));
        println!("{r}");
        failed += usize::from(r.result.is_err());
    }
    println!(
        "{} hosts, {} failed, {:.2}s",
        reports.len(),
        failed,
        start.elapsed().as_secs_f64()
    );
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
