//! Helpers of the end-to-end tests: a [`Lab`] (a bridge, subnet and run directory of
//! one test's own, torn down when dropped, also when the test panics, and swept by the
//! next lab when its test process was killed) and a
//! [`ClientKey`] whose SSH config trusts only pinned host keys.
//!
//! The tests need root and the Debian root of `scripts/peers/40-local-root.sh`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bootstrap_ssh::{Auth, HostKeyPolicy, SshConfig, SshConnector};
use machine_core::{Connector, ExecRequest, Machine, SshAccess};
use provider_local::{LocalConfig, LocalProvider};

/// One test's own network and run directory; everything in it is removed on drop.
#[derive(Debug)]
pub struct Lab {
    /// The bridge, unique to the lab.
    pub bridge: String,
    /// The lab's private subnet, on no other interface of this host.
    pub subnet: String,
    /// The run directory of the lab's providers.
    pub run_dir: PathBuf,
    keeper: LocalProvider,
}

impl Lab {
    /// A lab with a /24 of its own.
    ///
    /// # Panics
    /// When provider-local cannot run here (not root, no root file system): the
    /// message says how to fix it.
    pub fn new() -> Self {
        let used = std::process::Command::new("ip")
            .args(["-4", "-o", "addr"])
            .output()
            .expect("ip is missing: apt-get install iproute2");
        let used = String::from_utf8_lossy(&used.stdout).into_owned();
        let subnet = loop {
            let stem = format!("10.{}.{}.", fastrand::u8(100..250), fastrand::u8(..));
            if !used.contains(&stem) {
                break format!("{stem}0/24");
            }
        };
        sweep_stale_labs();
        let bridge = format!("mpe{:06x}", fastrand::u32(..) & 0xffffff);
        let run_dir = Path::new(LAB_ROOT).join(&bridge);
        let config = LocalConfig::new("lab")
            .with_bridge(&bridge)
            .with_subnet(&subnet)
            .with_run_dir(&run_dir);
        let keeper = LocalProvider::new(config).unwrap_or_else(|e| {
            panic!("provider-local cannot run here: {e} (run as root after scripts/peers/40-local-root.sh)")
        });
        // Who owns the lab, so that a later lab can sweep it if this process is killed
        // (a killed process runs no Drop).
        std::fs::create_dir_all(&run_dir).expect("lab run directory");
        std::fs::write(
            run_dir.join(LAB_FILE),
            format!("{} {subnet}\n", std::process::id()),
        )
        .expect("lab owner file");
        Lab {
            bridge,
            subnet,
            run_dir,
            keeper,
        }
    }

    /// The lab bridge's own address, which machines reach the host at (a phone-home
    /// listener bound to every address of the host is reached there).
    pub fn gateway(&self) -> std::net::Ipv4Addr {
        self.subnet
            .parse::<provider_local::Subnet>()
            .expect("the lab's subnet")
            .gateway()
    }

    /// A provider of `owner` in this lab.
    ///
    /// # Panics
    /// When the provider cannot be made (it could for the lab itself).
    pub fn provider(&self, owner: &str) -> Arc<LocalProvider> {
        let config = LocalConfig::new(owner)
            .with_bridge(&self.bridge)
            .with_subnet(&self.subnet)
            .with_run_dir(&self.run_dir);
        Arc::new(LocalProvider::new(config).expect("provider"))
    }
}

/// Where every lab's run directory lives, one directory per lab named by its bridge.
pub const LAB_ROOT: &str = "/run/mp-e2e";

/// The file in a lab's run directory that holds the owning process ID and the subnet.
pub const LAB_FILE: &str = "lab";

/// Tears down every lab whose test process is gone: its machines, bridge and run
/// directory. A lab whose process lives, or that has no owner file yet, is left alone.
pub fn sweep_stale_labs() {
    let Ok(labs) = std::fs::read_dir(LAB_ROOT) else {
        return;
    };
    for lab in labs.flatten() {
        let dir = lab.path();
        let Ok(owner) = std::fs::read_to_string(dir.join(LAB_FILE)) else {
            continue;
        };
        let mut words = owner.split_whitespace();
        let (Some(pid), Some(subnet)) = (words.next(), words.next()) else {
            continue;
        };
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        let bridge = lab.file_name().to_string_lossy().into_owned();
        eprintln!("sweeping lab {bridge}, left by killed test process {pid}");
        let config = LocalConfig::new("lab")
            .with_bridge(&bridge)
            .with_subnet(subnet)
            .with_run_dir(&dir);
        let swept = LocalProvider::new(config).and_then(|p| p.teardown());
        if let Err(e) = swept {
            eprintln!("sweeping lab {bridge} failed: {e}");
        }
    }
}

impl Default for Lab {
    fn default() -> Self {
        Lab::new()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = self.keeper.teardown() {
            eprintln!("lab teardown failed: {e}");
        }
        // The shared parent of every lab's run directory goes with the last lab.
        if let Some(parent) = self.run_dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// A client key pair, and SSH settings that trust only pinned host keys: the
/// known_hosts file is empty and nothing is trusted on first use.
#[derive(Debug)]
pub struct ClientKey {
    dir: tempfile::TempDir,
    /// The public key, in OpenSSH format.
    pub public: String,
}

impl ClientKey {
    /// A fresh ed25519 key.
    ///
    /// # Panics
    /// When ssh-keygen is missing or fails.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let key = dir.path().join("id_ed25519");
        let ok = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "e2e", "-f"])
            .arg(&key)
            .status()
            .expect("ssh-keygen is missing: apt-get install openssh-client");
        assert!(ok.success(), "ssh-keygen failed");
        std::fs::write(dir.path().join("known_hosts"), "").expect("known_hosts");
        let public = std::fs::read_to_string(key.with_extension("pub"))
            .expect("public key")
            .trim()
            .to_owned();
        ClientKey { dir, public }
    }

    /// An SSH connector with this key that verifies host keys against pins only.
    ///
    /// # Panics
    /// When the key cannot be read back.
    pub fn connector(&self) -> Arc<SshConnector> {
        let auth = Auth::key_file(self.dir.path().join("id_ed25519"), None).expect("client key");
        Arc::new(SshConnector::new(
            SshConfig::new(vec![auth])
                .with_host_keys(HostKeyPolicy::Verify {
                    known_hosts: Some(self.dir.path().join("known_hosts")),
                })
                .with_connect_timeout(Duration::from_secs(20)),
        ))
    }

    /// [`ClientKey::connector`] with its config passed through `f` first (a quicker
    /// keepalive, say).
    ///
    /// # Panics
    /// When the key cannot be read back.
    pub fn connector_with(&self, f: impl FnOnce(SshConfig) -> SshConfig) -> Arc<SshConnector> {
        let auth = Auth::key_file(self.dir.path().join("id_ed25519"), None).expect("client key");
        Arc::new(SshConnector::new(f(SshConfig::new(vec![auth])
            .with_host_keys(HostKeyPolicy::Verify {
                known_hosts: Some(self.dir.path().join("known_hosts")),
            })
            .with_connect_timeout(Duration::from_secs(20)))))
    }

    /// SSH access as `user` with this key.
    pub fn access(&self, user: &str) -> SshAccess {
        SshAccess {
            user: user.into(),
            authorized_keys: vec![self.public.clone()],
        }
    }

    /// Runs `command` on `machine` and returns its stdout.
    ///
    /// # Panics
    /// When the connection or the command fails.
    pub async fn run(&self, machine: &Machine, command: &str) -> String {
        let t = self
            .connector()
            .connect(machine)
            .await
            .unwrap_or_else(|e| panic!("ssh to {}: {e}", machine.name));
        let out = t
            .exec(&ExecRequest::new(command))
            .await
            .unwrap_or_else(|e| panic!("{command} on {}: {e}", machine.name));
        assert_eq!(
            out.status,
            Some(0),
            "{command} on {}: {}",
            machine.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Default for ClientKey {
    fn default() -> Self {
        ClientKey::new()
    }
}
