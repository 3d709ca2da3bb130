//! What a [`crate::LocalProvider`] needs to know: [`LocalConfig`], read from YAML or built
//! in code, checked before anything is made on the host.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use machine_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// Where machines' directories and address leases live unless the config says otherwise.
/// Under /run, so that a host reboot (which kills every machine) also forgets them.
pub const DEFAULT_RUN_DIR: &str = "/run/machine-provisioning/local";

/// The bridge machines are attached to unless the config says otherwise.
pub const DEFAULT_BRIDGE: &str = "mplocal0";

/// The private subnet of the bridge unless the config says otherwise.
pub const DEFAULT_SUBNET: &str = "10.213.0.0/24";

/// The longest bridge name: host-side veth names are `<bridge>h<slot>` and Linux
/// interface names stop at 15 bytes, with a slot of up to 5 digits.
pub const MAX_BRIDGE_LEN: usize = 9;

/// The Debian root machines boot from unless the config says otherwise:
/// `${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/bookworm-local`, which
/// `scripts/peers/40-local-root.sh` builds.
pub fn default_root() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    cache.join("machine-provisioning/bookworm-local")
}

/// The configuration of a [`crate::LocalProvider`].
///
/// ```yaml
/// owner: team-a
/// runDir: /run/machine-provisioning/local
/// bridge: mplocal0
/// subnet: 10.213.0.0/24
/// root: /root/.cache/machine-provisioning/bookworm-local
/// ```
///
/// Every provider instance with the same run directory, bridge and subnet sees the
/// same machines (those of its owner); two instances with different bridges or
/// subnets must also use different run directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[non_exhaustive]
pub struct LocalConfig {
    /// The owner of the machines this instance makes, and the only owner whose
    /// machines it sees.
    #[serde(default = "default_owner")]
    pub owner: String,
    /// The directory holding one directory per machine (`<owner>/<name>`, with the
    /// machine's state, overlay and logs) and the address leases.
    #[serde(default = "default_run_dir")]
    pub run_dir: PathBuf,
    /// The bridge on this host the machines' addresses live on; made on first use.
    #[serde(default = "default_bridge")]
    pub bridge: String,
    /// The bridge's private IPv4 subnet (`10.213.0.0/24`): the first host address is
    /// the bridge's, the others are handed to machines.
    #[serde(default = "default_subnet")]
    pub subnet: String,
    /// The Debian root (with cloud-init, openssh-server, sudo, python3) every
    /// machine's overlay lies over; never written to.
    #[serde(default = "default_root")]
    pub root: PathBuf,
    /// The SSH user of a machine whose spec names none.
    #[serde(default = "default_user")]
    pub default_user: String,
}

fn default_owner() -> String {
    machine_core::DEFAULT_OWNER.to_owned()
}

fn default_run_dir() -> PathBuf {
    PathBuf::from(DEFAULT_RUN_DIR)
}

fn default_bridge() -> String {
    DEFAULT_BRIDGE.to_owned()
}

fn default_subnet() -> String {
    DEFAULT_SUBNET.to_owned()
}

fn default_user() -> String {
    "root".to_owned()
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig::new(default_owner())
    }
}

impl LocalConfig {
    /// A config for `owner` with every other setting at its default.
    pub fn new(owner: impl Into<String>) -> Self {
        LocalConfig {
            owner: owner.into(),
            run_dir: default_run_dir(),
            bridge: default_bridge(),
            subnet: default_subnet(),
            root: default_root(),
            default_user: default_user(),
        }
    }

    /// Sets the run directory.
    pub fn with_run_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.run_dir = dir.into();
        self
    }

    /// Sets the bridge name.
    pub fn with_bridge(mut self, bridge: impl Into<String>) -> Self {
        self.bridge = bridge.into();
        self
    }

    /// Sets the subnet (`10.1.2.0/24`).
    pub fn with_subnet(mut self, subnet: impl Into<String>) -> Self {
        self.subnet = subnet.into();
        self
    }

    /// Sets the Debian root.
    pub fn with_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = root.into();
        self
    }

    /// Sets the SSH user of machines whose spec names none.
    pub fn with_default_user(mut self, user: impl Into<String>) -> Self {
        self.default_user = user.into();
        self
    }

    /// Reads a config from YAML and checks it; errors name the field and, for syntax
    /// and type errors, the line.
    pub fn from_yaml(yaml: &str) -> Result<Self> {
        let config: LocalConfig = machine_core::from_yaml(yaml)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what serde cannot; errors are invalid-spec errors naming the field.
    /// The root's contents are checked when a provider is made, not here.
    pub fn validate(&self) -> Result<()> {
        if self.owner.is_empty()
            || self.owner.len() > 63
            || !self
                .owner
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            || self.owner.starts_with('.')
        {
            return Err(Error::invalid_spec(
                "owner",
                format!(
                    "{:?} must be 1-63 of a-z, A-Z, 0-9, '-', '_', '.', not starting with '.'",
                    self.owner
                ),
            ));
        }
        check_path("runDir", &self.run_dir)?;
        check_path("root", &self.root)?;
        if self.bridge.is_empty()
            || self.bridge.len() > MAX_BRIDGE_LEN
            || !self
                .bridge
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            || !self.bridge.starts_with(|c: char| c.is_ascii_lowercase())
        {
            return Err(Error::invalid_spec(
                "bridge",
                format!(
                    "{:?} must be 1-{MAX_BRIDGE_LEN} of a-z and 0-9, starting with a letter",
                    self.bridge
                ),
            ));
        }
        Subnet::from_str(&self.subnet)?;
        machine_core::check_dns_label("defaultUser", &self.default_user)?;
        Ok(())
    }

    /// The subnet, parsed.
    pub fn subnet(&self) -> Result<Subnet> {
        Subnet::from_str(&self.subnet)
    }
}

/// Absolute, and free of the characters overlayfs options and shells treat specially.
fn check_path(field: &str, path: &Path) -> Result<()> {
    let text = path.to_string_lossy();
    let ok = path.is_absolute()
        && text.len() > 1
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            field,
            format!("{text:?} must be an absolute path of a-z, A-Z, 0-9, '-', '_', '.', '/'"),
        ))
    }
}

/// A private IPv4 subnet (RFC 1918) with a prefix of 16 to 30 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    network: Ipv4Addr,
    prefix: u8,
}

impl Subnet {
    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// The bridge's own address: the first host address.
    pub fn gateway(&self) -> Ipv4Addr {
        self.host(1)
    }

    /// The number of addresses machines can get (all hosts but the gateway).
    pub fn slots(&self) -> u32 {
        (1u32 << (32 - self.prefix)) - 3
    }

    /// The address of machine slot `slot` (1-based, so slot 1 is the second host).
    pub fn machine_address(&self, slot: u32) -> Option<Ipv4Addr> {
        (slot >= 1 && slot <= self.slots()).then(|| self.host(slot + 1))
    }

    fn host(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + n)
    }
}

impl FromStr for Subnet {
    type Err = Error;

    /// Parses `10.1.2.0/24`; errors are invalid-spec errors on the field `subnet`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| Error::invalid_spec("subnet", format!("{s:?} {why}"));
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| bad("is not a subnet like 10.213.0.0/24"))?;
        let network: Ipv4Addr = addr
            .parse()
            .map_err(|_| bad("does not start with an IPv4 address"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| (16..=30).contains(p))
            .ok_or_else(|| bad("needs a prefix length from 16 to 30"))?;
        if !network.is_private() {
            return Err(bad(
                "is not private (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16): machines must live on this host only",
            ));
        }
        let mask = u32::MAX << (32 - prefix);
        if u32::from(network) & !mask != 0 {
            return Err(bad("has host bits set; use the network address"));
        }
        Ok(Subnet { network, prefix })
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_fills_defaults_and_names_bad_fields() {
        let c = LocalConfig::from_yaml("owner: team-a\nsubnet: 10.9.8.0/28\n").unwrap();
        assert_eq!(c.bridge, DEFAULT_BRIDGE);
        assert_eq!(c.subnet().unwrap().slots(), 13);
        for (yaml, field) in [
            ("bridge: Br0\n", "bridge"),
            ("bridge: abcdefghij\n", "bridge"),
            ("subnet: 8.8.8.0/24\n", "subnet"),
            ("subnet: 10.0.0.1/24\n", "subnet"),
            ("subnet: 10.0.0.0/8\n", "subnet"),
            ("runDir: relative\n", "runDir"),
            ("root: /a,b\n", "root"),
            ("owner: ''\n", "owner"),
        ] {
            let e = LocalConfig::from_yaml(yaml).unwrap_err();
            assert_eq!(e.field(), Some(field), "{yaml}: {e}");
        }
        let e = LocalConfig::from_yaml("brigde: x\n").unwrap_err();
        assert!(e.to_string().contains("brigde"), "{e}");
    }

    #[test]
    fn subnet_hands_out_every_host_but_the_gateway() {
        let s: Subnet = "192.168.7.0/30".parse().unwrap();
        assert_eq!(s.gateway(), Ipv4Addr::new(192, 168, 7, 1));
        assert_eq!(s.slots(), 1);
        assert_eq!(s.machine_address(1), Some(Ipv4Addr::new(192, 168, 7, 2)));
        assert_eq!(s.machine_address(2), None);
        assert_eq!(s.machine_address(0), None);
    }
}
