//! The pool of Redfish servers: [`RedfishPoolConfig`] and its [`ServerEntry`]s, read from
//! YAML or built in code, checked before any request is made.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use machine_core::{
    Error, Labels, MAX_USER_FILE_BYTES, Result, UrlSetting, at_document_line, check_dns_label,
    read_user_file, shown, shown_key,
};
use provider_http::{CertFingerprint, TlsConfig};
use reqwest::Url;
use serde::Deserialize;

use super::client::BmcCredentials;

/// The pool a [`crate::redfish::RedfishProvider`] claims servers from.
///
/// ```yaml
/// owner: team-a
/// claimDir: /srv/shared/redfish-claims   # shared by every controller of the pool
/// mediaServer: {listen: "10.0.0.2:8080", url: "http://10.0.0.2:8080"}
/// servers:
///   - name: rack1-a
///     bmc: https://10.0.1.5
///     systemId: "1"
///     credentials: {username: admin, password: s3cr3t}
///     labels: {rack: r1}
///     size: gpu-large          # its size class: specs with `size: gpu-large` get it
///     address: 10.0.0.21       # where its OS answers (a DHCP reservation, a static IP)
///     sshUser: debian
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RedfishPoolConfig {
    /// The owner recorded in every claim and the only owner whose claims are this
    /// provider's machines.
    #[serde(default = "default_owner")]
    pub owner: String,
    /// The directory that holds the claims, one file per server, shared by every
    /// controller of the pool (see [`crate::redfish`] for why not on the BMC). An
    /// absolute path: a relative one would name another directory in every controller
    /// started elsewhere.
    pub claim_dir: PathBuf,
    /// Where the seed images are served from.
    #[serde(default)]
    pub media_server: MediaServerConfig,
    /// The servers. Free servers are offered least recently released first, in this
    /// order among those never released.
    pub servers: Vec<ServerEntry>,
    /// How long a BMC may take to show a server on after accepting a power-on (default
    /// 60 s). A server still off after that was asked again once; still off after twice
    /// that, its machine is `Failed` (the BMC accepts power-ons it does not apply).
    #[serde(default = "default_power_on_grace", with = "humantime_serde")]
    pub power_on_grace: Duration,
}

/// Where the provider serves seed images for BMCs to download.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MediaServerConfig {
    /// The address to listen on; default `127.0.0.1:0` (a free loopback port).
    #[serde(default = "default_listen")]
    pub listen: std::net::SocketAddr,
    /// The URL BMCs reach it at, when not the listening address (NAT, a name):
    /// `http://` or `https://`, a host and an optional port and path, no user
    /// information (Debug and errors show it redacted).
    #[serde(default)]
    pub url: Option<UrlSetting>,
}

impl Default for MediaServerConfig {
    fn default() -> Self {
        MediaServerConfig {
            listen: default_listen(),
            url: None,
        }
    }
}

/// One server of the pool.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServerEntry {
    /// The server's pool name, a DNS label.
    pub name: String,
    /// The BMC's base URL, `https://host[:port]` (`http://` only with `insecure`). No
    /// user information: the account is [`ServerEntry::credentials`] (Debug and errors
    /// show a URL redacted all the same).
    pub bmc: UrlSetting,
    /// The system's id under `/redfish/v1/Systems/`.
    pub system_id: String,
    /// The BMC account.
    pub credentials: BmcCredentials,
    /// Allow plain HTTP or an unverified certificate for this BMC (a lab emulator).
    #[serde(default)]
    pub insecure: bool,
    /// Trust only the CA certificates (PEM) in this file for this BMC: a regular file of
    /// at most [`MAX_USER_FILE_BYTES`], read when the pool is checked and when the
    /// provider is built.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Trust exactly the BMC certificate with this SHA-256 fingerprint (hex, with or
    /// without colons): what self-signed BMC certificates call for.
    #[serde(default)]
    pub fingerprint: Option<String>,
    /// Labels a spec can select servers by: at most [`MAX_SERVER_LABELS`], keys of 1-63
    /// and values of 0-63 characters of a-z, A-Z, 0-9, '-', '_', '.', '/', as a spec's
    /// selector can name them.
    #[serde(default)]
    pub labels: Labels,
    /// The server's size class (`small`, `gpu-large`, `2x4096`), as the operator sorts
    /// the pool's hardware: a spec with a size gets a server of that class, and
    /// [`machine_core::Machine::size`] reports it. A server without one is only given
    /// to specs without a size.
    #[serde(default)]
    pub size: Option<String>,
    /// The address its operating system answers at (an IP address or a DNS name, as the
    /// management network's DHCP reservation or static address gives it); reported as
    /// the machine's address and SSH endpoint. Redfish does not tell it.
    #[serde(default)]
    pub address: Option<String>,
    /// The SSH port at `address`.
    #[serde(default = "default_ssh_port")]
    pub ssh_port: u16,
    /// The SSH user at `address` when the spec names none (its `ssh.user`).
    #[serde(default = "default_ssh_user")]
    pub ssh_user: String,
}

fn default_owner() -> String {
    machine_core::DEFAULT_OWNER.to_owned()
}

fn default_power_on_grace() -> Duration {
    Duration::from_secs(60)
}

fn default_ssh_port() -> u16 {
    22
}

fn default_ssh_user() -> String {
    "root".to_owned()
}

/// The longest owner: it is part of the claim directory's file names.
const MAX_OWNER_LEN: usize = 128;

/// The most labels a server may carry: a few describe hardware (rack, row, GPU model);
/// a bound keeps a runaway inventory from costing memory and time on every selection.
pub const MAX_SERVER_LABELS: usize = 64;

/// The longest label key or value, as a spec's.
const MAX_LABEL_LEN: usize = 63;

/// The longest claim directory (Linux's PATH_MAX less room for the file names in it).
const MAX_CLAIM_DIR_LEN: usize = 3800;

fn default_listen() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Fields whose value a reader's type error must not quote: passwords, and the URLs,
/// which may carry a password in their user information.
fn is_secret_field(field: &str) -> bool {
    field.ends_with("credentials.password")
        || field.ends_with(".password")
        || field.ends_with(".bmc")
        || field == "mediaServer.url"
}

/// Checks a URL setting: no user information, a URL of one of `schemes` with a host.
/// Errors name `field` and show the URL redacted.
fn parse_url(field: &str, url: &UrlSetting, schemes: &[&str]) -> Result<reqwest::Url> {
    url.check(field)?;
    let parsed = reqwest::Url::parse(url.as_str()).map_err(|e| {
        Error::invalid_spec(
            field,
            format!("{} is not a URL: {e}", shown(&url.to_string())),
        )
    })?;
    // What the parser reads as user information even where the text did not look like
    // it (`https:user:pw@host`): refused the same way.
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(Error::invalid_spec(
            field,
            format!(
                "{} carries user information; give credentials in their own settings",
                shown(&url.to_string())
            ),
        ));
    }
    if !schemes.contains(&parsed.scheme()) {
        return Err(Error::invalid_spec(
            field,
            format!(
                "scheme {} of {} is not {}",
                shown(parsed.scheme()),
                shown(&url.to_string()),
                schemes.join(" or ")
            ),
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(Error::invalid_spec(
            field,
            format!("{} has no host", shown(&url.to_string())),
        ));
    }
    Ok(parsed)
}

/// Checks the claim directory: absolute and without `..`, so that every controller
/// started anywhere names the same directory, and a directory when it exists already.
fn check_claim_dir(dir: &Path) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::invalid_spec(
            "claimDir",
            format!("{} {why}", shown(&dir.to_string_lossy())),
        ))
    };
    if dir.as_os_str().is_empty() {
        return bad(
            "is empty: give the absolute path of the directory every controller of the pool shares",
        );
    }
    if !dir.is_absolute() {
        return bad(
            "is not an absolute path: a relative one names another directory wherever a controller starts",
        );
    }
    if dir.as_os_str().len() > MAX_CLAIM_DIR_LEN {
        return bad(&format!("is longer than {MAX_CLAIM_DIR_LEN} bytes"));
    }
    if dir.components().any(|c| c == Component::ParentDir) {
        return bad("has a '..' component: give the directory's own path");
    }
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => bad("exists and is not a directory"),
        _ => Ok(()),
    }
}

/// Checks a server's labels as a spec's selector can name them.
fn check_labels(labels: &Labels) -> Result<()> {
    if labels.len() > MAX_SERVER_LABELS {
        return Err(Error::invalid_spec(
            "labels",
            format!(
                "{} labels, more than the {MAX_SERVER_LABELS} a server may carry",
                labels.len()
            ),
        ));
    }
    let ok_chars = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
    };
    for (k, v) in labels {
        let field = format!("labels.{}", shown_key(k));
        if k.is_empty() || k.len() > MAX_LABEL_LEN || !ok_chars(k) {
            return Err(Error::invalid_spec(
                field,
                format!(
                    "label key {} must be 1-{MAX_LABEL_LEN} characters of a-z, A-Z, 0-9, '-', '_', '.', '/'",
                    shown(k)
                ),
            ));
        }
        if v.len() > MAX_LABEL_LEN || !ok_chars(v) {
            return Err(Error::invalid_spec(
                field,
                format!(
                    "label value {} must be at most {MAX_LABEL_LEN} characters of a-z, A-Z, 0-9, '-', '_', '.', '/'",
                    shown(v)
                ),
            ));
        }
    }
    Ok(())
}

impl ServerEntry {
    /// The TLS trust this BMC's entry asks for: a pinned fingerprint, a CA file, none
    /// (insecure), or the system roots.
    pub fn tls(&self) -> Result<TlsConfig> {
        if let Some(f) = &self.fingerprint {
            let pin: CertFingerprint = f
                .parse()
                .map_err(|e: Error| Error::invalid_spec("fingerprint", e.message().to_owned()))?;
            return Ok(TlsConfig::default().with_pinned_sha256(pin));
        }
        if let Some(ca) = &self.ca_file {
            // Read here, a regular file under a bound, so that a missing or unreadable
            // file (or `/dev/zero`) is refused naming this field, when the pool is read.
            let pem = read_user_file("caFile", ca, MAX_USER_FILE_BYTES)?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                Error::invalid_spec(
                    "caFile",
                    format!("{} is not PEM certificates: {e}", ca.display()),
                )
            })?;
            if certs.is_empty() {
                return Err(Error::invalid_spec(
                    "caFile",
                    format!("{} holds no certificate", ca.display()),
                ));
            }
            return Ok(TlsConfig::default().with_ca_pem(pem));
        }
        if self.insecure {
            return Ok(TlsConfig::default().insecure());
        }
        Ok(TlsConfig::default())
    }

    /// The BMC's URL, checked: https (http only with `insecure`), a host and optional
    /// port, nothing else. Errors show the URL redacted.
    pub fn bmc_url(&self) -> Result<Url> {
        let url = parse_url("bmc", &self.bmc, &["https", "http"])?;
        if url.scheme() == "http" && !self.insecure {
            return Err(Error::invalid_spec(
                "bmc",
                format!(
                    "{} is plain HTTP: credentials would cross the network in clear; use https or set insecure: true",
                    shown(&self.bmc.to_string())
                ),
            ));
        }
        if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(Error::invalid_spec(
                "bmc",
                format!(
                    "{} must be a scheme, host and optional port only",
                    shown(&self.bmc.to_string())
                ),
            ));
        }
        Ok(url)
    }

    /// `host[:port]` of the BMC, as the provider ID shows it.
    pub fn bmc_host(&self) -> Result<String> {
        let url = self.bmc_url()?;
        let host = url.host_str().unwrap_or_default();
        Ok(match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_owned(),
        })
    }
}

impl RedfishPoolConfig {
    /// Reads a pool from YAML and checks it; errors name the field and the line, and
    /// never quote a password.
    pub fn from_yaml(yaml: &str) -> Result<Self> {
        let config: RedfishPoolConfig = machine_core::from_yaml_redacting(yaml, is_secret_field)?;
        config.validate().map_err(|e| at_document_line(e, yaml))?;
        Ok(config)
    }

    /// Checks what serde cannot: names, BMC URLs, system ids, credentials.
    pub fn validate(&self) -> Result<()> {
        if self.owner.is_empty()
            || self.owner.len() > MAX_OWNER_LEN
            || !self
                .owner
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(Error::invalid_spec(
                "owner",
                format!(
                    "{:?} must be 1-{MAX_OWNER_LEN} characters of a-z, A-Z, 0-9, '-', '_', '.'",
                    self.owner
                ),
            ));
        }
        if self.power_on_grace < Duration::from_secs(1) {
            return Err(Error::invalid_spec(
                "powerOnGrace",
                "must be at least 1s: BMCs apply power changes seconds after accepting them",
            ));
        }
        check_claim_dir(&self.claim_dir)?;
        if let Some(url) = &self.media_server.url {
            let parsed = parse_url("mediaServer.url", url, &["http", "https"])?;
            if parsed.query().is_some() || parsed.fragment().is_some() {
                return Err(Error::invalid_spec(
                    "mediaServer.url",
                    format!(
                        "{} must be a base URL without query or fragment: seed paths are appended to it",
                        shown(&url.to_string())
                    ),
                ));
            }
        }
        if self.servers.is_empty() {
            return Err(Error::invalid_spec("servers", "the pool has no server"));
        }
        let mut names = BTreeSet::new();
        let mut systems = BTreeSet::new();
        for (i, s) in self.servers.iter().enumerate() {
            let within = |e: Error| e.within(&format!("servers[{i}]"));
            check_dns_label("name", &s.name).map_err(within)?;
            if !names.insert(s.name.as_str()) {
                return Err(within(Error::invalid_spec(
                    "name",
                    format!("{:?} is given more than once; names must be unique", s.name),
                )));
            }
            let host = s.bmc_host().map_err(within)?;
            if s.system_id.is_empty()
                || !s
                    .system_id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(within(Error::invalid_spec(
                    "systemId",
                    format!(
                        "{:?} must be non-empty, of a-z, A-Z, 0-9, '-', '_', '.'",
                        s.system_id
                    ),
                )));
            }
            if !systems.insert((host, s.system_id.as_str())) {
                return Err(within(Error::invalid_spec(
                    "systemId",
                    format!("system {:?} of {} is in the pool twice", s.system_id, s.bmc),
                )));
            }
            if s.fingerprint.is_some() && s.ca_file.is_some() {
                return Err(within(Error::invalid_spec(
                    "fingerprint",
                    "give either fingerprint or caFile, not both",
                )));
            }
            s.tls().map_err(within)?;
            check_labels(&s.labels).map_err(within)?;
            if s.credentials.username.is_empty() {
                return Err(within(Error::invalid_spec(
                    "credentials.username",
                    "the BMC user name is empty",
                )));
            }
            if let Some(size) = &s.size
                && (size.is_empty()
                    || size.len() > 63
                    || !size
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)))
            {
                return Err(within(Error::invalid_spec(
                    "size",
                    format!(
                        "{size:?} must be 1-63 characters of a-z, A-Z, 0-9, '-', '_', '.', '/'"
                    ),
                )));
            }
            if let Some(address) = &s.address
                && (address.is_empty()
                    || address.len() > 253
                    || address.starts_with('-')
                    || !address
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || ".-:_".contains(c)))
            {
                return Err(within(Error::invalid_spec(
                    "address",
                    format!(
                        "{address:?} must be an IP address or host name: a-z, A-Z, 0-9, '.', '-', ':', '_', not starting with '-'"
                    ),
                )));
            }
            if s.ssh_user.is_empty()
                || !s
                    .ssh_user
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(within(Error::invalid_spec(
                    "sshUser",
                    format!("{:?} is not a valid user name", s.ssh_user),
                )));
            }
        }
        Ok(())
    }

    /// The server named `name`.
    pub fn server(&self, name: &str) -> Option<&ServerEntry> {
        self.servers.iter().find(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(yaml: &str) -> Error {
        RedfishPoolConfig::from_yaml(yaml).expect_err(yaml)
    }

    const GOOD: &str = "claimDir: /tmp/c\nservers:\n  - name: a\n    bmc: https://10.0.0.1\n    systemId: '1'\n    credentials: {username: admin, password: pw-9f3k}\n";

    #[test]
    fn a_pool_reads_from_yaml() {
        let c = RedfishPoolConfig::from_yaml(GOOD).unwrap();
        assert_eq!(c.servers[0].bmc_host().unwrap(), "10.0.0.1");
        assert!(!format!("{c:?}").contains("pw-9f3k"));
    }

    #[test]
    fn sizes_addresses_and_the_power_on_grace_are_read_and_checked() {
        let c = RedfishPoolConfig::from_yaml(&format!(
            "powerOnGrace: 90s\n{GOOD}    size: gpu-large\n    address: 10.0.0.21\n    sshUser: debian\n"
        ))
        .unwrap();
        let s = &c.servers[0];
        assert_eq!(s.size.as_deref(), Some("gpu-large"));
        assert_eq!(s.address.as_deref(), Some("10.0.0.21"));
        assert_eq!((s.ssh_port, s.ssh_user.as_str()), (22, "debian"));
        assert_eq!(c.power_on_grace, Duration::from_secs(90));
        let d = RedfishPoolConfig::from_yaml(GOOD).unwrap();
        assert_eq!(d.power_on_grace, Duration::from_secs(60));
        assert_eq!(
            (d.servers[0].size.as_ref(), d.servers[0].ssh_user.as_str()),
            (None, "root")
        );
        for (extra, field) in [
            ("    size: a b\n", "servers[0].size"),
            ("    size: ''\n", "servers[0].size"),
            ("    address: -oProxyCommand=x\n", "servers[0].address"),
            ("    address: a/b\n", "servers[0].address"),
            ("    sshUser: 'r oot'\n", "servers[0].sshUser"),
        ] {
            let e = err(&format!("{GOOD}{extra}"));
            assert_eq!(e.field(), Some(field), "{extra}: {e}");
        }
        let e = err(&format!("powerOnGrace: 0s\n{GOOD}"));
        assert_eq!(e.field(), Some("powerOnGrace"), "{e}");
        let e = err(&format!("owner: {}\n{GOOD}", "o".repeat(129)));
        assert_eq!(e.field(), Some("owner"), "{e}");
    }

    #[test]
    fn bad_pools_name_the_field_and_line() {
        let e = err(&GOOD.replace("systemId", "sistemId"));
        assert!(e.to_string().contains("sistemId"), "{e}");
        let e = err(&format!(
            "{GOOD}  - name: a\n    bmc: https://10.0.0.2\n    systemId: '1'\n    credentials: {{username: admin, password: x}}\n"
        ));
        assert_eq!(e.field(), Some("servers[1].name"), "{e}");
        assert!(e.to_string().contains("line 7"), "{e}");
        let e = err(&GOOD.replace("https://10.0.0.1", "10.0.0.1"));
        assert_eq!(e.field(), Some("servers[0].bmc"), "{e}");
        let e = err(&GOOD.replace("https://", "http://"));
        assert_eq!(e.field(), Some("servers[0].bmc"), "{e}");
        assert!(e.to_string().contains("insecure"), "{e}");
        let e = err(&GOOD.replace(
            "    credentials: {username: admin, password: pw-9f3k}\n",
            "",
        ));
        assert!(e.to_string().contains("credentials"), "{e}");
        let e = err(&GOOD.replace("password: pw-9f3k", "password: [pw-9f3k]"));
        assert!(!e.to_string().contains("pw-9f3k"), "{e}");
    }

    #[test]
    fn missing_files_relative_dirs_odd_schemes_and_odd_label_keys_are_refused_by_field_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "hello\n").unwrap();
        let cases = [
            (
                format!("{GOOD}    caFile: /nonexistent/ca.pem\n"),
                "servers[0].caFile",
                "line 7",
            ),
            (
                format!("{GOOD}    caFile: /dev/zero\n"),
                "servers[0].caFile",
                "line 7",
            ),
            (
                format!("{GOOD}    caFile: {}\n", dir.path().display()),
                "servers[0].caFile",
                "line 7",
            ),
            (
                format!("{GOOD}    caFile: {}\n", not_pem.display()),
                "servers[0].caFile",
                "line 7",
            ),
            (
                GOOD.replace("claimDir: /tmp/c", "claimDir: claims"),
                "claimDir",
                "line 1",
            ),
            (
                GOOD.replace("claimDir: /tmp/c", "claimDir: ''"),
                "claimDir",
                "line 1",
            ),
            (
                GOOD.replace("claimDir: /tmp/c", "claimDir: /srv/../etc"),
                "claimDir",
                "line 1",
            ),
            (
                GOOD.replace("claimDir: /tmp/c", "claimDir: /dev/null"),
                "claimDir",
                "line 1",
            ),
            (
                format!("mediaServer: {{url: 'ftp://10.0.0.2/seeds'}}\n{GOOD}"),
                "mediaServer.url",
                "line 1",
            ),
            (
                format!("mediaServer: {{url: 'file:///srv/seeds'}}\n{GOOD}"),
                "mediaServer.url",
                "line 1",
            ),
            (
                format!("mediaServer: {{url: 'http://10.0.0.2/?x=1'}}\n{GOOD}"),
                "mediaServer.url",
                "line 1",
            ),
            (
                format!("{GOOD}    labels: {{\"rack key\": r1}}\n"),
                "servers[0].labels.rack key",
                "line 7",
            ),
            (
                format!("{GOOD}    labels: {{rack: \"r 1\"}}\n"),
                "servers[0].labels.rack",
                "line 7",
            ),
            (
                format!("{GOOD}    labels: {{\"\": r1}}\n"),
                "servers[0].labels.",
                "line 7",
            ),
        ];
        for (yaml, field, line) in cases {
            let e = err(&yaml);
            assert_eq!(e.field(), Some(field), "{yaml}: {e}");
            assert!(e.to_string().contains(line), "{yaml}: {e}");
        }
        let many: Vec<String> = (0..=MAX_SERVER_LABELS)
            .map(|i| format!("k{i}: v"))
            .collect();
        let e = err(&format!("{GOOD}    labels: {{{}}}\n", many.join(", ")));
        assert_eq!(e.field(), Some("servers[0].labels"), "{e}");
        // What is allowed still reads.
        let ok = RedfishPoolConfig::from_yaml(&format!(
            "mediaServer: {{url: 'https://seeds.example:8443/redfish'}}\n{GOOD}    labels: {{topology.example/rack: r-1.a, empty: ''}}\n"
        ))
        .unwrap();
        assert_eq!(ok.servers[0].labels["topology.example/rack"], "r-1.a");
    }

    #[test]
    fn urls_with_user_information_are_refused_and_never_shown() {
        const PW: &str = "hunter2-zq";
        for (yaml, field) in [
            (
                GOOD.replace("https://10.0.0.1", &format!("https://admin:{PW}@10.0.0.1")),
                "servers[0].bmc",
            ),
            (
                GOOD.replace("https://10.0.0.1", &format!("'https:admin:{PW}@10.0.0.1'")),
                "servers[0].bmc",
            ),
            // Malformed as well: still not quoted whole.
            (
                GOOD.replace(
                    "https://10.0.0.1",
                    &format!("'https://admin:{PW}@[10.0.0.1'"),
                ),
                "servers[0].bmc",
            ),
            (
                GOOD.replace(
                    "https://10.0.0.1",
                    &format!("[https://admin:{PW}@10.0.0.1]"),
                ),
                "servers[0].bmc",
            ),
            (
                format!("mediaServer: {{url: 'http://seed:{PW}@10.0.0.2:8080'}}\n{GOOD}"),
                "mediaServer.url",
            ),
        ] {
            let e = err(&yaml);
            assert_eq!(e.field(), Some(field), "{yaml}: {e}");
            assert!(!format!("{e} {e:?}").contains(PW), "{e:?}");
        }
        // Built in code, unchecked: Debug shows no password either.
        let mut c = RedfishPoolConfig::from_yaml(GOOD).unwrap();
        c.servers[0].bmc = UrlSetting::new(format!("https://admin:{PW}@10.0.0.1"));
        c.media_server.url = Some(UrlSetting::new(format!("http://u:{PW}@10.0.0.2")));
        assert!(!format!("{c:?}").contains(PW), "{c:?}");
        let e = c.validate().expect_err("userinfo");
        assert!(!format!("{e} {e:?}").contains(PW), "{e:?}");
        c.servers[0].bmc = UrlSetting::new("https://10.0.0.1");
        let e = c.validate().expect_err("userinfo in the media URL");
        assert_eq!(e.field(), Some("mediaServer.url"), "{e}");
        assert!(!format!("{e} {e:?}").contains(PW), "{e:?}");
    }
}
