//! Claims a server of a Redfish pool, seeds it with a cloud-config through the composer,
//! powers it on, then releases it.
//!
//! ```text
//! cargo run -p provider-baremetal --example redfish -- --pool pool.yaml [--name web-1] [--keep]
//! ```
//!
//! The pool YAML is [`provider_baremetal::RedfishPoolConfig`]'s. Without `--keep` the
//! server is powered off, ejected and released at the end.

use std::sync::Arc;

use anyhow::Context;
use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, WriteFile};
use machine_core::{CancellationToken, Composer, MachineName, MachineProvisioner, MachineSpec};
use provider_baremetal::{RedfishPoolConfig, RedfishProvider};
use provider_http::HttpSettings;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let (mut pool, mut name, mut keep) = (None, "redfish-example".to_owned(), false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--pool" => pool = args.next(),
            "--name" => name = args.next().context("--name needs a value")?,
            "--keep" => keep = true,
            other => anyhow::bail!(
                "unknown argument {other:?}; usage: --pool FILE [--name NAME] [--keep]"
            ),
        }
    }
    let pool = pool.context("usage: --pool FILE [--name NAME] [--keep]")?;
    let yaml = std::fs::read_to_string(&pool).with_context(|| format!("reading {pool}"))?;
    let config = RedfishPoolConfig::from_yaml(&yaml)?;
    let provider = Arc::new(RedfishProvider::new(config, &HttpSettings::default()).await?);

    // Coupled software: rendered into the seed's user-data, applied by cloud-init on boot.
    let base = Arc::new(CloudConfigLayer::new(
        "base",
        CloudConfig::new().with_file(WriteFile::new(
            "/etc/motd",
            "Provisioned by machine-core through a Redfish BMC.\n",
        )),
    )?);
    let composer = Composer::builder(provider.clone()).coupled(base).build()?;
    let spec = MachineSpec::new(MachineName::new(name)?);
    let cancel = CancellationToken::new();
    let done = composer.provision(&spec, &cancel).await?;
    println!(
        "{} is {} ({})",
        done.machine.name, done.machine.provider_id, done.machine.phase
    );
    // Without a completion check the composer could not see cloud-init finish, so it
    // left the seed served; the machine is up, so withdraw it.
    provider.bootstrap_finished(&done.machine).await?;
    if !keep {
        composer.deprovision(&spec.name, &cancel).await?;
        println!("{} released", spec.name);
    }
    Ok(())
}
