//! Provisions a small fleet on EC2 through the composer, with a coupled layer rendered
//! into user data, prints progress, and tears the fleet down unless `--keep` is given.
//!
//! Against moto (see scripts/peers/30-moto.sh):
//!
//! ```sh
//! ~/.cache/machine-provisioning/moto/bin/moto_server -H 127.0.0.1 -p 5000 &
//! AWS_ENDPOINT_URL=http://127.0.0.1:5000 cargo run --example aws
//! ```
//!
//! Against real AWS (credentials from the standard chain; the image must exist in the
//! region, the subnet and security group in the account):
//!
//! ```sh
//! AWS_REGION=eu-west-1 PROVIDER_AWS_IMAGE=ami-... PROVIDER_AWS_SUBNET_ID=subnet-... \
//!   cargo run --example aws -- --count 2 --keep
//! ```
//!
//! Flags: `--count N` (default 3), `--keep` (leave the machines running),
//! `--owner NAME` (default `example-aws`).

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use machine_core::decorators::Retrying;
use machine_core::steps::{Step, StepLayer};
use machine_core::{
    CancellationToken, Composer, ComposerSettings, MachineName, MachineSpec, RetryPolicy,
    SecretString,
};
use provider_aws::{AwsConfig, AwsProvider};

struct Args {
    count: usize,
    keep: bool,
    owner: String,
}

fn args() -> Result<Args> {
    let mut out = Args {
        count: 3,
        keep: false,
        owner: "example-aws".to_owned(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--keep" => out.keep = true,
            "--count" => {
                out.count = it
                    .next()
                    .context("--count needs a number")?
                    .parse()
                    .context("--count needs a number")?;
            }
            "--owner" => out.owner = it.next().context("--owner needs a name")?,
            other => bail!("unknown argument {other:?} (try --count N, --keep, --owner NAME)"),
        }
    }
    if out.count == 0 {
        bail!("--count must be at least 1");
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = args()?;

    // AWS_ENDPOINT_URL means a simulator: fill in what moto accepts when unset.
    let simulator = std::env::var("AWS_ENDPOINT_URL").is_ok();
    let mut config = AwsConfig::from_env().owner(&args.owner);
    if simulator {
        if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
            config = config.region("us-east-1");
        }
        if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
            config = config.static_credentials("testing", SecretString::from("testing"));
        }
        if std::env::var("PROVIDER_AWS_IMAGE").is_err() {
            config = config.image("ami-760aaa0f");
        }
    } else if std::env::var("PROVIDER_AWS_IMAGE").is_err() {
        bail!(
            "against real AWS, set PROVIDER_AWS_IMAGE to an AMI of your region (or AWS_ENDPOINT_URL to use moto)"
        );
    }
    let config = config.build()?;
    println!(
        "provisioning {} machine(s) in {} for owner {:?} ({})",
        args.count,
        config.region(),
        config.owner(),
        config.endpoint_url().unwrap_or("real EC2")
    );

    let provider = AwsProvider::new(config).await?;
    let provider = Arc::new(Retrying::new(provider, RetryPolicy::default()));
    // A coupled layer: rendered into user data, run by the image's init at first boot.
    let base = StepLayer::new(
        "base",
        vec![
            Step::write_file("/etc/motd", "provisioned by machine-provisioning\n"),
            Step::run("echo base layer applied > /var/tmp/base-layer"),
        ],
    )?;
    let settings = ComposerSettings {
        poll_interval: if simulator {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(5)
        },
        ..ComposerSettings::default()
    };
    let composer = Composer::builder(provider)
        .coupled(Arc::new(base))
        .settings(settings)
        .build()?;

    let mut events = composer.events().subscribe();
    let started = Instant::now();
    let printer = tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            println!(
                "{:>7.2}s  {:<14} {:<13} {}",
                started.elapsed().as_secs_f64(),
                e.machine,
                e.phase.to_string(),
                e.message
            );
        }
    });

    let specs = (1..=args.count)
        .map(|i| {
            Ok(MachineSpec::new(MachineName::new(format!("example-{i}"))?)
                .with_label("example", "aws"))
        })
        .collect::<machine_core::Result<Vec<_>>>()?;
    let cancel = CancellationToken::new();
    let results = composer
        .provision_fleet(&specs, NonZeroUsize::new(4).expect("4 > 0"), &cancel)
        .await?;
    let mut failed = 0;
    for r in &results {
        match &r.outcome {
            Ok(done) => {
                let addresses: Vec<String> = done
                    .machine
                    .addresses
                    .iter()
                    .map(|a| format!("{:?}={}", a.kind, a.address))
                    .collect();
                println!(
                    "ready    {} {} [{}] ({})",
                    r.name,
                    done.machine.provider_id,
                    addresses.join(", "),
                    done.timeline
                );
            }
            Err(e) => {
                failed += 1;
                println!("failed   {}: {e}", r.name);
            }
        }
    }

    if args.keep {
        println!("--keep: leaving the machines; delete them with this example without --keep");
    } else {
        let names: Vec<_> = specs.iter().map(|s| s.name.clone()).collect();
        for (name, r) in composer
            .deprovision_fleet(&names, NonZeroUsize::new(4).expect("4 > 0"), &cancel)
            .await
        {
            match r {
                Ok(()) => println!("deleted  {name}"),
                Err(e) => println!("delete of {name} failed: {e}"),
            }
        }
    }
    drop(composer);
    printer.abort();
    println!("done in {:.1}s", started.elapsed().as_secs_f64());
    if failed > 0 {
        bail!("{failed} machine(s) failed");
    }
    Ok(())
}
