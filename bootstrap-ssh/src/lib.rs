//! # bootstrap-ssh
//!
//! The decoupled path of machine-core: software applied over SSH to machines that are
//! already running. [`SshClient`] implements machine-core's [`machine_core::Transport`]
//! (exec with bounded output, atomic uploads, file reads) and
//! [`SshConnector`] its [`machine_core::Connector`], so every decoupled layer runs over
//! SSH unchanged; [`LayerRunner`] applies layers to fleets through machine-core's
//! [`machine_core::Bootstrapper`], the composer's own software steps.
//!
//! Safe by default: host keys are verified (pinned keys from the machine's access info,
//! or a known_hosts file); trust on first use and no verification at all are explicit
//! opt-ins. Connects are retried while the machine may still be booting (refused, reset,
//! timed out) and fail at once on a host-key mismatch or failed authentication.
//!
//! Every command runs under a supervisor on the machine that owns it (see "Commands on
//! the machine" below): a timeout kills its whole
//! process group and says what it killed, a cut connection leaves it running, and the
//! same step again on the same machine (a request with the same
//! [`machine_core::ExecRequest::step`] key: a retry, a rerun of the step) waits for it
//! or takes over its outcome instead of starting it twice.
//!
//! The SSH protocol is russh's (pure Rust, aws-lc-rs crypto), kept behind this crate's
//! own types.
//!
//! # Commands on the machine
//!
//! A small POSIX sh supervisor (coreutils or busybox, no GNU-only flag) runs on a
//! channel of its own for as long as the connection lives and serves the connection's
//! requests one at a time over its stdin: commands, uploads and file reads. The
//! session, the login shell and the supervisor's shell are paid once per channel, not
//! once per command. A connection keeps up to two idle supervisors (plain and through
//! sudo each); concurrent requests each take one or start another, so every command
//! still has a process group of its own; [`SshClient::close`] ends them. Commands run
//! with the login's umask, with stdin from `/dev/null`, and outlive the SSH session:
//!
//! - **Run directory**: `/run/bootstrap-ssh` for root (and sudo), else
//!   `/tmp/bootstrap-ssh-<user>` (or [`SshConfig::with_run_dir`]); mode 0700,
//!   owned by that user, refused when it is a link or another user's. Nothing is
//!   executed from it, so a `noexec` mount is fine.
//! - **Run key**: a request with a step key ([`machine_core::ExecRequest::step`]) is
//!   named by a hash of the target (`host:port`), the user (root for sudo), the step
//!   key, the command and the names of its environment variables: the same step again
//!   on the same machine is the same run. A request without one gets a new name
//!   (`u...`) for every call, so identical commands at once (replicas reading one claim
//!   file) each run, and a read run again never takes an earlier call's outcome; a
//!   supervisor that could not deliver such a run (the connection cut) removes its
//!   records, as nobody else would collect them.
//! - **Records**: `<key>.run` (the supervisor's pid, start time, boot id, process group
//!   and the client's clock at the start; created with noclobber, so of two supervisors
//!   of one key exactly one runs the command), `<key>.out` / `<key>.err` (the last
//!   `max_output` bytes of each stream, through `tail -c`: bounded whatever the command
//!   prints, and a full disk fails the log, never the command), `<key>.rc` (its exit
//!   status, written over a placeholder) and `<key>.st` (the end, an empty file: a disk
//!   the logs filled cannot lose the outcome). Once a client has the outcome the run
//!   is marked collected (`<key>.ok`, naming the supervisor) and its logs emptied,
//!   with shell builtins; the supervisor removes its collected runs' files when it
//!   ends (one `rm` per connection instead of one per command), or the next run of
//!   the key does, under the key's lock (`<key>.t`, noclobber). Runs collected by a
//!   supervisor that a timeout killed are removed by the next one.
//! - **Secrets**: the request's secret environment values reach the command over
//!   stdin, never its command line; whatever the command prints of them (each value,
//!   and each line of a multi-line one) is masked (`***`, machine-core's
//!   [`machine_core::ExecRequest::mask_output`]) before the output is returned,
//!   logged or quoted in an error. The machine keeps the longest value's length more
//!   than `max_output`, so a value the bound cuts is masked whole, never shown in part.
//! - **A cut connection** leaves the command running (its input is /dev/null, its
//!   output goes to the logs, never to the session). The records stay until a client
//!   has read the outcome: the next run of the same step key (the composer's and the
//!   runner's retries, or any rerun of the step) waits for a live run, or takes over
//!   the outcome of a finished one (finished in this boot, started less than an hour
//!   ago by the client's clock), instead of starting another. A request without a step
//!   key run again is a new run.
//! - **A timeout** kills the run's whole process group by the recorded id, from a new
//!   channel, checks in `/proc` that none of it is left, and says what it killed (or
//!   what still runs). SSH signal requests are not used: sshd refuses them for root.
//!   The process group is the session sshd made for the supervisor's channel (sshd
//!   starts every channel's command with `setsid`), which runs one command at a
//!   time; POSIX sh cannot make a new group portably (`set -m` needs a terminal in
//!   dash and busybox), so the supervisor is killed with its command, the client
//!   closes its channel, and the killer removes the records; the next request starts
//!   another supervisor.
//! - **A restart of the machine** (boot id changed, `/run` emptied) or a supervisor
//!   killed by someone else (its pid gone or reused: start time changed) leaves a run
//!   without an outcome: the next run of the key runs the command again (a client
//!   that was waiting for that run reports it lost instead).
//!
//! # Algorithms, against OpenSSH 9's client defaults
//!
//! | | bootstrap-ssh | differences from OpenSSH 9 (`ssh -G`) |
//! |---|---|---|
//! | key exchange | mlkem768x25519-sha256, curve25519-sha256 (and @libssh.org), diffie-hellman-group-exchange-sha256, diffie-hellman-group18/17/16/15-sha512, diffie-hellman-group14-sha256 | no sntrup761x25519-sha512 and no ecdh-sha2-nistp256/384/521 (russh has neither); ML-KEM is OpenSSH 9.9's first choice; groups 17 and 15 (RFC 8268) are extra |
//! | ciphers | chacha20-poly1305, aes256-gcm, aes256/192/128-ctr | no aes128-gcm |
//! | MACs | hmac-sha2-512-etm, hmac-sha2-256-etm, hmac-sha2-512, hmac-sha2-256 | no UMAC, no hmac-sha1 (stricter) |
//! | host keys | ssh-ed25519, ecdsa-sha2-nistp256/384/521, rsa-sha2-512, rsa-sha2-256 | no `ssh-rsa` (SHA-1) unless [`SshConfig::with_ssh_rsa_sha1`], as OpenSSH 8.8+; certificates only when a `@cert-authority` line names the host; no security-key (`sk-`) host keys |
//!
//! RSA user keys sign with SHA-2 (SHA-1 only with the same opt-in).
//!
//! ```no_run
//! use std::sync::Arc;
//! use bootstrap_ssh::{Auth, HostKeyPolicy, LayerRunner, SshConfig, SshConnector};
//! use machine_core::steps::{Step, StepLayer};
//! # async fn run(machines: Vec<machine_core::Machine>) -> machine_core::Result<()> {
//! let config = SshConfig::new(vec![Auth::key_file("/root/.ssh/id_ed25519", None)?])
//!     .with_host_keys(HostKeyPolicy::Verify { known_hosts: None });
//! let layer = StepLayer::new("motd", vec![Step::write_file("/etc/motd", "managed\n")])?;
//! let runner = LayerRunner::new(Arc::new(SshConnector::new(config)))
//!     .layer(Arc::new(layer))
//!     .concurrency(20);
//! for report in runner.run(&machines).await {
//!     println!("{report}");
//! }
//! # Ok(())
//! # }
//! ```

mod auth;
mod client;
mod config;
mod connector;
mod errors;
mod exec;
mod hostkeys;
mod known_hosts;
pub mod os;
mod runner;
mod supervisor;
mod text;
mod upload;

pub use auth::Auth;
pub use client::SshClient;
pub use config::{JumpHost, SshConfig, SshTarget};
pub use connector::SshConnector;
pub use hostkeys::{HostKeyPin, HostKeyPolicy};
pub use runner::{HostReport, LayerRunner, wait_completion};

/// Generates a fresh ed25519 key pair, for tests and for pre-generating host keys to
/// pin: returns the private key in OpenSSH format and the public key line.
pub fn generate_ed25519() -> machine_core::Result<(machine_core::SecretString, String)> {
    let key = russh::keys::PrivateKey::random(
        &mut russh::keys::key::safe_rng(),
        russh::keys::Algorithm::Ed25519,
    )
    .map_err(|e| machine_core::Error::permanent(format!("generating a key: {e}")))?;
    let private = key
        .to_openssh(russh::keys::ssh_key::LineEnding::LF)
        .map_err(|e| machine_core::Error::permanent(format!("encoding a key: {e}")))?;
    let public = key
        .public_key()
        .to_openssh()
        .map_err(|e| machine_core::Error::permanent(format!("encoding a key: {e}")))?;
    Ok((
        machine_core::SecretString::from(private.to_string()),
        public,
    ))
}
