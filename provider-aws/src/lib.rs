//! # provider-aws
//!
//! EC2 instances as machines: [`AwsProvider`] implements
//! [`machine_core::MachineProvisioner`] with the official `aws-sdk-ec2`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use machine_core::decorators::Retrying;
//! use machine_core::{MachineName, MachineProvisioner, MachineSpec, RetryPolicy};
//! use provider_aws::{AwsConfig, AwsProvider};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> machine_core::Result<()> {
//! let config = AwsConfig::from_env()          // AWS_REGION, AWS_ENDPOINT_URL, ...
//!     .owner("ci-cluster")
//!     .image("ami-0123456789abcdef0")
//!     .build()?;
//! let provider = Retrying::new(AwsProvider::new(config).await?, RetryPolicy::default());
//! let spec = MachineSpec::new(MachineName::new("web-1")?)
//!     .with_size("t3.small")
//!     .with_provider(serde_json::json!({"subnetId": "subnet-0a1b2c3d4e5f60718"}));
//! let machine = provider.create(&spec, None).await?;
//! println!("{} is {}", machine.provider_id, machine.phase);
//! # Ok(())
//! # }
//! ```
//!
//! The same configuration can be kept in a YAML file and read with
//! [`AwsConfig::from_yaml`], which, like [`AwsConfig::from_env`], returns the builder so
//! that code can still override fields before `build` checks them:
//!
//! ```
//! use provider_aws::AwsConfig;
//!
//! let config = AwsConfig::from_yaml(
//!     "region: eu-west-1\n\
//!      owner: ci-cluster\n\
//!      image: ami-0123456789abcdef0\n\
//!      defaults: {subnetId: subnet-0a1b2c3d4e5f60718, sshUser: admin}\n\
//!      attemptTimeout: 20s\n",
//! )?
//! .build()?;
//! assert_eq!(config.defaults().ssh_user.as_deref(), Some("admin"));
//! # Ok::<(), machine_core::Error>(())
//! ```
//!
//! ## Rooms
//! [`config`] (how to reach EC2, defaults), [`settings`] (per-machine settings from
//! `MachineSpec::provider`), `client` (the SDK calls, DescribeInstances paged by
//! `NextToken`), [`provider`] (the trait), `errors` (EC2 codes to
//! [`machine_core::ErrorKind`]), [`hostkeys`] (host keys from the console), [`tags`]
//! (how machines are marked and found), `instance` (an instance as a machine), `token`
//! (the RunInstances client token), `view` (one listing of the owner's instances shared
//! by many name lookups). The SDK's types appear in none of the public ones.
//!
//! ## Identity and idempotency
//! Every instance is tagged with its name (`Name`), the owner and the library's marker
//! (see [`tags`]); its volumes get the same tags. `create` first looks the name up by
//! those tags, in a listing of the owner's instances made after the call began (one
//! listing serves every lookup that asks meanwhile), and returns a live instance it
//! finds: a second create, or a create by a new process after a crash, adopts the
//! machine. Only when there is none does it call RunInstances, with a `ClientToken` of
//! owner and name and a generation (not of the spec): real EC2 answers a repeated
//! launch with the first instance even while its eventually consistent
//! DescribeInstances cannot show it yet, and refuses a second controller launching the
//! name with another spec, which gets a conflict error. A recreate after a delete
//! continues the generations of the tokens it sees, so it costs one launch. moto ignores
//! ClientToken; the tag lookup and the race check after a launch (the oldest instance of
//! a name wins) carry idempotency there. Whatever made a duplicate (a race, a launch
//! from outside, a process killed between its launch and its race check), the next
//! create, `find` or delete of the name terminates it, keeping the one instance every
//! replica would keep; `list` reports duplicates with the `Duplicates` condition.
//! Provider IDs are `aws:///<zone>/<instance-id>`.
//!
//! ## Retries: one layer decides
//! The SDK makes **one attempt per API call** (its standard retry mode with
//! `max_attempts = 1`, [`AwsConfigBuilder::sdk_max_attempts`]), and every retry is
//! decided above the provider, by [`machine_core::decorators::Retrying`] (outermost)
//! and the composer's own loop, from the [`machine_core::ErrorKind`] that `errors`
//! assigns. Why this way round and not the SDK's retries:
//! - retries at two levels multiply (3 SDK attempts under 6 decorator attempts are 18
//!   requests against a throttling API);
//! - a retried `create` re-runs the tag lookup before launching again, so a
//!   RunInstances whose answer was lost is adopted, not repeated; the SDK would resend
//!   RunInstances blind, which duplicates the instance wherever ClientToken is not
//!   honoured (moto; or after the token's terms change);
//! - `InvalidInstanceID.NotFound` right after create is worth retrying only for ids
//!   this provider just made, which the SDK cannot know
//!   ([`AwsConfigBuilder::consistency_window`]);
//! - one [`machine_core::RetryPolicy`] governs every provider of the project, with
//!   jitter and the throttling hint (`retry_after`) honoured.
//!
//! A caller that does not wrap the provider in `Retrying` may raise
//! `sdk_max_attempts` instead; it must not do both.
//!
//! ## Pacing: the SDK's adaptive rate limiter
//! EC2 throttles each API with a token bucket of its own (RunInstances: 5 requests at
//! once, 2 a second after). The client runs in the SDK's adaptive retry mode, whose
//! client-side rate limiter starts pacing after the first `RequestLimitExceeded` and
//! probes back up (CUBIC) as calls succeed; it only delays sends, so the attempt count
//! above stays as configured. RunInstances, TerminateInstances, StartInstances,
//! StopInstances and RebootInstances each have their own limiter, the `Describe*` and
//! `Get*` calls share one: a throttled launch does not slow the fleet's lookups. A
//! fleet of 1,000 through EC2's buckets converges with no failure and 5-10 throttled
//! launches in a hundred (tests/fleet.rs).
//!
//! ## Limits checked before any call
//! User data over 16,384 bytes (counted before base64, as EC2 counts; gzip-compressed
//! data counts compressed), a missing or malformed image, instance type, subnet or
//! security group id, a malformed instance profile or root volume, and tags over EC2's
//! limits (50 per resource, keys of 128 and values of 256 characters) are invalid-spec
//! errors naming the field, before any request is sent.

pub mod config;
pub mod hostkeys;
pub mod provider;
pub mod secrets;
pub mod settings;
pub mod tags;

// Modules whose functions take or return the SDK's types stay private, so that this
// crate's API (and semver) does not follow aws-sdk-ec2's.
mod client;
mod errors;
mod instance;
mod redact;
mod token;
mod view;

pub use config::{
    AwsConfig, AwsConfigBuilder, ClientTokens, CredentialSource, DEFAULT_INSTANCE_TYPE,
};
pub use provider::{AwsProvider, USER_DATA_LIMIT};
pub use secrets::{SecretsManagerCalls, SecretsManagerSettings, SecretsManagerStore};
pub use settings::{Ec2Settings, RootVolume};
