//! A lab for one test run: its own bridge, subnet and run directory, all removed in
//! Drop (also when the test panics), so nothing of a run is left on the host.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use machine_core::{Machine, MachineProvisioner, Phase, ProviderId};
use provider_local::{LocalConfig, LocalProvider};

/// One run's network and run directory, and providers on them.
pub struct Lab {
    pub bridge: String,
    pub subnet: String,
    pub run_dir: PathBuf,
    keeper: Option<LocalProvider>,
}

impl Lab {
    /// A lab with a /24 of its own.
    pub fn new() -> Self {
        Self::with_prefix(24)
    }

    /// A lab whose subnet has `prefix` bits, on a private range no interface of this
    /// host uses.
    pub fn with_prefix(prefix: u8) -> Self {
        let used = std::process::Command::new("ip")
            .args(["-4", "-o", "addr"])
            .output()
            .expect("ip is missing: apt-get install iproute2");
        let used = String::from_utf8_lossy(&used.stdout).into_owned();
        let (subnet, stem) = loop {
            let (a, b) = (fastrand::u8(100..250), fastrand::u8(..));
            let stem = format!("10.{a}.{b}.");
            if !used.contains(&stem) {
                break (format!("{stem}0/{prefix}"), stem);
            }
        };
        let _ = stem;
        let bridge = format!("mpt{:06x}", fastrand::u32(..) & 0xffffff);
        let run_dir = PathBuf::from(format!("/run/mp-local-test/{bridge}"));
        let mut lab = Lab {
            bridge,
            subnet,
            run_dir,
            keeper: None,
        };
        lab.keeper = Some(LocalProvider::new(lab.config("lab")).expect("lab provider"));
        lab
    }

    /// The config of a provider of `owner` in this lab.
    pub fn config(&self, owner: &str) -> LocalConfig {
        LocalConfig::new(owner)
            .with_bridge(&self.bridge)
            .with_subnet(&self.subnet)
            .with_run_dir(&self.run_dir)
    }

    /// A provider of `owner` in this lab.
    pub fn provider(&self, owner: &str) -> Arc<LocalProvider> {
        Arc::new(LocalProvider::new(self.config(owner)).expect("provider"))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(Err(e)) = self.keeper.as_ref().map(LocalProvider::teardown) {
            eprintln!("lab teardown failed: {e}");
        }
        // The shared parent of every lab's run directory goes with the last lab.
        if let Some(parent) = self.run_dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Waits until `id` is in a phase `done` accepts, returning it; panics with the last
/// machine seen after `timeout`.
pub async fn wait_phase(
    p: &dyn MachineProvisioner,
    id: &ProviderId,
    timeout: Duration,
    done: impl Fn(Phase) -> bool,
) -> Machine {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let m = p.get(id).await.expect("get");
        if done(m.phase) {
            return m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "machine {id} still {} after {timeout:?}: {:?}",
            m.phase,
            m.failure
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What is left of machine `netns`/`veth` on the host: its namespace, its interface.
pub fn leftovers(netns: &str, veth: &str) -> Vec<String> {
    let mut left = Vec::new();
    if std::path::Path::new("/run/netns").join(netns).exists() {
        left.push(format!("netns {netns}"));
    }
    if std::path::Path::new("/sys/class/net").join(veth).exists() {
        left.push(format!("interface {veth}"));
    }
    left
}

/// A client key pair and an SSH config that trusts only pinned host keys (its
/// known_hosts file is empty), so a connection proves the provider's pins.
pub struct ClientKey {
    pub dir: tempfile::TempDir,
    pub public: String,
}

impl ClientKey {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("id_ed25519");
        let ok = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "test", "-f"])
            .arg(&key)
            .status()
            .expect("ssh-keygen is missing: apt-get install openssh-client");
        assert!(ok.success());
        std::fs::write(dir.path().join("known_hosts"), "").unwrap();
        let public = std::fs::read_to_string(key.with_extension("pub"))
            .unwrap()
            .trim()
            .to_owned();
        ClientKey { dir, public }
    }

    pub fn ssh_config(&self) -> bootstrap_ssh::SshConfig {
        let auth = bootstrap_ssh::Auth::key_file(self.dir.path().join("id_ed25519"), None)
            .expect("client key");
        bootstrap_ssh::SshConfig::new(vec![auth])
            .with_host_keys(bootstrap_ssh::HostKeyPolicy::Verify {
                known_hosts: Some(self.dir.path().join("known_hosts")),
            })
            .with_connect_timeout(Duration::from_secs(20))
    }

    pub fn access(&self, user: &str) -> machine_core::SshAccess {
        machine_core::SshAccess {
            user: user.into(),
            authorized_keys: vec![self.public.clone()],
        }
    }
}

/// Runs `command` on the machine over SSH (pinned host keys only); its stdout.
pub async fn ssh(key: &ClientKey, m: &Machine, command: &str) -> String {
    let connector = bootstrap_ssh::SshConnector::new(key.ssh_config());
    let t = machine_core::Connector::connect(&connector, m)
        .await
        .unwrap_or_else(|e| panic!("ssh to {}: {e}", m.name));
    let out = t
        .exec(&machine_core::ExecRequest::new(command))
        .await
        .unwrap_or_else(|e| panic!("{command} on {}: {e}", m.name));
    assert_eq!(
        out.status,
        Some(0),
        "{command} on {}: {}",
        m.name,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
