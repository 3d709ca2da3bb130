//! Provisions a small fleet on EC2 through the composer, with a cloud-init layer (a
//! typed cloud-config from bootstrap-cloudinit) rendered into user data, prints
//! progress, and tears the fleet down unless `--keep` is given.
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
//! Or with the whole provider configuration in a YAML file ([`AwsConfig::from_yaml`]);
//! the environment is then not read, save by the credential chain when the file has no
//! `credentials`:
//!
//! ```sh
//! cat > aws.yaml <<'YAML'
//! region: us-east-1
//! endpointUrl: http://127.0.0.1:5000
//! image: ami-760aaa0f
//! credentials: {accessKeyId: testing, secretAccessKey: testing}
//! YAML
//! cargo run --example aws -- --config aws.yaml
//! ```
//!
//! Flags: `--count N` (default 3), `--keep` (leave the machines running),
//! `--owner NAME` (default `example-aws`; with `--config`, the file's `owner`),
//! `--config FILE` (an [`AwsConfig`] YAML document instead of the environment).

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bootstrap_cloudinit::{CloudConfig, CloudConfigLayer, WriteFile};
use machine_core::decorators::Retrying;
use machine_core::{
    CancellationToken, Composer, ComposerSettings, MachineName, MachineSpec, RetryPolicy,
    SecretString,
};
use provider_aws::{AwsConfig, AwsProvider};

struct Args {
    count: usize,
    keep: bool,
    owner: Option<String>,
    config: Option<PathBuf>,
}

fn args() -> Result<Args> {
    let mut out = Args {
        count: 3,
        keep: false,
        owner: None,
        config: None,
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
            "--owner" => out.owner = Some(it.next().context("--owner needs a name")?),
            "--config" => out.config = Some(it.next().context("--config needs a file")?.into()),
            other => bail!(
                "unknown argument {other:?} (try --count N, --keep, --owner NAME, --config FILE)"
            ),
        }
    }
    if out.count == 0 {
        bail!("--count must be at least 1");
    }
    Ok(out)
}

/// The provider's configuration from a YAML file: all of it, no environment. A
/// plain-http endpoint is taken for a local simulator (EC2's endpoints are all https).
fn config_from_file(path: &Path, owner: Option<&str>) -> Result<(AwsConfig, bool)> {
    let yaml =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut config =
        AwsConfig::from_yaml(&yaml).with_context(|| format!("in {}", path.display()))?;
    if let Some(owner) = owner {
        config = config.owner(owner);
    }
    let config = config
        .build()
        .with_context(|| format!("in {}", path.display()))?;
    if config.image().is_none() {
        bail!("{} names no image: add `image: ami-...`", path.display());
    }
    let simulator = config
        .endpoint_url()
        .is_some_and(|url| url.starts_with("http://"));
    Ok((config, simulator))
}

/// The provider's configuration from the environment; `AWS_ENDPOINT_URL` means a
/// simulator, for which what moto accepts is filled in when unset.
fn config_from_env(owner: Option<&str>) -> Result<(AwsConfig, bool)> {
    let simulator = std::env::var("AWS_ENDPOINT_URL").is_ok();
    let mut config = AwsConfig::from_env().owner(owner.unwrap_or("example-aws"));
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
            "against real AWS, set PROVIDER_AWS_IMAGE to an AMI of your region (or AWS_ENDPOINT_URL to use moto, or --config FILE)"
        );
    }
    Ok((config.build()?, simulator))
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = args()?;

    // A simulator answers at once: poll it often.
    let (config, simulator) = match &args.config {
        Some(path) => config_from_file(path, args.owner.as_deref())?,
        None => config_from_env(args.owner.as_deref())?,
    };
    println!(
        "provisioning {} machine(s) in {} for owner {:?} ({})",
        args.count,
        config.region(),
        config.owner(),
        config.endpoint_url().unwrap_or("real EC2")
    );

    let provider = AwsProvider::new(config).await?;
    let provider = Arc::new(Retrying::new(provider, RetryPolicy::default()));
    // A coupled layer: a cloud-config rendered into user data, applied by cloud-init at
    // first boot. The composer checks it against EC2's user-data limit before any call.
    let base = CloudConfigLayer::new(
        "base",
        CloudConfig::new()
            .with_file(WriteFile::new(
                "/etc/motd",
                "provisioned by machine-provisioning\n",
            ))
            .with_runcmd("echo base layer applied > /var/tmp/base-layer"),
    )?;
    println!(
        "coupled layer {:?}: {} bytes of cloud-config",
        base.layer_name(),
        base.size()
    );
    let settings = ComposerSettings::default().with_poll_interval(if simulator {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(5)
    });
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
