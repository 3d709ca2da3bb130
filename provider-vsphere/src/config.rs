//! How to reach vCenter and what to clone by default: [`VsphereConfig`], built with
//! [`VsphereConfigBuilder`], read from the environment ([`VsphereConfig::from_env`]) or
//! a YAML document ([`VsphereConfig::from_yaml`]); and [`VmSettings`], the per-machine
//! settings under a spec's `provider:`.

use std::time::Duration;

use machine_core::{
    DEFAULT_OWNER, Error, MAX_TIMEOUT, MachineSpec, Result, SecretString, UrlSetting,
    check_duration,
};
use provider_http::{CertFingerprint, TlsConfig};
use serde::Deserialize;

/// Where and how a machine is cloned; every field optional, a spec's `provider:`
/// overriding the config's `defaults`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VmSettings {
    /// The template's inventory path (`DC0/vm/templates/ubuntu-24.04`); a spec's
    /// `image` takes precedence.
    pub template: Option<String>,
    /// The folder to put the VM in, an inventory path (`DC0/vm/machines`); default the
    /// datacenter's `vm` folder. The config's `defaults.folder` is also the folder the
    /// provider watches for its machines (see [`VsphereConfig::folder`]): a spec's own
    /// folder must be that folder or one under it.
    pub folder: Option<String>,
    /// The resource pool, an inventory path (`DC0/host/cluster1/Resources`). Required
    /// (here or in the config's defaults): cloning a template needs one.
    pub resource_pool: Option<String>,
    /// The datastore, an inventory path (`DC0/datastore/ds1`); default the template's.
    pub datastore: Option<String>,
    /// Virtual CPUs; default the template's. A spec's `size` `<cpus>x<MiB>` sets it too.
    #[serde(rename = "numCPUs")]
    pub num_cpus: Option<u32>,
    /// Memory in MiB, a multiple of 4; default the template's.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
    /// The size of the first disk in GiB; it can grow, not shrink. Default the
    /// template's.
    #[serde(rename = "diskGiB")]
    pub disk_gib: Option<u64>,
    /// The network of the first network card, an inventory path: a standard port group
    /// (`DC0/network/VM Network`) or a distributed port group (`DC0/network/DC0_DVPG0`).
    /// Default the template's.
    pub network: Option<String>,
    /// The user SSH logs in as on the machine (it depends on the template: `ubuntu`,
    /// `debian`), when the spec has no `ssh.user`. Without either, machines report no
    /// SSH endpoint, only their addresses.
    pub ssh_user: Option<String>,
}

impl VmSettings {
    /// `self` with the fields `over` sets replaced.
    fn merged(&self, over: &VmSettings) -> VmSettings {
        VmSettings {
            template: over.template.clone().or_else(|| self.template.clone()),
            folder: over.folder.clone().or_else(|| self.folder.clone()),
            resource_pool: over
                .resource_pool
                .clone()
                .or_else(|| self.resource_pool.clone()),
            datastore: over.datastore.clone().or_else(|| self.datastore.clone()),
            num_cpus: over.num_cpus.or(self.num_cpus),
            memory_mib: over.memory_mib.or(self.memory_mib),
            disk_gib: over.disk_gib.or(self.disk_gib),
            network: over.network.clone().or_else(|| self.network.clone()),
            ssh_user: over.ssh_user.clone().or_else(|| self.ssh_user.clone()),
        }
    }

    /// Checks values written (not what is missing), naming the field under `at`.
    fn check(&self, at: &str) -> Result<()> {
        for (name, value) in [
            ("template", &self.template),
            ("folder", &self.folder),
            ("resourcePool", &self.resource_pool),
            ("datastore", &self.datastore),
            ("network", &self.network),
        ] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(Error::invalid_spec(
                    format!("{at}.{name}"),
                    "must be an inventory path, not empty",
                ));
            }
        }
        if self
            .ssh_user
            .as_deref()
            .is_some_and(|u| u.trim().is_empty() || u.chars().any(char::is_whitespace))
        {
            return Err(Error::invalid_spec(
                format!("{at}.sshUser"),
                "must be a user name: not empty, no spaces",
            ));
        }
        if self.num_cpus == Some(0) {
            return Err(Error::invalid_spec(
                format!("{at}.numCPUs"),
                "must be at least 1",
            ));
        }
        if self.disk_gib == Some(0) {
            return Err(Error::invalid_spec(
                format!("{at}.diskGiB"),
                "must be at least 1",
            ));
        }
        if let Some(m) = self.memory_mib
            && (m == 0 || !m.is_multiple_of(4))
        {
            return Err(Error::invalid_spec(
                format!("{at}.memoryMiB"),
                format!("{m} is not a positive multiple of 4 MiB"),
            ));
        }
        Ok(())
    }
}

/// What one create clones, resolved from spec and config, checked before any call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClonePlan {
    /// The template's inventory path and the field it came from (for errors).
    pub template: (String, &'static str),
    pub folder: String,
    pub resource_pool: String,
    pub datastore: Option<String>,
    pub num_cpus: Option<u32>,
    pub memory_mib: Option<u64>,
    pub disk_gib: Option<u64>,
    pub network: Option<String>,
    /// The spec's `ssh.user`, else the settings' `sshUser`.
    pub ssh_user: Option<String>,
}

/// The configuration of a [`crate::VsphereProvider`].
#[derive(Debug, Clone)]
pub struct VsphereConfig {
    pub(crate) sdk_url: String,
    pub(crate) username: String,
    pub(crate) password: SecretString,
    pub(crate) tls: TlsConfig,
    pub(crate) owner: String,
    pub(crate) datacenter: String,
    pub(crate) defaults: VmSettings,
    pub(crate) connect_timeout: Duration,
    pub(crate) call_timeout: Duration,
    pub(crate) task_timeout: Duration,
    pub(crate) soft_stop_timeout: Duration,
    pub(crate) keep_alive: Duration,
}

/// Builds a [`VsphereConfig`]; [`VsphereConfigBuilder::build`] checks every field.
#[derive(Debug, Clone, Default)]
pub struct VsphereConfigBuilder {
    // Debug shows it without user information; build refuses user information.
    url: Option<UrlSetting>,
    username: Option<String>,
    password: Option<SecretString>,
    ca_file: Option<String>,
    ca_pem: Option<Vec<u8>>,
    pinned_sha256: Option<CertFingerprint>,
    pinned_text: Option<String>,
    insecure: bool,
    owner: Option<String>,
    datacenter: Option<String>,
    defaults: VmSettings,
    connect_timeout: Option<Duration>,
    call_timeout: Option<Duration>,
    task_timeout: Option<Duration>,
    soft_stop_timeout: Option<Duration>,
    keep_alive: Option<Duration>,
}

/// The YAML document's shape: the builder's settings in camelCase.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConfigFile {
    url: Option<UrlSetting>,
    username: Option<String>,
    password: Option<String>,
    ca_file: Option<String>,
    pinned_sha256: Option<String>,
    #[serde(default)]
    insecure: bool,
    owner: Option<String>,
    datacenter: Option<String>,
    #[serde(default)]
    defaults: VmSettings,
    #[serde(default, with = "humantime_serde")]
    connect_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    call_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    task_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    soft_stop_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    keep_alive: Option<Duration>,
}

impl VsphereConfig {
    /// An empty builder.
    pub fn builder() -> VsphereConfigBuilder {
        VsphereConfigBuilder::default()
    }

    /// A builder filled from the environment:
    ///
    /// | variable | sets |
    /// |---|---|
    /// | `VSPHERE_URL` | the vCenter URL (`https://vc.example.com`, `/sdk` added) |
    /// | `VSPHERE_USERNAME`, `VSPHERE_PASSWORD` | the login |
    /// | `VSPHERE_CA_FILE` | a PEM CA bundle to verify vCenter with |
    /// | `VSPHERE_PINNED_SHA256` | the SHA-256 fingerprint of vCenter's certificate, hex |
    /// | `VSPHERE_INSECURE` | `true`: no TLS verification (lab only) |
    /// | `VSPHERE_DATACENTER` | the datacenter |
    /// | `PROVIDER_VSPHERE_OWNER` | the owner machines are tagged with |
    /// | `PROVIDER_VSPHERE_TEMPLATE`, `_FOLDER`, `_RESOURCE_POOL`, `_DATASTORE`, `_SSH_USER` | defaults |
    ///
    /// Nothing is checked until [`VsphereConfigBuilder::build`].
    pub fn from_env() -> VsphereConfigBuilder {
        VsphereConfigBuilder::from_lookup(|k| std::env::var(k).ok())
    }

    /// A builder filled from a YAML document (keys in camelCase, all optional; the
    /// password is never echoed in errors):
    ///
    /// ```yaml
    /// url: https://vcenter.example.com
    /// username: provisioner@vsphere.local
    /// password: s3cret
    /// caFile: /etc/ssl/vmca.pem       # or pinnedSha256: "ab:cd:...", or insecure: true
    /// owner: ci-cluster
    /// datacenter: DC0
    /// defaults:                       # VmSettings, as under a spec's `provider:`
    ///   template: DC0/vm/templates/ubuntu
    ///   resourcePool: DC0/host/cluster1/Resources
    ///   numCPUs: 2
    ///   memoryMiB: 4096
    ///   sshUser: ubuntu
    /// taskTimeout: 10m                # humantime: 500ms, 30s, 2m
    /// ```
    pub fn from_yaml(yaml: &str) -> Result<VsphereConfigBuilder> {
        let f: ConfigFile = machine_core::from_yaml_redacting(yaml, |k| k == "password")?;
        f.defaults.check("defaults")?;
        let pinned_sha256 = f.pinned_sha256.map(|p| parse_fingerprint(&p)).transpose()?;
        let mut b = VsphereConfigBuilder {
            url: f.url,
            username: f.username,
            password: f.password.map(SecretString::from),
            ca_file: f.ca_file,
            pinned_sha256,
            insecure: f.insecure,
            owner: f.owner,
            datacenter: f.datacenter,
            defaults: f.defaults,
            ..VsphereConfigBuilder::default()
        };
        b.connect_timeout = f.connect_timeout;
        b.call_timeout = f.call_timeout;
        b.task_timeout = f.task_timeout;
        b.soft_stop_timeout = f.soft_stop_timeout;
        b.keep_alive = f.keep_alive;
        Ok(b)
    }

    /// The owner machines are tagged with and found by.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The SDK endpoint (`https://vc/sdk`).
    pub fn sdk_url(&self) -> &str {
        &self.sdk_url
    }

    /// The defaults every machine's settings start from.
    pub fn defaults(&self) -> &VmSettings {
        &self.defaults
    }

    /// The folder the provider watches for its machines, an inventory path: the
    /// defaults' `folder`, else the datacenter's `vm` folder. `find` and `list` see the
    /// machines in it and in its subfolders; every machine is created there (a spec may
    /// name a folder under it). With many other VMs in the datacenter, give the
    /// provider a folder of its own: the provider reads every VM in its folder once, and
    /// each change to one of them after.
    pub fn folder(&self) -> String {
        self.defaults
            .folder
            .clone()
            .unwrap_or_else(|| format!("{}/vm", self.datacenter))
    }

    /// What to clone for `spec`: its settings over the defaults, checked.
    pub(crate) fn plan(&self, spec: &MachineSpec) -> Result<ClonePlan> {
        let own: VmSettings = spec.provider_settings()?;
        own.check("provider")?;
        let mut s = self.defaults.merged(&own);
        if let Some(size) = &spec.size {
            let (cpus, mem) = parse_size(size)?;
            s.num_cpus = Some(cpus);
            s.memory_mib = Some(mem);
        }
        let template = match (&spec.image, &s.template) {
            (Some(image), _) if image.trim().is_empty() => {
                return Err(Error::invalid_spec("image", "the template path is empty"));
            }
            (Some(image), _) => (image.clone(), "image"),
            (None, Some(t)) => (t.clone(), "provider.template"),
            (None, None) => {
                return Err(Error::invalid_spec(
                    "image",
                    "no template: set the spec's image (or provider.template, or the config's defaults.template) to a template's inventory path",
                ));
            }
        };
        let resource_pool = s.resource_pool.clone().ok_or_else(|| {
            Error::invalid_spec(
                "provider.resourcePool",
                "no resource pool: set provider.resourcePool or the config's defaults.resourcePool (e.g. DC0/host/cluster1/Resources)",
            )
        })?;
        let root = self.folder();
        let folder = s.folder.clone().unwrap_or_else(|| root.clone());
        if folder != root && !folder.starts_with(&format!("{root}/")) {
            return Err(Error::invalid_spec(
                "provider.folder",
                format!(
                    "{folder} is not {root} or a folder under it: the provider watches {root} for its machines (the config's defaults.folder)"
                ),
            ));
        }
        Ok(ClonePlan {
            template,
            folder,
            resource_pool,
            datastore: s.datastore.clone(),
            num_cpus: s.num_cpus,
            memory_mib: s.memory_mib,
            disk_gib: s.disk_gib,
            network: s.network.clone(),
            ssh_user: spec
                .ssh
                .as_ref()
                .map(|a| a.user.clone())
                .or_else(|| s.ssh_user.clone()),
        })
    }
}

/// A SHA-256 fingerprint from hex (colons allowed), or an error naming the field.
fn parse_fingerprint(text: &str) -> Result<CertFingerprint> {
    text.parse::<CertFingerprint>()
        .map_err(|e| Error::invalid_spec("pinnedSha256", e.message().to_owned()))
}

/// A spec's `size`: `<cpus>x<memory MiB>` (`2x4096`).
fn parse_size(size: &str) -> Result<(u32, u64)> {
    let bad = || {
        Error::invalid_spec(
            "size",
            format!(
                "{} is not <cpus>x<memory MiB> such as 2x4096",
                machine_core::shown(size)
            ),
        )
    };
    let (c, m) = size.split_once('x').ok_or_else(bad)?;
    let cpus: u32 = c.trim().parse().map_err(|_| bad())?;
    let mem: u64 = m.trim().parse().map_err(|_| bad())?;
    if cpus == 0 {
        return Err(Error::invalid_spec("size", "at least 1 CPU"));
    }
    if mem == 0 || !mem.is_multiple_of(4) {
        return Err(Error::invalid_spec(
            "size",
            format!("memory {mem} MiB is not a positive multiple of 4"),
        ));
    }
    Ok((cpus, mem))
}

impl VsphereConfigBuilder {
    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        VsphereConfigBuilder {
            url: get("VSPHERE_URL").map(UrlSetting::from),
            username: get("VSPHERE_USERNAME"),
            password: get("VSPHERE_PASSWORD").map(SecretString::from),
            ca_file: get("VSPHERE_CA_FILE"),
            // Kept as text until build, which names the field when it is malformed.
            pinned_text: get("VSPHERE_PINNED_SHA256"),
            insecure: get("VSPHERE_INSECURE").is_some_and(|v| v == "true" || v == "1"),
            owner: get("PROVIDER_VSPHERE_OWNER"),
            datacenter: get("VSPHERE_DATACENTER"),
            defaults: VmSettings {
                template: get("PROVIDER_VSPHERE_TEMPLATE"),
                folder: get("PROVIDER_VSPHERE_FOLDER"),
                resource_pool: get("PROVIDER_VSPHERE_RESOURCE_POOL"),
                datastore: get("PROVIDER_VSPHERE_DATASTORE"),
                ssh_user: get("PROVIDER_VSPHERE_SSH_USER"),
                ..VmSettings::default()
            },
            ..VsphereConfigBuilder::default()
        }
    }

    /// vCenter's URL: `https://vc.example.com` (the SDK path `/sdk` is added when the
    /// URL has no path). Required.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(UrlSetting::new(url));
        self
    }

    /// The user to log in as. Required.
    pub fn username(mut self, user: impl Into<String>) -> Self {
        self.username = Some(user.into());
        self
    }

    /// The password. Required; kept as a secret.
    pub fn password(mut self, password: SecretString) -> Self {
        self.password = Some(password);
        self
    }

    /// Verifies vCenter against the PEM CA bundle in this file (read by `build`).
    pub fn ca_file(mut self, path: impl Into<String>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Verifies vCenter against this PEM CA bundle.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Trusts exactly the certificate with this SHA-256 fingerprint (vCenter's
    /// self-signed or VMCA-issued certificate), whatever its issuer or name.
    pub fn pinned_sha256(mut self, fingerprint: CertFingerprint) -> Self {
        self.pinned_sha256 = Some(fingerprint);
        self
    }

    /// Turns TLS verification off and allows plain `http` URLs: a lab only. The
    /// client warns when it is built.
    pub fn insecure(mut self, yes: bool) -> Self {
        self.insecure = yes;
        self
    }

    /// The owner machines are tagged with (default [`DEFAULT_OWNER`]).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The datacenter (its name, as in inventory paths). Required.
    pub fn datacenter(mut self, dc: impl Into<String>) -> Self {
        self.datacenter = Some(dc.into());
        self
    }

    /// The settings every machine starts from.
    pub fn defaults(mut self, defaults: VmSettings) -> Self {
        self.defaults = defaults;
        self
    }

    /// How long a TCP + TLS connect may take (default 10 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = Some(d);
        self
    }

    /// How long one SOAP call may take (default 60 s).
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = Some(d);
        self
    }

    /// How long a task (clone, reconfigure, power, destroy) may run (default 10 min).
    pub fn task_timeout(mut self, d: Duration) -> Self {
        self.task_timeout = Some(d);
        self
    }

    /// How long delete and stop wait for a guest shutdown (and reboot for a guest
    /// restart) before powering off (resetting) hard (default 30 s).
    pub fn soft_stop_timeout(mut self, d: Duration) -> Self {
        self.soft_stop_timeout = Some(d);
        self
    }

    /// How long the session may be idle before a keep-alive call (default 10 min;
    /// vCenter ends sessions idle for 30 min by default).
    pub fn keep_alive(mut self, d: Duration) -> Self {
        self.keep_alive = Some(d);
        self
    }

    /// Checks every field and builds the config; no call is made.
    pub fn build(self) -> Result<VsphereConfig> {
        let url = self
            .url
            .ok_or_else(|| Error::invalid_spec("url", "no vCenter URL (VSPHERE_URL)"))?;
        url.check("url")?;
        let parsed = reqwest::Url::parse(url.as_str()).map_err(|e| {
            Error::invalid_spec(
                "url",
                format!(
                    "{} is not a URL: {e}",
                    machine_core::shown(&url.to_string())
                ),
            )
        })?;
        match parsed.scheme() {
            "https" => {}
            "http" if self.insecure => {}
            "http" => {
                return Err(Error::invalid_spec(
                    "url",
                    "plain http sends the password in clear: use https, or set insecure for a lab",
                ));
            }
            other => {
                return Err(Error::invalid_spec(
                    "url",
                    format!("scheme {other} is not https"),
                ));
            }
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(Error::invalid_spec("url", "the URL has no host"));
        }
        let sdk_url = if parsed.path() == "/" || parsed.path().is_empty() {
            let mut u = parsed.clone();
            u.set_path("/sdk");
            u.to_string()
        } else {
            parsed.to_string()
        };
        let username = self
            .username
            .filter(|u| !u.is_empty())
            .ok_or_else(|| Error::invalid_spec("username", "no user (VSPHERE_USERNAME)"))?;
        let password = self
            .password
            .ok_or_else(|| Error::invalid_spec("password", "no password (VSPHERE_PASSWORD)"))?;
        let pinned = match (self.pinned_sha256, self.pinned_text) {
            (Some(p), _) => Some(p),
            (None, Some(t)) => Some(parse_fingerprint(&t)?),
            (None, None) => None,
        };
        let tls = if self.insecure {
            TlsConfig::new().insecure()
        } else if let Some(p) = pinned {
            TlsConfig::new().with_pinned_sha256(p)
        } else if let Some(pem) = self.ca_pem {
            TlsConfig::new().with_ca_pem(pem)
        } else if let Some(path) = self.ca_file {
            if !std::path::Path::new(&path).is_file() {
                return Err(Error::invalid_spec("caFile", format!("no file {path}")));
            }
            TlsConfig::new().with_ca_file(path)
        } else {
            TlsConfig::new()
        };
        let owner = self.owner.unwrap_or_else(|| DEFAULT_OWNER.to_owned());
        if owner.is_empty() || owner.len() > 255 {
            return Err(Error::invalid_spec("owner", "must be 1 to 255 characters"));
        }
        let datacenter = self
            .datacenter
            .filter(|d| !d.trim().is_empty())
            .ok_or_else(|| {
                Error::invalid_spec("datacenter", "no datacenter (VSPHERE_DATACENTER)")
            })?;
        self.defaults.check("defaults")?;
        let d = |v: Option<Duration>, default: u64, field: &str| -> Result<Duration> {
            let v = v.unwrap_or(Duration::from_secs(default));
            check_duration(field, v, MAX_TIMEOUT)?;
            Ok(v)
        };
        Ok(VsphereConfig {
            sdk_url,
            username,
            password,
            tls,
            owner,
            datacenter,
            defaults: self.defaults,
            connect_timeout: d(self.connect_timeout, 10, "connectTimeout")?,
            call_timeout: d(self.call_timeout, 60, "callTimeout")?,
            task_timeout: d(self.task_timeout, 600, "taskTimeout")?,
            soft_stop_timeout: d(self.soft_stop_timeout, 30, "softStopTimeout")?,
            keep_alive: d(self.keep_alive, 600, "keepAlive")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use machine_core::{ErrorKind, MachineName};

    use super::*;

    fn base() -> VsphereConfigBuilder {
        VsphereConfig::builder()
            .url("https://vc.example.com")
            .username("u")
            .password(SecretString::from("p"))
            .datacenter("DC0")
    }

    fn field(b: VsphereConfigBuilder) -> String {
        let e = b.build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
        e.field().unwrap().to_owned()
    }

    #[test]
    fn bad_config_names_the_field() {
        assert_eq!(field(VsphereConfig::builder()), "url");
        assert_eq!(field(base().url("http://vc")), "url");
        assert_eq!(field(base().url("not a url")), "url");
        assert_eq!(field(base().datacenter(" ")), "datacenter");
        let zero = VmSettings {
            num_cpus: Some(0),
            ..VmSettings::default()
        };
        assert_eq!(field(base().defaults(zero)), "defaults.numCPUs");
        let odd = VmSettings {
            memory_mib: Some(1023),
            ..VmSettings::default()
        };
        assert_eq!(field(base().defaults(odd)), "defaults.memoryMiB");
        assert!(base().url("http://vc").insecure(true).build().is_ok());
        assert_eq!(
            base().build().unwrap().sdk_url(),
            "https://vc.example.com/sdk"
        );
    }

    #[test]
    fn a_url_with_credentials_is_refused_and_never_shown() {
        let b = base().url("https://admin:s3cr3t@vc.example.com/sdk");
        assert!(!format!("{b:?}").contains("s3cr3t"), "{b:?}");
        let e = b.build().unwrap_err();
        assert_eq!(e.field(), Some("url"), "{e}");
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
        let e = base().url("ht tp://admin:s3cr3t@vc").build().unwrap_err();
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
    }

    #[test]
    fn yaml_reads_camel_case_and_hides_the_password() {
        let b = VsphereConfig::from_yaml(
            "url: https://vc\nusername: u\npassword: hunter2\ndatacenter: DC0\nowner: me\n\
             defaults: {template: DC0/vm/t, resourcePool: DC0/host/h/Resources, numCPUs: 2, memoryMiB: 2048}\n\
             taskTimeout: 2m\n",
        )
        .unwrap();
        let c = b.build().unwrap();
        assert_eq!(c.defaults().num_cpus, Some(2));
        assert_eq!(c.task_timeout, Duration::from_secs(120));
        assert!(!format!("{c:?}").contains("hunter2"));
        let e = VsphereConfig::from_yaml("password: [hunter2]\n").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let e = VsphereConfig::from_yaml("defaults: {memoryMiB: 1001}\n").unwrap_err();
        assert_eq!(e.field(), Some("defaults.memoryMiB"));
    }

    #[test]
    fn env_fills_the_builder() {
        let b = VsphereConfigBuilder::from_lookup(|k| match k {
            "VSPHERE_URL" => Some("https://vc".into()),
            "VSPHERE_USERNAME" => Some("u".into()),
            "VSPHERE_PASSWORD" => Some("p".into()),
            "VSPHERE_DATACENTER" => Some("DC0".into()),
            "PROVIDER_VSPHERE_TEMPLATE" => Some("DC0/vm/t".into()),
            _ => None,
        });
        let c = b.build().unwrap();
        assert_eq!(c.defaults().template.as_deref(), Some("DC0/vm/t"));
    }

    #[test]
    fn plans_name_the_field_at_fault() {
        let c = base().build().unwrap();
        let spec = |s: &str| MachineSpec::new(MachineName::new(s).unwrap());
        assert_eq!(c.plan(&spec("a")).unwrap_err().field(), Some("image"));
        let s = spec("a").with_image("DC0/vm/t");
        assert_eq!(
            c.plan(&s).unwrap_err().field(),
            Some("provider.resourcePool")
        );
        let s = s.with_provider(serde_json::json!({"resourcePool": "p", "numCPUs": 0}));
        assert_eq!(c.plan(&s).unwrap_err().field(), Some("provider.numCPUs"));
        let s = spec("a")
            .with_image("DC0/vm/t")
            .with_size("2x1000")
            .with_provider(serde_json::json!({"resourcePool": "p"}));
        let p = c.plan(&s).unwrap();
        assert_eq!((p.num_cpus, p.memory_mib), (Some(2), Some(1000)));
        assert_eq!(p.folder, "DC0/vm");
        let s = s.with_size("2x1001");
        assert_eq!(c.plan(&s).unwrap_err().field(), Some("size"));
    }

    #[test]
    fn the_ssh_user_comes_from_the_spec_then_the_settings() {
        let c = base().build().unwrap();
        let s = MachineSpec::new(MachineName::new("a").unwrap())
            .with_image("DC0/vm/t")
            .with_provider(serde_json::json!({"resourcePool": "p", "sshUser": "debian"}));
        assert_eq!(c.plan(&s).unwrap().ssh_user.as_deref(), Some("debian"));
        let mut own = s.clone();
        own.ssh = Some(machine_core::SshAccess {
            user: "ops".into(),
            authorized_keys: Vec::new(),
        });
        assert_eq!(c.plan(&own).unwrap().ssh_user.as_deref(), Some("ops"));
        let bad = s.with_provider(serde_json::json!({"resourcePool": "p", "sshUser": "a b"}));
        assert_eq!(c.plan(&bad).unwrap_err().field(), Some("provider.sshUser"));
    }
}
