//! The inventory of existing hosts: [`StaticHostsConfig`] and its [`HostEntry`]s, read
//! from YAML or built in code, checked before any connection is made.

use std::collections::BTreeSet;
use std::time::Duration;

use machine_core::{
    Error, Labels, MAX_TIMEOUT, Result, at_document_line, check_dns_label, check_duration,
    check_ssh_public_key, shown, shown_key,
};
use serde::{Deserialize, Serialize};

/// Where claims live on a host unless the inventory says otherwise.
pub const DEFAULT_CLAIM_DIR: &str = "/var/lib/machine-core";

/// How long one host may take to answer a claim read or write unless the inventory
/// says otherwise.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The inventory a [`crate::StaticHostsProvider`] claims hosts from.
///
/// ```yaml
/// owner: team-a
/// hosts:
///   - name: rack1-a
///     address: 10.0.0.5
///     user: root
///     hostKeys: ["ssh-ed25519 AAAAC3Nza..."]
///     labels: {rack: r1}
///     size: 2x4096
///   - name: rack1-b
///     address: rack1-b.example.net
///     port: 2222
///     user: ops
///     sudo: true
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StaticHostsConfig {
    /// The owner recorded in every claim this provider makes and the only owner whose
    /// claims it sees as its machines.
    #[serde(default = "default_owner")]
    pub owner: String,
    /// The directory on each host that holds its claim file (`claim.json`): an absolute,
    /// normalized path (no `.` or `..` component, no empty one, no trailing `/`) of
    /// a-z, A-Z, 0-9, `-`, `_`, `.` and `/`.
    #[serde(default = "default_claim_dir")]
    pub claim_dir: String,
    /// How long one host may take to connect and answer: above zero, at most
    /// [`MAX_TIMEOUT`] (one day).
    #[serde(default = "default_probe_timeout", with = "humantime_serde")]
    pub probe_timeout: Duration,
    /// The hosts, in the order they are offered.
    pub hosts: Vec<HostEntry>,
}

/// One existing host of the inventory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostEntry {
    /// The host's inventory name, a DNS label; its machines' provider IDs are
    /// `static:///<name>/<claim id>`.
    pub name: String,
    /// Host name or IP address to connect to: letters, digits, `.`, `-`, `:` and `_`, not
    /// starting with `-` (which a command line would read as an option).
    pub address: String,
    /// SSH port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// The user to log in as.
    #[serde(default = "default_user")]
    pub user: String,
    /// Whether claim commands run under `sudo -n` (for a user other than root).
    #[serde(default)]
    pub sudo: bool,
    /// The host's public keys in OpenSSH format, pinned when connecting. Without them
    /// the connector's own policy (a known_hosts file by default) decides.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_keys: Vec<String>,
    /// Labels a spec can select hosts by (`provider: {selector: {rack: r1}}`).
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// The host's size class (`small`, `2x4096`): 1-63 of a-z, A-Z, 0-9, `-`, `_`, `.`.
    /// A spec with a `size` claims only hosts of that class; its machine reports the
    /// class of the host it got as its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
}

fn default_owner() -> String {
    machine_core::DEFAULT_OWNER.to_owned()
}

fn default_claim_dir() -> String {
    DEFAULT_CLAIM_DIR.to_owned()
}

fn default_probe_timeout() -> Duration {
    DEFAULT_PROBE_TIMEOUT
}

fn default_port() -> u16 {
    22
}

fn default_user() -> String {
    "root".to_owned()
}

impl StaticHostsConfig {
    /// An inventory of `hosts` under `owner`, with the default claim directory and probe
    /// timeout.
    pub fn new(owner: impl Into<String>, hosts: Vec<HostEntry>) -> Self {
        StaticHostsConfig {
            owner: owner.into(),
            claim_dir: default_claim_dir(),
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
            hosts,
        }
    }

    /// Reads an inventory from YAML and checks it; errors name the field and the line.
    pub fn from_yaml(yaml: &str) -> Result<Self> {
        let config: StaticHostsConfig = machine_core::from_yaml(yaml)?;
        config.validate().map_err(|e| at_document_line(e, yaml))?;
        Ok(config)
    }

    /// Reads an inventory from JSON and checks it, as [`StaticHostsConfig::from_yaml`]
    /// does (serde alone does not run [`StaticHostsConfig::validate`]).
    pub fn from_json(json: &str) -> Result<Self> {
        let config: StaticHostsConfig = machine_core::from_json(json)?;
        config.validate().map_err(|e| at_document_line(e, json))?;
        Ok(config)
    }

    /// Checks what serde cannot: names, addresses, users, keys, the claim directory.
    /// Errors are invalid-spec errors naming the field (`hosts[1].port`).
    pub fn validate(&self) -> Result<()> {
        if self.owner.is_empty() || !self.owner.chars().all(safe_char) {
            return Err(Error::invalid_spec(
                "owner",
                format!(
                    "{} must be non-empty, of a-z, A-Z, 0-9, '-', '_', '.'",
                    shown(&self.owner)
                ),
            ));
        }
        check_claim_dir(&self.claim_dir)?;
        check_duration("probeTimeout", self.probe_timeout, MAX_TIMEOUT)?;
        if self.hosts.is_empty() {
            return Err(Error::invalid_spec("hosts", "the inventory has no hosts"));
        }
        let mut names = BTreeSet::new();
        for (i, host) in self.hosts.iter().enumerate() {
            host.validate()
                .map_err(|e| e.within(&format!("hosts[{i}]")))?;
            if !names.insert(host.name.as_str()) {
                return Err(Error::invalid_spec(
                    format!("hosts[{i}].name"),
                    format!("{} is given more than once", shown(&host.name)),
                ));
            }
        }
        Ok(())
    }

    /// The entry named `name`.
    pub fn host(&self, name: &str) -> Option<&HostEntry> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// The claim file's path on every host.
    pub fn claim_path(&self) -> String {
        format!("{}/claim.json", self.claim_dir.trim_end_matches('/'))
    }
}

impl HostEntry {
    /// A host reached as root on port 22, with no pinned keys or labels.
    pub fn new(name: impl Into<String>, address: impl Into<String>) -> Self {
        HostEntry {
            name: name.into(),
            address: address.into(),
            port: 22,
            user: default_user(),
            sudo: false,
            host_keys: Vec::new(),
            labels: Labels::new(),
            size: None,
        }
    }

    /// Sets the host's size class.
    pub fn size(mut self, size: impl Into<String>) -> Self {
        self.size = Some(size.into());
        self
    }

    /// Sets the SSH port.
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Sets the login user and whether claim commands need `sudo`.
    pub fn user(mut self, user: impl Into<String>, sudo: bool) -> Self {
        self.user = user.into();
        self.sudo = sudo;
        self
    }

    /// Pins a host key (`ssh-ed25519 AAAA...`).
    pub fn host_key(mut self, key: impl Into<String>) -> Self {
        self.host_keys.push(key.into());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Checks the entry; errors name the field relative to the entry (`port`).
    pub fn validate(&self) -> Result<()> {
        check_dns_label("name", &self.name)?;
        let address_ok = !self.address.is_empty()
            && self.address.len() <= 253
            && !self.address.starts_with('-')
            && self
                .address
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
        if !address_ok {
            return Err(Error::invalid_spec(
                "address",
                format!(
                    "{} is not a host name or IP address (at most 253 of a-z, A-Z, 0-9, '.', '-', ':', '_', not starting with '-')",
                    shown(&self.address)
                ),
            ));
        }
        if self.port == 0 {
            return Err(Error::invalid_spec("port", "0 is not a TCP port"));
        }
        if self.user.is_empty() || self.user.starts_with('-') || !self.user.chars().all(safe_char) {
            return Err(Error::invalid_spec(
                "user",
                format!(
                    "{} is not a valid user name (a-z, A-Z, 0-9, '-', '_', '.', not starting with '-')",
                    shown(&self.user)
                ),
            ));
        }
        for (i, key) in self.host_keys.iter().enumerate() {
            check_ssh_public_key(&format!("hostKeys[{i}]"), key)?;
        }
        if let Some(size) = &self.size
            && (size.is_empty() || size.len() > 63 || !size.chars().all(safe_char))
        {
            return Err(Error::invalid_spec(
                "size",
                format!(
                    "{} is not a size class (1-63 of a-z, A-Z, 0-9, '-', '_', '.')",
                    shown(size)
                ),
            ));
        }
        for (k, v) in &self.labels {
            if k.is_empty() || !k.chars().all(safe_char) || !v.chars().all(safe_char) {
                return Err(Error::invalid_spec(
                    format!("labels.{}", shown_key(k)),
                    "label keys and values are of a-z, A-Z, 0-9, '-', '_', '.'",
                ));
            }
        }
        Ok(())
    }
}

/// The longest claim directory accepted (Linux's PATH_MAX less room for `/claim.json`).
pub const MAX_CLAIM_DIR_LEN: usize = 4000;

/// Checks the claim directory: absolute and normalized, so that it means what it says
/// (`/../../etc` would write claims into `/etc`). Errors name `claimDir`.
fn check_claim_dir(dir: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::invalid_spec(
            "claimDir",
            format!("{} {why}", shown(dir)),
        ))
    };
    if !dir.starts_with('/') || dir.len() < 2 {
        return bad("is not an absolute path below /");
    }
    if dir.len() > MAX_CLAIM_DIR_LEN {
        return bad(&format!("is longer than {MAX_CLAIM_DIR_LEN} bytes"));
    }
    if !dir.chars().all(|c| safe_char(c) || c == '/') {
        return bad("must be of a-z, A-Z, 0-9, '-', '_', '.', '/'");
    }
    for component in dir[1..].split('/') {
        match component {
            "" => {
                return bad(
                    "is not normalized: it has an empty component ('//' or a trailing '/')",
                );
            }
            "." | ".." => return bad("is not normalized: it has a '.' or '..' component"),
            _ => {}
        }
    }
    Ok(())
}

fn safe_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use machine_core::ErrorKind;

    const INVENTORY: &str = "\
owner: team-a
claimDir: /srv/claims
probeTimeout: 3s
hosts:
  - name: rack1-a
    address: 10.0.0.5
    hostKeys: [\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOXLZCJgZESodBc7Vjr3vb4fE0hSuOzUa5iERyuZmke1 rack1-a\"]
    labels: {rack: r1}
  - name: rack1-b
    address: rack1-b.example.net
    port: 2222
    user: ops
    sudo: true
";

    #[test]
    fn an_inventory_reads_from_yaml_with_defaults() {
        let c = StaticHostsConfig::from_yaml(INVENTORY).unwrap();
        assert_eq!(c.owner, "team-a");
        assert_eq!(c.claim_path(), "/srv/claims/claim.json");
        assert_eq!(c.probe_timeout, Duration::from_secs(3));
        let a = c.host("rack1-a").unwrap();
        assert_eq!((a.port, a.user.as_str(), a.sudo), (22, "root", false));
        assert_eq!(a.labels["rack"], "r1");
        let b = c.host("rack1-b").unwrap();
        assert_eq!((b.port, b.user.as_str(), b.sudo), (2222, "ops", true));
        let d = StaticHostsConfig::from_yaml("hosts: [{name: h, address: h}]\n").unwrap();
        assert_eq!(d.owner, machine_core::DEFAULT_OWNER);
        assert_eq!(d.claim_dir, DEFAULT_CLAIM_DIR);
        assert_eq!(d.probe_timeout, DEFAULT_PROBE_TIMEOUT);
    }

    #[test]
    fn unknown_fields_and_bad_types_name_the_field_and_line() {
        let e = StaticHostsConfig::from_yaml("hosts:\n  - name: a\n    adress: x\n").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        let msg = e.to_string();
        assert!(msg.contains("unknown field `adress`"), "{msg}");
        assert!(msg.contains("line 3"), "{msg}");
        let e =
            StaticHostsConfig::from_yaml("hosts:\n  - name: a\n    address: x\n    port: 70000\n")
                .unwrap_err();
        assert!(e.to_string().contains("line 4"), "{e}");
        let e = StaticHostsConfig::from_yaml("probeTimeout: soon\nhosts: []\n").unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    #[test]
    fn bad_entries_name_their_field() {
        let cases = [
            ("hosts: []\n", "hosts"),
            ("hosts: [{name: A_1, address: x}]\n", "hosts[0].name"),
            ("hosts: [{name: a, address: \"\"}]\n", "hosts[0].address"),
            (
                "hosts: [{name: a, address: \"x; rm\"}]\n",
                "hosts[0].address",
            ),
            ("hosts: [{name: a, address: x, port: 0}]\n", "hosts[0].port"),
            (
                "hosts: [{name: a, address: x, size: \"\"}]\n",
                "hosts[0].size",
            ),
            (
                "hosts: [{name: a, address: x, size: \"2 x 4\"}]\n",
                "hosts[0].size",
            ),
            (
                "hosts: [{name: a, address: x, user: \"a b\"}]\n",
                "hosts[0].user",
            ),
            (
                "hosts: [{name: a, address: x, hostKeys: [nonsense]}]\n",
                "hosts[0].hostKeys[0]",
            ),
            (
                "hosts: [{name: a, address: x, labels: {\"a b\": c}}]\n",
                "hosts[0].labels.a b",
            ),
            (
                "hosts: [{name: a, address: x}, {name: a, address: y}]\n",
                "hosts[1].name",
            ),
            (
                "claimDir: relative\nhosts: [{name: a, address: x}]\n",
                "claimDir",
            ),
            (
                "claimDir: \"/a b\"\nhosts: [{name: a, address: x}]\n",
                "claimDir",
            ),
            ("owner: \"\"\nhosts: [{name: a, address: x}]\n", "owner"),
            (
                "probeTimeout: 0s\nhosts: [{name: a, address: x}]\n",
                "probeTimeout",
            ),
            (
                "probeTimeout: 18446744073709551615s\nhosts: [{name: a, address: x}]\n",
                "probeTimeout",
            ),
            (
                "probeTimeout: 2days\nhosts: [{name: a, address: x}]\n",
                "probeTimeout",
            ),
            ("hosts: [{name: a, address: \"-x\"}]\n", "hosts[0].address"),
            (
                "hosts: [{name: a, address: \"-oProxyCommand=sh\"}]\n",
                "hosts[0].address",
            ),
            (
                "hosts: [{name: a, address: x, user: \"-x\"}]\n",
                "hosts[0].user",
            ),
            (
                "claimDir: /../../etc\nhosts: [{name: a, address: x}]\n",
                "claimDir",
            ),
            (
                "claimDir: /srv/./claims\nhosts: [{name: a, address: x}]\n",
                "claimDir",
            ),
            (
                "claimDir: /srv//claims\nhosts: [{name: a, address: x}]\n",
                "claimDir",
            ),
            (
                "claimDir: /srv/claims/\nhosts: [{name: a, address: x}]\n",
                "claimDir",
            ),
            (
                "claimDir: /srv/claims/..\nhosts: [{name: a, address: x}]\n",
                "claimDir",
            ),
        ];
        for (yaml, field) in cases {
            let e = StaticHostsConfig::from_yaml(yaml).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{yaml}");
            assert_eq!(e.field(), Some(field), "{yaml}: {e}");
            assert!(e.message().contains("line "), "{yaml}: {e}");
        }
    }

    #[test]
    fn json_inventories_are_validated() {
        let e = StaticHostsConfig::from_json(
            "{\"claimDir\": \"/../../etc\",\n \"hosts\": [{\"name\": \"a\", \"address\": \"x\"}]}",
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("claimDir"), "{e}");
        assert!(e.message().contains("line 1"), "{e}");
        let e =
            StaticHostsConfig::from_json("{\"hosts\": [{\"name\": \"a\",\n \"address\": \"-x\"}]}")
                .unwrap_err();
        assert_eq!(e.field(), Some("hosts[0].address"), "{e}");
        assert!(e.message().contains("line 2"), "{e}");
        let ok = StaticHostsConfig::from_json(
            "{\"hosts\": [{\"name\": \"a\", \"address\": \"10.0.0.1\"}]}",
        )
        .unwrap();
        assert_eq!(ok.hosts[0].address, "10.0.0.1");
    }

    #[test]
    fn an_inventory_round_trips_through_yaml() {
        let c = StaticHostsConfig::new(
            "team-a",
            vec![
                HostEntry::new("a", "10.0.0.1")
                    .port(2200)
                    .user("ops", true)
                    .host_key("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOXLZCJgZESodBc7Vjr3vb4fE0hSuOzUa5iERyuZmke1 a")
                    .label("rack", "r1")
                    .size("2x4096"),
            ],
        );
        c.validate().unwrap();
        let yaml = serde_saphyr_round_trip(&c);
        assert_eq!(StaticHostsConfig::from_yaml(&yaml).unwrap(), c);
    }

    fn serde_saphyr_round_trip(c: &StaticHostsConfig) -> String {
        // JSON is YAML: the inventory's own serializer is all the round trip needs.
        serde_json::to_string(c).unwrap()
    }
}
