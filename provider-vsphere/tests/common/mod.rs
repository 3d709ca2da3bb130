//! Test peers for provider-vsphere: a vcsim per test, on a port it chose itself.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod admin;
pub mod proxy;
pub mod tools;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use machine_core::{MachineName, MachineSpec, SecretString};
use provider_vsphere::{CertFingerprint, VsphereConfig, VsphereConfigBuilder, VsphereProvider};

/// Where scripts/peers/50-vcsim.sh installs vcsim.
pub const VCSIM: &str = "/opt/vcsim/vcsim";
/// The template vcsim's main.go makes from one of its default VMs.
pub const TEMPLATE: &str = "DC0/vm/DC0_H0_VM1";
/// The standalone host's resource pool in vcsim's default model.
pub const POOL: &str = "DC0/host/DC0_H0/Resources";

/// A vcsim serving https on a loopback port, killed (by PID) when dropped.
pub struct Vcsim {
    child: Child,
    /// `https://127.0.0.1:<port>/sdk`.
    pub url: String,
    /// The SHA-256 fingerprint of its self-signed certificate, hex.
    pub fingerprint: CertFingerprint,
}

impl Vcsim {
    /// Starts vcsim; panics with how to install it when it is missing.
    pub fn start() -> Vcsim {
        Vcsim::start_with(&[])
    }

    /// Starts vcsim as Debian ships it for extraConfig: every entry appended, none
    /// replaced or removed (a server that keeps a value it was asked to remove).
    pub fn start_appending() -> Vcsim {
        Vcsim::start_with(&["-extraconfig-appends"])
    }

    fn start_with(args: &[&str]) -> Vcsim {
        assert!(
            std::path::Path::new(VCSIM).is_file(),
            "vcsim is not installed at {VCSIM}: run scripts/peers/50-vcsim.sh"
        );
        let mut child = Command::new(VCSIM)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {VCSIM}: {e} (run scripts/peers/50-vcsim.sh)"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if !line.trim().is_empty() => line,
            _ => {
                let _ = child.kill();
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("vcsim did not print its URL: {err}");
            }
        };
        let mut parts = line.split_whitespace();
        let url = parts.next().expect("URL").to_owned();
        let fingerprint = parts
            .next()
            .expect("fingerprint")
            .parse()
            .expect("vcsim prints a SHA-256 fingerprint");
        Vcsim {
            child,
            url,
            fingerprint,
        }
    }
}

impl Drop for Vcsim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A unique owner per test.
pub fn owner(test: &str) -> String {
    format!("{test}-{:06x}", fastrand::u32(..) & 0xffffff)
}

/// A config for `vcsim`, its certificate pinned, for `owner`.
pub fn config(vcsim: &Vcsim, owner: &str) -> VsphereConfigBuilder {
    config_at(&vcsim.url, vcsim.fingerprint, owner)
}

/// A config for the vcsim at `url` with this certificate, for `owner`.
pub fn config_at(url: &str, fingerprint: CertFingerprint, owner: &str) -> VsphereConfigBuilder {
    VsphereConfig::builder()
        .url(url)
        .username("user")
        .password(SecretString::from("pass"))
        .pinned_sha256(fingerprint)
        .datacenter("DC0")
        .owner(owner)
        .soft_stop_timeout(Duration::from_secs(2))
        .task_timeout(Duration::from_secs(30))
}

/// A provider for `vcsim` and `owner`.
pub fn provider(vcsim: &Vcsim, owner: &str) -> VsphereProvider {
    VsphereProvider::new(config(vcsim, owner).build().expect("test config")).expect("provider")
}

/// The SSH user the tests' machines report (the template's, as an operator says).
pub const SSH_USER: &str = "debian";

/// A spec cloning the template into the host's pool, 1 CPU and 64 MiB.
pub fn spec(name: &MachineName) -> MachineSpec {
    MachineSpec::new(name.clone())
        .with_image(TEMPLATE)
        .with_size("1x64")
        .with_provider(serde_json::json!({"resourcePool": POOL, "sshUser": SSH_USER}))
}

/// `spec` for a name given as text.
pub fn spec_named(name: &str) -> MachineSpec {
    spec(&MachineName::new(name).expect("test name"))
}
