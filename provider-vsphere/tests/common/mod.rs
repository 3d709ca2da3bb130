//! Test peers for provider-vsphere: a vcsim per test, on a port it chose itself.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod admin;
pub mod proxy;
pub mod tools;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use machine_core::{MachineName, MachineSpec, SecretString};
use provider_vsphere::{CertFingerprint, VsphereConfig, VsphereConfigBuilder, VsphereProvider};

/// Where scripts/peers/50-vcsim.sh installs vcsim.
pub const VCSIM: &str = "/opt/vcsim3/vcsim";
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
    /// The last 50 lines of its log.
    log: Arc<Mutex<VecDeque<String>>>,
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

    /// Starts vcsim with these flags (`-vm 1000`: 2,000 VMs in its inventory).
    pub fn start_with(args: &[&str]) -> Vcsim {
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
        // vcsim logs every call and every update it sends: read its log as it comes
        // (a full pipe would stop vcsim), keeping the end for when it fails to start.
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let kept = log.clone();
        // VCSIM_LOG=<file> keeps all of it, to see what vcsim did before it failed.
        let mut copy = std::env::var_os("VCSIM_LOG").and_then(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .ok()
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if let Some(f) = copy.as_mut() {
                    use std::io::Write;
                    let _ = writeln!(f, "{line}");
                }
                let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                if kept.len() == 50 {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
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
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                let err: Vec<String> = log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .cloned()
                    .collect();
                panic!("vcsim did not print its URL: {}", err.join("\n"));
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
            log,
        }
    }

    /// The last lines vcsim logged, and whether it is still running: what a client
    /// that lost its connection cannot tell.
    #[allow(dead_code)]
    pub fn log_tail(&mut self) -> String {
        let running = matches!(self.child.try_wait(), Ok(None));
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let lines: Vec<&str> = log.iter().map(String::as_str).collect();
        format!(
            "vcsim running: {running}; its log ends:\n{}",
            lines.join("\n")
        )
    }
}

impl Drop for Vcsim {
    /// Stops vcsim with SIGTERM, so that it removes its datastore directories, and
    /// kills it if it has not ended within a second.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
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
