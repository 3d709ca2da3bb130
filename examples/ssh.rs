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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use bootstrap_ssh::{
    Auth, HostKeyPolicy, JumpHost, LayerRunner, SshConfig, SshConnector, SshTarget, os,
};
use machine_core::steps::{Step, StepLayer};
use machine_core::{Access, Machine, MachineName, Phase, ProviderId, SecretString, SshEndpoint};

struct Args {
    user: String,
    auth: Vec<Auth>,
    policy: HostKeyPolicy,
    jump: Option<SshTarget>,
    sudo: bool,
    concurrency: usize,
    hosts: Vec<SshTarget>,
}

fn parse_args() -> anyhow::Result<Args> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let (mut key, mut pass_env, mut agent) = (None::<PathBuf>, None::<String>, false);
    let (mut known_hosts, mut accept_new, mut insecure) = (None::<PathBuf>, false, false);
    let (mut jump, mut sudo, mut concurrency, mut hosts) = (None, false, 16, Vec::new());
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--user" => user = val("--user")?,
            "--key" => key = Some(val("--key")?.into()),
            "--passphrase-env" => pass_env = Some(val("--passphrase-env")?),
            "--agent" => agent = true,
            "--known-hosts" => known_hosts = Some(val("--known-hosts")?.into()),
            "--accept-new" => accept_new = true,
            "--insecure" => insecure = true,
            "--jump" => jump = Some(val("--jump")?),
            "--sudo" => sudo = true,
            "--concurrency" => {
                concurrency = val("--concurrency")?.parse().context("--concurrency")?
            }
            "-h" | "--help" => {
                println!(
                    "usage: ssh [--user U] [--key PATH [--passphrase-env VAR] | --agent] [--known-hosts PATH] [--accept-new | --insecure] [--jump HOST] [--sudo] [--concurrency N] HOST[:PORT]..."
                );
                std::process::exit(0);
            }
            flag if flag.starts_with("--") => bail!("unknown option {flag}"),
            host => hosts.push(host.to_owned()),
        }
    }
    if hosts.is_empty() {
        bail!("give at least one HOST[:PORT] (see --help)");
    }
    let policy = match (insecure, accept_new) {
        (true, true) => bail!("--insecure and --accept-new exclude each other"),
        (true, false) => HostKeyPolicy::Insecure,
        (false, true) => HostKeyPolicy::AcceptNew {
            known_hosts: known_hosts
                .unwrap_or_else(|| PathBuf::from(&home).join(".ssh/known_hosts")),
        },
        (false, false) => HostKeyPolicy::Verify { known_hosts },
    };
    let passphrase = match pass_env {
        Some(var) => Some(SecretString::from(
            std::env::var(&var).with_context(|| format!("{var} is not set"))?,
        )),
        None => None,
    };
    let mut auth = Vec::new();
    if agent {
        auth.push(Auth::agent());
    }
    match key {
        Some(k) => auth.push(Auth::key_file(k, passphrase)?),
        None if !agent => {
            for name in ["id_ed25519", "id_ecdsa", "id_rsa"] {
                let p = PathBuf::from(&home).join(".ssh").join(name);
                if p.exists() {
                    auth.push(Auth::key_file(p, passphrase.clone())?);
                }
            }
        }
        None => {}
    }
    let hosts = hosts
        .iter()
        .map(|h| SshTarget::parse(h, &user))
        .collect::<Result<Vec<_>, _>>()?;
    let jump = jump.map(|j| SshTarget::parse(&j, &user)).transpose()?;
    Ok(Args {
        user,
        auth,
        policy,
        jump,
        sudo,
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
    let mut config = SshConfig::new(args.auth)
        .with_host_keys(args.policy)
        .with_sudo(args.sudo);
    if let Some(j) = args.jump {
        config = config.with_jump_host(JumpHost {
            target: j,
            pins: Vec::new(),
        });
    }
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
            m.access = Access {
                ssh: Some(SshEndpoint {
                    host: t.host.clone(),
                    port: t.port,
                    user: t.user.clone(),
                }),
                host_keys: Vec::new(),
            };
            Ok(m)
        })
        .collect::<anyhow::Result<_>>()?;
    let state_dir = if args.user == "root" || args.sudo {
        "/var/lib/machine-core/layers".to_owned()
    } else {
        format!("/home/{}/.machine-core", args.user)
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
        .layer(Arc::new(layer))?
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
