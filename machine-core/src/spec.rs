//! What a caller asks for: a machine spec, and a fleet of them, readable from YAML or JSON.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::machine::Labels;
use crate::name::MachineName;

/// The longest label key or value accepted (the tightest common limit: vSphere and
/// Kubernetes allow 63-character label values, EC2 tags 256).
pub const MAX_LABEL_VALUE_LEN: usize = 63;

/// A machine the caller wants: its name, what to run and how to reach it.
///
/// Unknown fields are refused when reading YAML or JSON, with the field's name and line.
/// Nothing here is Kubernetes-specific.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineSpec {
    /// The machine's name, unique per provider and owner.
    pub name: MachineName,
    /// The image to boot (an AMI id, a template path, an ISO URL); provider-specific.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The size (an instance type, a CPU/memory class); provider-specific.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// SSH access wanted on the machine, for decoupled software and operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshAccess>,
    /// Labels stored with the machine at the provider, to select machines by.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// Provider-specific settings (subnet, datastore, BMC), read by the provider, which
    /// refuses what it does not know with the field's path.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub provider: serde_json::Value,
}

/// SSH access wanted on a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SshAccess {
    /// The user to log in as.
    pub user: String,
    /// Public keys to authorize for that user, in OpenSSH format.
    #[serde(default)]
    pub authorized_keys: Vec<String>,
}

impl MachineSpec {
    /// A spec with only a name.
    pub fn new(name: MachineName) -> Self {
        MachineSpec {
            name,
            image: None,
            size: None,
            ssh: None,
            labels: Labels::new(),
            provider: serde_json::Value::Null,
        }
    }

    /// Sets the image.
    pub fn with_image(mut self, image: impl Into<String>) -> Self {
        self.image = Some(image.into());
        self
    }

    /// Sets the size.
    pub fn with_size(mut self, size: impl Into<String>) -> Self {
        self.size = Some(size.into());
        self
    }

    /// Adds a label.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Sets the provider-specific settings.
    pub fn with_provider(mut self, provider: serde_json::Value) -> Self {
        self.provider = provider;
        self
    }

    /// Reads the provider-specific settings (the `provider` field) into the provider's own
    /// type; `null` (no settings) gives `T::default()`. Errors are invalid-spec errors
    /// whose field is the path inside the spec, such as `provider.rootVolume.size`.
    pub fn provider_settings<T: serde::de::DeserializeOwned + Default>(&self) -> Result<T> {
        if self.provider.is_null() {
            return Ok(T::default());
        }
        serde_path_to_error::deserialize(&self.provider).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." || path.is_empty() {
                "provider".to_owned()
            } else {
                format!("provider.{path}")
            };
            Error::invalid_spec(field, e.into_inner().to_string())
        })
    }

    /// Reads one spec from YAML; errors name the field, line and column.
    pub fn from_yaml(yaml: &str) -> Result<Self> {
        let spec: MachineSpec = from_yaml(yaml)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks what serde cannot: label keys and values, the SSH user and keys.
    /// Errors name the field path.
    pub fn validate(&self) -> Result<()> {
        for (k, v) in &self.labels {
            let field = format!("labels.{k}");
            let ok_chars = |s: &str| {
                s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
            };
            if k.is_empty() || k.len() > MAX_LABEL_VALUE_LEN || !ok_chars(k) {
                return Err(Error::invalid_spec(
                    field,
                    format!(
                        "label key must be 1-{MAX_LABEL_VALUE_LEN} characters of a-z, A-Z, 0-9, '-', '_', '.', '/'"
                    ),
                ));
            }
            if v.len() > MAX_LABEL_VALUE_LEN || !ok_chars(v) {
                return Err(Error::invalid_spec(
                    field,
                    format!(
                        "label value {v:?} must be at most {MAX_LABEL_VALUE_LEN} characters of a-z, A-Z, 0-9, '-', '_', '.', '/'"
                    ),
                ));
            }
        }
        if let Some(ssh) = &self.ssh {
            if ssh.user.is_empty()
                || !ssh
                    .user
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(Error::invalid_spec(
                    "ssh.user",
                    format!("{:?} is not a valid user name", ssh.user),
                ));
            }
            for (i, key) in ssh.authorized_keys.iter().enumerate() {
                check_ssh_public_key(&format!("ssh.authorizedKeys[{i}]"), key)?;
            }
        }
        Ok(())
    }
}

/// Checks that `key` looks like an OpenSSH public key line (`ssh-ed25519 AAAA... comment`):
/// an algorithm name and a base64 blob. Errors name `field`. The key itself is checked
/// where it is used (by the SSH client, by sshd).
pub fn check_ssh_public_key(field: &str, key: &str) -> Result<()> {
    let mut parts = key.split_whitespace();
    let ok = matches!(
        (parts.next(), parts.next()),
        (Some(algo), Some(blob))
            if (algo.starts_with("ssh-") || algo.starts_with("ecdsa-") || algo.starts_with("sk-"))
                && blob.starts_with("AAAA")
    );
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            field,
            "not an OpenSSH public key (\"ssh-ed25519 AAAA... comment\")",
        ))
    }
}

/// A set of machines to provision together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSpec {
    /// The machines; names must be unique.
    pub machines: Vec<MachineSpec>,
}

impl FleetSpec {
    /// Reads a fleet from YAML and validates it; errors name the field, line and column.
    pub fn from_yaml(yaml: &str) -> Result<Self> {
        let fleet: FleetSpec = from_yaml(yaml)?;
        fleet.validate()?;
        Ok(fleet)
    }

    /// Validates every spec and refuses duplicate names.
    pub fn validate(&self) -> Result<()> {
        check_unique_names(&self.machines)
    }
}

/// Validates each spec and refuses a name given twice; errors name `machines[i]`.
pub fn check_unique_names(specs: &[MachineSpec]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for (i, spec) in specs.iter().enumerate() {
        spec.validate()
            .map_err(|e| e.within(&format!("machines[{i}]")))?;
        if !seen.insert(&spec.name) {
            return Err(Error::invalid_spec(
                format!("machines[{i}].name"),
                format!(
                    "{:?} is given more than once; names must be unique",
                    spec.name.as_str()
                ),
            ));
        }
    }
    Ok(())
}

/// Reads YAML into `T`: the one YAML reader of the project, for specs, fleets and provider
/// configuration files. Errors are invalid-spec errors whose field is the path of the
/// value being read (`hosts[1].port`, `defaults.subnetId`) and whose message gives the
/// line and column, never a snippet of the surrounding lines (which could show a secret
/// next to the mistake). See [`from_yaml_redacting`] for documents that hold secrets.
///
/// serde-saphyr is used because serde_yaml is archived and serde_yml unsound.
///
/// ```
/// #[derive(Debug, serde::Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct Inventory { hosts: Vec<String> }
///
/// let e = machine_core::from_yaml::<Inventory>("hosts: [a]\nhots: [b]\n").unwrap_err();
/// assert_eq!(e.field(), Some("hots"));
/// assert!(e.to_string().contains("unknown field `hots`"));
/// assert!(e.to_string().contains("line 2"));
/// ```
pub fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str) -> Result<T> {
    from_yaml_redacting(yaml, |_| false)
}

/// [`from_yaml`] for documents with secrets: where `secret(field)` holds, a message that
/// could quote the value (a type error) is replaced by one that does not; messages that
/// only name a key (unknown, missing, duplicate) are kept.
///
/// ```
/// #[derive(Debug, serde::Deserialize)]
/// struct Creds { token: u32 }
///
/// let e = machine_core::from_yaml_redacting::<Creds>("token: s3cr3t\n", |f| f == "token")
///     .unwrap_err();
/// assert_eq!(e.field(), Some("token"));
/// assert!(!e.to_string().contains("s3cr3t"));
/// assert!(e.to_string().contains("line 1"));
/// ```
pub fn from_yaml_redacting<T: serde::de::DeserializeOwned>(
    yaml: &str,
    secret: impl Fn(&str) -> bool,
) -> Result<T> {
    let mut path = None;
    let result = serde_saphyr::with_deserializer_from_str(yaml, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            path = Some(e.path().to_string());
            e.into_inner()
        })
    });
    result.map_err(|e| {
        // `?` segments are keys the path could not name (a duplicate key): the error
        // belongs to the map holding them.
        let field = path.map(|p| {
            let mut p = p.as_str();
            while let Some(parent) = p.strip_suffix(".?") {
                p = parent;
            }
            p.to_owned()
        });
        let field = field.filter(|p| !p.is_empty() && p != "." && p != "?");
        let error = e.without_snippet();
        // serde-saphyr's advice on duplicate keys is for programmers, not authors.
        let mut message = error
            .to_string()
            .replace(", set DuplicateKeyPolicy in Options if acceptable", "");
        let names_a_key_only = ["unknown field", "missing field", "duplicate mapping key"]
            .iter()
            .any(|start| message.starts_with(start));
        if field.as_deref().is_some_and(&secret) && !names_a_key_only {
            message = "has a value of the wrong form (not shown: it may be secret)".to_owned();
            if let Some(at) = error.location().filter(|at| at.line() > 0) {
                message.push_str(&format!(" at line {}, column {}", at.line(), at.column()));
            }
        }
        match field {
            Some(f) => Error::invalid_spec(f, message),
            None => Error::new(crate::ErrorKind::InvalidSpec, message),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    const FLEET: &str = "\
machines:
  - name: web-1
    image: debian-12
    size: small
    labels: {team: web}
    ssh:
      user: ops
      authorizedKeys: [\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE ops@laptop\"]
    provider: {subnet: subnet-1, tags: {a: b}}
  - name: db-1
";

    #[test]
    fn fleet_round_trips_through_yaml_and_json() {
        let fleet = FleetSpec::from_yaml(FLEET).unwrap();
        assert_eq!(fleet.machines.len(), 2);
        assert_eq!(fleet.machines[0].provider["subnet"], "subnet-1");
        let yaml = serde_saphyr::to_string(&fleet).unwrap();
        assert_eq!(FleetSpec::from_yaml(&yaml).unwrap(), fleet);
        let json = serde_json::to_string(&fleet).unwrap();
        assert_eq!(serde_json::from_str::<FleetSpec>(&json).unwrap(), fleet);
    }

    #[test]
    fn unknown_field_is_refused_with_its_name_and_line() {
        let e = MachineSpec::from_yaml("name: a\nimage: x\nflavour: big\n").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        let msg = e.to_string();
        assert!(msg.contains("unknown field `flavour`"), "{msg}");
        assert!(msg.contains("line 3"), "{msg}");
        let e = MachineSpec::from_yaml("name: a\nssh: {user: ops, keys: []}\n").unwrap_err();
        assert!(e.to_string().contains("unknown field `keys`"), "{e}");
    }

    #[test]
    fn bad_name_in_yaml_says_why_and_where() {
        let e = MachineSpec::from_yaml("name: Web_1\n").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("only a-z, 0-9 and '-'"), "{msg}");
        assert!(msg.contains("line 1"), "{msg}");
    }

    #[test]
    fn duplicate_names_in_a_fleet_are_refused() {
        let e =
            FleetSpec::from_yaml("machines:\n  - name: a\n  - name: b\n  - name: a\n").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some("machines[2].name"));
    }

    #[test]
    fn bad_labels_and_keys_name_the_field() {
        let e = MachineSpec::from_yaml("name: a\nlabels: {\"bad key\": x}\n").unwrap_err();
        assert_eq!(e.field(), Some("labels.bad key"));
        let e = MachineSpec::from_yaml("name: a\nssh: {user: ops, authorizedKeys: [hello]}\n")
            .unwrap_err();
        assert_eq!(e.field(), Some("ssh.authorizedKeys[0]"));
        let e = MachineSpec::from_yaml("name: a\nssh: {user: \"a b\"}\n").unwrap_err();
        assert_eq!(e.field(), Some("ssh.user"));
    }

    #[test]
    fn provider_settings_errors_name_the_path_inside_the_spec() {
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Disk {
            size: u32,
        }
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Settings {
            host: Option<String>,
            disk: Option<Disk>,
        }
        let spec = MachineSpec::from_yaml("name: a\nprovider: {host: h1}\n").unwrap();
        let s: Settings = spec.provider_settings().unwrap();
        assert_eq!(s.host.as_deref(), Some("h1"));
        assert!(s.disk.is_none());
        let spec = MachineSpec::from_yaml("name: a\nprovider: {disk: {size: 20}}\n").unwrap();
        let s: Settings = spec.provider_settings().unwrap();
        assert_eq!(s.disk.map(|d| d.size), Some(20));
        let none: Settings = MachineSpec::from_yaml("name: a\n")
            .unwrap()
            .provider_settings()
            .unwrap();
        assert!(none.host.is_none());
        let spec = MachineSpec::from_yaml("name: a\nprovider: {disk: {size: big}}\n").unwrap();
        let e = spec.provider_settings::<Settings>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some("provider.disk.size"));
        let spec = MachineSpec::from_yaml("name: a\nprovider: {hots: h1}\n").unwrap();
        let e = spec.provider_settings::<Settings>().unwrap_err();
        assert!(e.to_string().contains("unknown field `hots`"), "{e}");
    }

    #[test]
    fn fleet_errors_are_placed_in_the_fleet() {
        let e =
            FleetSpec::from_yaml("machines:\n  - name: a\n    labels: {k: \"a b\"}\n").unwrap_err();
        assert_eq!(e.field(), Some("machines[0].labels.k"));
    }
}
