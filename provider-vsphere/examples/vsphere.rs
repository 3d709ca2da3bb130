//! Provisions a small fleet of vCenter VMs through the composer, with a cloud-init
//! layer delivered in guestinfo, prints progress and each machine's timeline, scrubs
//! the user data of every Ready machine, and tears the fleet down unless `--keep`.
//!
//! Against vcsim (see scripts/peers/50-vcsim.sh; it prints its URL and certificate
//! fingerprint, and makes `DC0/vm/DC0_H0_VM1` a template):
//!
//! ```sh
//! /opt/vcsim3/vcsim > /tmp/vcsim.url & sleep 1
//! read url fp < /tmp/vcsim.url
//! VSPHERE_URL=$url VSPHERE_PINNED_SHA256=$fp VSPHERE_USERNAME=u VSPHERE_PASSWORD=p \
//!   VSPHERE_DATACENTER=DC0 PROVIDER_VSPHERE_TEMPLATE=DC0/vm/DC0_H0_VM1 \
//!   PROVIDER_VSPHERE_RESOURCE_POOL=DC0/host/DC0_H0/Resources \
//!   cargo run -p provider-vsphere --example vsphere -- --vcsim-tools
//! ```
//!
//! A machine runs once its guest has reported an address, which VMware Tools does in
//! a booted guest; vcsim runs no guest, so `--vcsim-tools` starts the tests' stand-in,
//! which reports one for every powered-on VM (with the pinned certificate).
//!
//! Against a real vCenter, the same variables (`VSPHERE_CA_FILE` instead of the pin if
//! its CA is at hand), without `--vcsim-tools`. Flags: `--count N` (default 3), `--keep`.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, WriteFile};
use machine_core::decorators::Retrying;
use machine_core::{
    CancellationToken, Composer, ComposerSettings, MachineName, MachineProvisioner, MachineSpec,
    RetryPolicy,
};
use provider_vsphere::{VsphereConfig, VsphereProvider};

/// The tests' VMware Tools stand-in, for `--vcsim-tools`.
#[path = "../tests/common/mod.rs"]
mod common;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let (mut count, mut keep, mut tools) = (3usize, false, false);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--keep" => keep = true,
            "--vcsim-tools" => tools = true,
            "--count" => count = it.next().context("--count needs a number")?.parse()?,
            other => bail!("unknown argument {other:?} (try --count N, --keep, --vcsim-tools)"),
        }
    }
    let config = VsphereConfig::from_env()
        .owner("example-vsphere")
        .build()
        .context(
            "VSPHERE_URL, VSPHERE_USERNAME, VSPHERE_PASSWORD and VSPHERE_DATACENTER are needed",
        )?;
    println!("provisioning {count} VM(s) at {}", config.sdk_url());
    let _tools = if tools {
        let fingerprint = std::env::var("VSPHERE_PINNED_SHA256")
            .context("--vcsim-tools needs VSPHERE_PINNED_SHA256")?
            .parse()?;
        let admin = common::admin::Admin::login_at(config.sdk_url(), fingerprint).await;
        Some(common::tools::Tools::watch(admin).await)
    } else {
        None
    };
    let provider = Arc::new(VsphereProvider::new(config)?);
    let layer = CloudConfigLayer::new(
        "base",
        CloudConfig::new()
            .with_file(WriteFile::new(
                "/etc/motd",
                "provisioned by machine-provisioning\n",
            ))
            .with_runcmd("echo base layer applied > /var/tmp/base-layer"),
    )?;
    let composer = Composer::builder(Arc::new(Retrying::new(
        provider.clone(),
        RetryPolicy::default(),
    )))
    .coupled(Arc::new(layer))
    .settings(ComposerSettings::default().with_poll_interval(Duration::from_millis(500)))
    .build()?;
    let mut events = composer.events().subscribe();
    let started = Instant::now();
    let printer = tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            let t = started.elapsed().as_secs_f64();
            println!(
                "{t:>7.2}s  {:<12} {:<13} {}",
                e.machine,
                e.phase.to_string(),
                e.message
            );
        }
    });
    let specs = (1..=count)
        .map(|i| Ok(MachineSpec::new(MachineName::new(format!("example-{i}"))?)))
        .collect::<machine_core::Result<Vec<_>>>()?;
    let cancel = CancellationToken::new();
    let concurrency = NonZeroUsize::new(4).expect("4 > 0");
    let results = composer
        .provision_fleet(&specs, concurrency, &cancel)
        .await?;
    let mut failed = 0;
    for r in &results {
        match &r.outcome {
            Ok(done) => {
                // Without a completion check the composer cannot see cloud-init finish,
                // so it leaves the user data in place; once the operator knows the
                // machine booted, this scrubs it.
                provider.bootstrap_finished(&done.machine).await?;
                println!(
                    "ready    {} {} ({})",
                    r.name, done.machine.provider_id, done.timeline
                );
            }
            Err(e) => {
                failed += 1;
                println!("failed   {}: {e}", r.name);
            }
        }
    }
    if keep {
        println!("--keep: leaving the VMs");
    } else {
        let names: Vec<_> = specs.iter().map(|s| s.name.clone()).collect();
        for (name, r) in composer
            .deprovision_fleet(&names, concurrency, &cancel)
            .await
        {
            match r {
                Ok(()) => println!("deleted  {name}"),
                Err(e) => println!("delete of {name} failed: {e}"),
            }
        }
    }
    provider.logout().await?;
    drop(composer);
    printer.abort();
    if failed > 0 {
        bail!("{failed} machine(s) failed");
    }
    Ok(())
}
