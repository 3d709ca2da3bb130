//! The SSH command-line flags the examples share, turned into an [`SshConfig`]:
//! `--user`, `--key`, `--passphrase-env`, `--agent`, `--known-hosts`, `--accept-new`,
//! `--insecure`, `--jump`, `--sudo`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use bootstrap_ssh::{Auth, HostKeyPolicy, JumpHost, SshConfig, SshTarget};
use machine_core::SecretString;

/// The usage text of the shared flags.
pub const SSH_USAGE: &str = "[--user U] [--key PATH [--passphrase-env VAR] | --agent] \
[--known-hosts PATH] [--accept-new | --insecure] [--jump [USER@]HOST[:PORT]] [--sudo]";

/// The SSH flags given so far.
#[derive(Debug, Default)]
pub struct SshFlags {
    /// `--user`: the login user (default `$USER`).
    pub user: Option<String>,
    key: Option<PathBuf>,
    passphrase_env: Option<String>,
    agent: bool,
    known_hosts: Option<PathBuf>,
    accept_new: bool,
    insecure: bool,
    jump: Option<String>,
    /// `--sudo`: run commands under `sudo -n`.
    pub sudo: bool,
}

impl SshFlags {
    /// Takes `flag` (and its value from `rest`) when it is one of the shared flags;
    /// `Ok(false)` when it is not.
    pub fn take(
        &mut self,
        flag: &str,
        rest: &mut impl Iterator<Item = String>,
    ) -> anyhow::Result<bool> {
        let mut value = || rest.next().with_context(|| format!("{flag} needs a value"));
        match flag {
            "--user" => self.user = Some(value()?),
            "--key" => self.key = Some(value()?.into()),
            "--passphrase-env" => self.passphrase_env = Some(value()?),
            "--agent" => self.agent = true,
            "--known-hosts" => self.known_hosts = Some(value()?.into()),
            "--accept-new" => self.accept_new = true,
            "--insecure" => self.insecure = true,
            "--jump" => self.jump = Some(value()?),
            "--sudo" => self.sudo = true,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The login user: `--user`, else `$USER`, else root.
    pub fn user(&self) -> String {
        self.user
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "root".into())
    }

    /// The client config: host keys verified against `~/.ssh/known_hosts` (or
    /// `--known-hosts`) unless `--accept-new` or `--insecure` says otherwise; the key
    /// given, the agent, or the usual `~/.ssh/id_*` files.
    pub fn config(&self) -> anyhow::Result<SshConfig> {
        let home = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
        let policy = match (self.insecure, self.accept_new) {
            (true, true) => bail!("--insecure and --accept-new exclude each other"),
            (true, false) => HostKeyPolicy::insecure_accept_any(),
            (false, true) => HostKeyPolicy::AcceptNew {
                known_hosts: self
                    .known_hosts
                    .clone()
                    .unwrap_or_else(|| home.join(".ssh/known_hosts")),
            },
            (false, false) => HostKeyPolicy::Verify {
                known_hosts: self.known_hosts.clone(),
            },
        };
        let passphrase = match &self.passphrase_env {
            Some(var) => Some(SecretString::from(
                std::env::var(var).with_context(|| format!("{var} is not set"))?,
            )),
            None => None,
        };
        let mut auth = Vec::new();
        if self.agent {
            auth.push(Auth::agent());
        }
        match &self.key {
            Some(k) => auth.push(Auth::key_file(k, passphrase)?),
            None if !self.agent => {
                for name in ["id_ed25519", "id_ecdsa", "id_rsa"] {
                    let p = home.join(".ssh").join(name);
                    if p.exists() {
                        auth.push(Auth::key_file(p, passphrase.clone())?);
                    }
                }
            }
            None => {}
        }
        let mut config = SshConfig::new(auth)
            .with_host_keys(policy)
            .with_sudo(self.sudo);
        if let Some(j) = &self.jump {
            config = config.with_jump_host(JumpHost {
                target: SshTarget::parse(j, &self.user())?,
                pins: Vec::new(),
            });
        }
        Ok(config)
    }
}
