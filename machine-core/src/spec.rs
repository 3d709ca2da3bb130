//! What a caller asks for: a machine spec, and a fleet of them, readable from YAML or JSON.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, shorten_quoted, shown, shown_key};
use crate::locate::at_document_line;
use crate::machine::Labels;
use crate::name::MachineName;

/// The longest label key or value accepted (the tightest common limit: vSphere and
/// Kubernetes allow 63-character label values, EC2 tags 256).
pub const MAX_LABEL_VALUE_LEN: usize = 63;

/// The most labels a spec may carry: above what any provider stores (EC2 takes 50 tags
/// per instance, the provider's own included), and a bound on what a document can make
/// every later call carry.
pub const MAX_LABELS: usize = 64;

/// A machine the caller wants: its name, what to run and how to reach it.
///
/// Unknown fields are refused when reading YAML or JSON, with the field's name and line.
/// Nothing here is Kubernetes-specific.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
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
    /// Labels stored with the machine at the provider, to select machines by; at most
    /// 64, `MAX_LABELS` (a document with more is refused as it is read, without reading
    /// the rest).
    #[cfg_attr(feature = "schemars", schemars(extend("maxProperties" = 64)))]
    #[serde(
        default,
        skip_serializing_if = "Labels::is_empty",
        deserialize_with = "bounded_labels"
    )]
    pub labels: Labels,
    /// Provider-specific settings (subnet, datastore, BMC), read by the provider, which
    /// refuses what it does not know with the field's path.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    #[cfg_attr(
        feature = "schemars",
        schemars(schema_with = "crate::schema::open_object")
    )]
    pub provider: serde_json::Value,
}

/// Reads labels, refusing the entry past [`MAX_LABELS`] as soon as it is seen: a
/// document of 300,000 labels costs no more than one of 65.
fn bounded_labels<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Labels, D::Error> {
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Labels;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a map of at most {MAX_LABELS} labels")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> std::result::Result<Labels, A::Error> {
            let mut labels = Labels::new();
            while let Some((k, v)) = map.next_entry::<String, String>()? {
                if labels.len() == MAX_LABELS {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_LABELS} labels; a machine carries at most {MAX_LABELS}"
                    )));
                }
                labels.insert(k, v);
            }
            Ok(labels)
        }
    }
    d.deserialize_map(Bounded)
}

/// SSH access wanted on a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
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

    /// Reads one spec from YAML and validates it; errors name the field, line and column.
    pub fn from_yaml(yaml: &str) -> Result<Self> {
        let spec: MachineSpec = from_yaml(yaml)?;
        spec.validate().map_err(|e| at_document_line(e, yaml))?;
        Ok(spec)
    }

    /// Reads one spec from JSON and validates it, as [`MachineSpec::from_yaml`] does.
    /// Use it rather than `serde_json::from_str`, which only checks the shape: serde
    /// alone does not run [`MachineSpec::validate`].
    pub fn from_json(json: &str) -> Result<Self> {
        let spec: MachineSpec = from_json(json)?;
        spec.validate().map_err(|e| at_document_line(e, json))?;
        Ok(spec)
    }

    /// Checks what serde cannot: label keys and values, the SSH user and keys.
    /// Errors name the field path.
    pub fn validate(&self) -> Result<()> {
        if self.labels.len() > MAX_LABELS {
            return Err(Error::invalid_spec(
                "labels",
                format!(
                    "{} labels; a machine carries at most {MAX_LABELS}",
                    self.labels.len()
                ),
            ));
        }
        for (k, v) in &self.labels {
            let field = format!("labels.{}", shown_key(k));
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
                        "label value {} must be at most {MAX_LABEL_VALUE_LEN} characters of a-z, A-Z, 0-9, '-', '_', '.', '/'",
                        shown(v)
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
                    format!("{} is not a valid user name", shown(&ssh.user)),
                ));
            }
            for (i, key) in ssh.authorized_keys.iter().enumerate() {
                check_ssh_public_key(&format!("ssh.authorizedKeys[{i}]"), key)?;
            }
        }
        Ok(())
    }
}

/// The longest public key line [`check_ssh_public_key`] accepts: 16 KiB holds a 16384-bit
/// RSA key or a certificate with room to spare.
pub const MAX_SSH_PUBLIC_KEY_LEN: usize = 16 * 1024;

/// Checks that `key` is one OpenSSH public key line (`ssh-ed25519 AAAA... comment`): a key
/// type, a blob that is canonical base64 and that starts with the same key type (as every
/// OpenSSH key blob does, RFC 4253 section 6.6), and an optional comment, all on one line.
/// Errors name `field`. Whether the key's numbers are sound is left to where it is used
/// (the SSH client, sshd).
pub fn check_ssh_public_key(field: &str, key: &str) -> Result<()> {
    let bad = |why: String| {
        Err(Error::invalid_spec(
            field,
            format!(
                "{why}; expected one OpenSSH public key line (\"ssh-ed25519 AAAA... comment\")"
            ),
        ))
    };
    if key.len() > MAX_SSH_PUBLIC_KEY_LEN {
        return bad(format!(
            "is {} bytes long, more than {MAX_SSH_PUBLIC_KEY_LEN}",
            key.len()
        ));
    }
    // A newline would let one entry add a second key (or an option line) to authorized_keys.
    if let Some(c) = key.chars().find(|c| c.is_control() && *c != '\t') {
        return bad(format!("contains the control character {c:?}"));
    }
    let mut parts = key.split([' ', '\t']).filter(|p| !p.is_empty());
    let (Some(algo), Some(blob)) = (parts.next(), parts.next()) else {
        return bad(format!("{} has no key type and key blob", shown(key)));
    };
    if !(algo.starts_with("ssh-") || algo.starts_with("ecdsa-") || algo.starts_with("sk-")) {
        return bad(format!("{} is not an OpenSSH key type", shown(algo)));
    }
    use base64::Engine as _;
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(blob) else {
        return bad(format!("the key blob {} is not base64", shown(blob)));
    };
    let inner = bytes
        .get(..4)
        .map(|len| u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize)
        .and_then(|len| bytes.get(4..4usize.saturating_add(len)));
    match inner {
        Some(name) if name == algo.as_bytes() => Ok(()),
        Some(name) => bad(format!(
            "the key blob holds a {} key, not {}",
            shown(&String::from_utf8_lossy(name)),
            shown(algo)
        )),
        None => bad("the key blob does not start with its key type".to_owned()),
    }
}

/// The longest timeout, deadline or interval a caller may write anywhere (a spec, an
/// inventory, a provider's config): one day. Longer values are refused where they are read
/// (`18446744073709551615s` would overflow the clock when added to now and panic in
/// tokio or the AWS SDK).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// Checks that the duration at `field` is above zero and at most `max` (usually
/// [`MAX_TIMEOUT`]); the error names `field` and both bounds.
///
/// ```
/// use std::time::Duration;
/// use machine_core::{MAX_TIMEOUT, check_duration};
///
/// check_duration("probeTimeout", Duration::from_secs(10), MAX_TIMEOUT).unwrap();
/// let e = check_duration("probeTimeout", Duration::MAX, MAX_TIMEOUT).unwrap_err();
/// assert_eq!(e.field(), Some("probeTimeout"));
/// assert!(e.to_string().contains("at most 1day"), "{e}");
/// ```
pub fn check_duration(field: &str, value: Duration, max: Duration) -> Result<()> {
    if value.is_zero() {
        return Err(Error::invalid_spec(field, "must be greater than zero"));
    }
    if value > max {
        return Err(Error::invalid_spec(
            field,
            format!(
                "{} is too long: at most {} is allowed",
                humantime::format_duration(value),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(())
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
        fleet.validate().map_err(|e| at_document_line(e, yaml))?;
        Ok(fleet)
    }

    /// Reads a fleet from JSON and validates it, as [`FleetSpec::from_yaml`] does.
    pub fn from_json(json: &str) -> Result<Self> {
        let fleet: FleetSpec = from_json(json)?;
        fleet.validate().map_err(|e| at_document_line(e, json))?;
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
    from_yaml_within(yaml, secret, &DocumentLimits::DEFAULT)
}

/// The largest document [`from_yaml`] and [`from_json`] read, in bytes (64 MiB). A
/// 100,000-machine fleet of specs with labels, SSH keys and provider settings is about
/// 40 MB; a larger input is refused before it is parsed.
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024 * 1024;

/// The most YAML nodes (scalars, lists and maps, counted as written, before aliases
/// expand) one document read by [`from_yaml`] may hold: 5,000,000, which is 50 per machine
/// for a 100,000-machine fleet (a spec with a name, image, size, two labels, an SSH user
/// and key and three provider settings has about 20). It bounds the memory and time a
/// hostile document can cost; aliases are bounded by serde-saphyr's own limits.
pub const MAX_YAML_NODES: usize = 5_000_000;

/// The most YAML events that aliases (`*name`) may replay in one document read by
/// [`from_yaml`]: 50,000. Enough to share settings among machines with anchors; it keeps
/// "billion laughs" documents (aliases of aliases) to a fraction of a second.
pub const MAX_YAML_ALIAS_EVENTS: usize = 50_000;

/// The limits a document reader applies; [`DocumentLimits::DEFAULT`] is the documented one,
/// smaller ones let tests reach a limit without a huge input.
pub(crate) struct DocumentLimits {
    pub(crate) max_bytes: usize,
    pub(crate) max_nodes: usize,
}

impl DocumentLimits {
    pub(crate) const DEFAULT: DocumentLimits = DocumentLimits {
        max_bytes: MAX_DOCUMENT_BYTES,
        max_nodes: MAX_YAML_NODES,
    };

    fn check_len(&self, len: usize) -> Result<()> {
        if len > self.max_bytes {
            return Err(Error::new(
                crate::ErrorKind::InvalidSpec,
                format!(
                    "the document is too large: {len} bytes, more than the {} bytes a document may have",
                    self.max_bytes
                ),
            ));
        }
        Ok(())
    }
}

pub(crate) fn from_yaml_within<T: serde::de::DeserializeOwned>(
    yaml: &str,
    secret: impl Fn(&str) -> bool,
    limits: &DocumentLimits,
) -> Result<T> {
    limits.check_len(yaml.len())?;
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_nodes: limits.max_nodes,
            // Every node is one event, every list and map one more for its end.
            max_events: limits.max_nodes.saturating_mul(2).saturating_add(16),
            max_total_scalar_bytes: limits.max_bytes,
            max_recorded_anchor_events: MAX_YAML_ALIAS_EVENTS,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: MAX_YAML_ALIAS_EVENTS,
        },
    };
    let mut path = None;
    let result = serde_saphyr::with_deserializer_from_str_with_options(yaml, options, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            path = Some(e.path().to_string());
            e.into_inner()
        })
    });
    result.map_err(|e| {
        let error = e.without_snippet();
        // A budget breach met while replaying an alias comes wrapped with the alias's place.
        let mut inner = error;
        while let serde_saphyr::Error::AliasError { error, .. }
        | serde_saphyr::Error::WithSnippet { error, .. } = inner
        {
            inner = error;
        }
        if let serde_saphyr::Error::Budget { breach, location } = inner {
            // The budget is the document's, whichever value it ran out at: no field.
            let mut message = format!(
                "the document is too large for the YAML reader's budget ({breach:?}); a document may have at most {} nodes (scalars, lists and maps), {} bytes and {MAX_YAML_ALIAS_EVENTS} events replayed by aliases",
                limits.max_nodes, limits.max_bytes
            );
            if location.line() > 0 {
                message.push_str(&format!(" (stopped at line {})", location.line()));
            }
            return Error::new(crate::ErrorKind::InvalidSpec, message);
        }
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
        // serde-saphyr's advice on duplicate keys is for programmers, not authors.
        let mut message = shorten_quoted(
            &error
                .to_string()
                .replace(", set DuplicateKeyPolicy in Options if acceptable", ""),
        );
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
            Some(f) => Error::invalid_spec(shorten_path(&f), message),
            None => Error::new(crate::ErrorKind::InvalidSpec, message),
        }
    })
}

/// Reads JSON into `T`, as [`from_yaml`] reads YAML: errors are invalid-spec errors whose
/// field is the path of the value being read and whose message gives the line and
/// column; documents over [`MAX_DOCUMENT_BYTES`] are refused unread. Like `from_yaml`, it
/// only reads: the `from_json` of each public type ([`MachineSpec::from_json`],
/// [`FleetSpec::from_json`]) also validates.
///
/// ```
/// #[derive(Debug, serde::Deserialize)]
/// struct Inventory { hosts: Vec<u16> }
///
/// let e = machine_core::from_json::<Inventory>("{\n  \"hosts\": [22, \"x\"]\n}").unwrap_err();
/// assert_eq!(e.field(), Some("hosts[1]"));
/// assert!(e.to_string().contains("line 2"), "{e}");
/// ```
pub fn from_json<T: serde::de::DeserializeOwned>(json: &str) -> Result<T> {
    from_json_redacting(json, |_| false)
}

/// [`from_json`] for documents with secrets: where `secret(field)` holds, a message that
/// could quote the value is replaced by one that does not, as [`from_yaml_redacting`] does.
pub fn from_json_redacting<T: serde::de::DeserializeOwned>(
    json: &str,
    secret: impl Fn(&str) -> bool,
) -> Result<T> {
    DocumentLimits::DEFAULT.check_len(json.len())?;
    let mut de = serde_json::Deserializer::from_str(json);
    let result = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| (e.path().to_string(), e.into_inner()))
        .and_then(|v| de.end().map(|()| v).map_err(|e| (String::new(), e)));
    result.map_err(|(path, error)| {
        // Nesting deeper than serde_json's limit is the document's fault, not a field's.
        let too_deep = error.to_string().starts_with("recursion limit exceeded");
        let field = Some(path).filter(|p| !too_deep && !p.is_empty() && p != "." && p != "?");
        let mut message = shorten_quoted(&error.to_string());
        if too_deep {
            message = format!(
                "the document is nested too deeply (more than 128 levels) at line {} column {}",
                error.line(),
                error.column()
            );
        }
        let names_a_key_only = ["unknown field", "missing field", "duplicate field"]
            .iter()
            .any(|start| message.starts_with(start));
        if field.as_deref().is_some_and(&secret) && !names_a_key_only {
            message = format!(
                "has a value of the wrong form (not shown: it may be secret) at line {} column {}",
                error.line(),
                error.column()
            );
        }
        match field {
            Some(f) => Error::invalid_spec(shorten_path(&f), message),
            None => Error::new(crate::ErrorKind::InvalidSpec, message),
        }
    })
}

/// A field path from a reader, with each segment cut as [`shown_key`] cuts map keys.
fn shorten_path(path: &str) -> String {
    if path.len() <= 4 * crate::error::MAX_SHOWN_VALUE_CHARS {
        return path.to_owned();
    }
    path.split('.')
        .map(|segment| shown_key(segment).into_owned())
        .collect::<Vec<_>>()
        .join(".")
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
      authorizedKeys: [\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOXLZCJgZESodBc7Vjr3vb4fE0hSuOzUa5iERyuZmke1 ops@laptop\"]
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

    const ED25519: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOXLZCJgZESodBc7Vjr3vb4fE0hSuOzUa5iERyuZmke1 ops@laptop";
    const ECDSA: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBE3sxLq0FZKvTPKy+kxXKAkCj1OTk0ILIRayvb8iXUjjpaqqx/xwNsMIkH9tX++xaaHT/pb6GlukEquU3CGODWc=";

    #[test]
    fn genuine_public_keys_are_accepted() {
        for key in [
            ED25519,
            ECDSA,
            &ED25519[..ED25519.len() - " ops@laptop".len()],
            &ED25519.replace(' ', "\t"),
        ] {
            check_ssh_public_key("k", key).unwrap_or_else(|e| panic!("{key:?}: {e}"));
        }
    }

    #[test]
    fn public_keys_with_a_newline_or_a_bad_blob_are_refused() {
        let blob = ED25519.split(' ').nth(1).unwrap();
        let ecdsa_blob = ECDSA.split(' ').nth(1).unwrap();
        for (key, why) in [
            (
                format!("{ED25519}\nssh-ed25519 {blob} evil"),
                "control character",
            ),
            (format!("{ED25519}\r"), "control character"),
            (format!("ssh-ed25519 {blob}\0"), "control character"),
            ("ssh-ed25519 AAAA!!!not-base64".to_owned(), "not base64"),
            (
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE ops@laptop".to_owned(),
                "not base64",
            ),
            (
                format!("ssh-rsa {blob}"),
                "holds a \"ssh-ed25519\" key, not \"ssh-rsa\"",
            ),
            (
                format!("ssh-ed25519 {ecdsa_blob}"),
                "holds a \"ecdsa-sha2-nistp256\" key",
            ),
            (
                "ssh-ed25519 AAAA".to_owned(),
                "does not start with its key type",
            ),
            ("hello".to_owned(), "no key type"),
            (format!("rsa {blob}"), "not an OpenSSH key type"),
            (format!("ssh-ed25519 {}", "A".repeat(20_000)), "bytes long"),
        ] {
            let e = check_ssh_public_key("ssh.authorizedKeys[0]", &key).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidSpec);
            assert_eq!(e.field(), Some("ssh.authorizedKeys[0]"));
            assert!(e.message().contains(why), "{key:?}: {e}");
            assert!(e.to_string().len() < 400, "{e}");
        }
    }

    #[test]
    fn a_bad_name_read_from_yaml_or_json_says_its_prefix_once() {
        for e in [
            MachineSpec::from_yaml("name: Web_1\n").unwrap_err(),
            MachineSpec::from_json("{\"name\": \"Web_1\"}").unwrap_err(),
        ] {
            let msg = e.to_string();
            assert_eq!(msg.matches("invalid spec").count(), 1, "{msg}");
            assert_eq!(e.field(), Some("name"), "{msg}");
            assert!(
                msg.starts_with("invalid spec: name: \"Web_1\" contains"),
                "{msg}"
            );
            assert!(msg.contains("line 1"), "{msg}");
        }
    }

    #[test]
    fn json_is_validated_like_yaml() {
        let e = MachineSpec::from_json("{\"name\": \"a\",\n \"labels\": {\"k\": \"a b\"}}")
            .unwrap_err();
        assert_eq!(e.field(), Some("labels.k"), "{e}");
        let e = MachineSpec::from_json(
            "{\"name\": \"a\",\n \"ssh\": {\"user\": \"ops\", \"authorizedKeys\": [\"x\"]}}",
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("ssh.authorizedKeys[0]"), "{e}");
        let e = MachineSpec::from_json("{\"name\": \"a\",\n \"flavour\": 1}").unwrap_err();
        assert_eq!(e.field(), Some("flavour"), "{e}");
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = FleetSpec::from_json("{\"machines\": [{\"name\": \"a\"}, {\"name\": \"a\"}]}")
            .unwrap_err();
        assert_eq!(e.field(), Some("machines[1].name"), "{e}");
        let e = MachineSpec::from_json("{\"name\": \"a\"} trailing").unwrap_err();
        assert!(e.to_string().contains("trailing"), "{e}");
        let ok = FleetSpec::from_json(
            &serde_json::to_string(&FleetSpec::from_yaml(FLEET).unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(ok, FleetSpec::from_yaml(FLEET).unwrap());
    }

    #[test]
    fn long_values_are_shown_cut_in_every_reader_error() {
        let long = "v".repeat(10_000);
        for e in [
            MachineSpec::from_yaml(&format!("name: a\nlabels: {{k: \"{long}\"}}\n")).unwrap_err(),
            MachineSpec::from_yaml(&format!("name: a\nlabels: {{\"{long}\": x}}\n")).unwrap_err(),
            MachineSpec::from_yaml(&format!("name: a\nssh: {{user: \"{long} \"}}\n")).unwrap_err(),
            MachineSpec::from_yaml(&format!("name: a\nimage: [\"{long}\"]\n")).unwrap_err(),
            MachineSpec::from_yaml(&format!("name: a\n{long}: 1\n")).unwrap_err(),
            MachineSpec::from_json(&format!("{{\"name\": \"a\", \"image\": [\"{long}\"]}}"))
                .unwrap_err(),
            MachineSpec::from_json(&format!("{{\"name\": \"{long}\"}}")).unwrap_err(),
        ] {
            let shown = e.to_string();
            assert!(
                shown.len() < 400,
                "{} bytes: {}",
                shown.len(),
                &shown[..400]
            );
        }
    }

    /// A fleet document of `n` machines the way an operator writes one.
    fn fleet_of(n: usize) -> String {
        let mut yaml = String::from("machines:\n");
        for i in 0..n {
            yaml.push_str(&format!(
                "  - name: m-{i}\n    image: debian-12\n    size: small\n    labels: {{team: web, env: prod, rack: r{}}}\n    ssh:\n      user: ops\n      authorizedKeys: [\"{ED25519}\"]\n    provider: {{subnet: subnet-1, zone: a}}\n",
                i % 40
            ));
        }
        yaml
    }

    #[test]
    fn a_fleet_of_nine_thousand_machines_is_read() {
        let fleet = FleetSpec::from_yaml(&fleet_of(9_000)).unwrap();
        assert_eq!(fleet.machines.len(), 9_000);
    }

    #[test]
    fn the_budget_fits_a_hundred_thousand_machines() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NODES: AtomicUsize = AtomicUsize::new(0);
        let options = serde_saphyr::options! {
            budget_report: Some(|r: &serde_saphyr::budget::BudgetReport| {
                NODES.store(r.nodes, Ordering::SeqCst)
            }),
        };
        let _: FleetSpec = serde_saphyr::from_str_with_options(&fleet_of(100), options).unwrap();
        let per_machine = NODES.load(Ordering::SeqCst) / 100;
        assert!(per_machine >= 28, "{per_machine} nodes a machine");
        assert!(MAX_YAML_NODES >= 100_000 * per_machine, "{per_machine}");
        assert!(fleet_of(100_000).len() <= MAX_DOCUMENT_BYTES);
    }

    #[test]
    fn a_document_over_the_budget_is_too_large_not_a_bad_machine() {
        let limits = DocumentLimits {
            max_bytes: MAX_DOCUMENT_BYTES,
            max_nodes: 2_000,
        };
        let e = from_yaml_within::<FleetSpec>(&fleet_of(200), |_| false, &limits).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), None, "{e}");
        assert!(e.message().starts_with("the document is too large"), "{e}");
        assert!(e.message().contains("2000 nodes"), "{e}");
        let limits = DocumentLimits {
            max_bytes: 1_000,
            max_nodes: MAX_YAML_NODES,
        };
        let e = from_yaml_within::<FleetSpec>(&fleet_of(200), |_| false, &limits).unwrap_err();
        assert!(e.message().starts_with("the document is too large"), "{e}");
        assert_eq!(e.field(), None, "{e}");
    }

    #[test]
    fn errors_found_by_validate_give_the_line() {
        let e =
            FleetSpec::from_yaml("machines:\n  - name: a\n  - name: b\n    labels: {k: \"a b\"}\n")
                .unwrap_err();
        assert_eq!(e.field(), Some("machines[1].labels.k"));
        assert!(e.message().contains("(line 4, column 17)"), "{e}");
        let e = MachineSpec::from_json("{\"name\": \"a\",\n \"ssh\": {\"user\": \"a b\"}}")
            .unwrap_err();
        assert_eq!(e.field(), Some("ssh.user"));
        assert!(e.message().contains("(line 2,"), "{e}");
    }

    #[test]
    fn a_spec_with_too_many_labels_is_refused_with_little_work() {
        let mut y = String::from("name: a\nlabels:\n");
        for i in 0..300_000 {
            y.push_str(&format!("  k{i}: v\n"));
        }
        let (e, took) = crate::conformance::cpu_time(|| MachineSpec::from_yaml(&y).unwrap_err());
        assert_eq!(e.field(), Some("labels"), "{e}");
        assert!(e.to_string().contains("at most 64"), "{e}");
        assert!(
            took < std::time::Duration::from_secs(10),
            "used {took:?} of CPU"
        );
    }

    #[test]
    fn an_alias_bomb_is_refused_as_too_large_and_quickly() {
        let mut y = String::from("name: a\nprovider:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            y.push_str(&format!(
                "  a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let (e, took) = crate::conformance::cpu_time(|| MachineSpec::from_yaml(&y).unwrap_err());
        assert_eq!(e.field(), None, "{e}");
        assert!(e.message().starts_with("the document is too large"), "{e}");
        // Work, not wall time: a busy machine must not fail it.
        assert!(
            took < std::time::Duration::from_secs(2),
            "used {took:?} of CPU"
        );
        // Anchors used as they are meant to be still read.
        let fleet = FleetSpec::from_yaml(
            "machines:\n  - name: a\n    labels: &l {team: web}\n  - name: b\n    labels: *l\n",
        )
        .unwrap();
        assert_eq!(fleet.machines[1].labels["team"], "web");
    }

    #[test]
    fn fleet_errors_are_placed_in_the_fleet() {
        let e =
            FleetSpec::from_yaml("machines:\n  - name: a\n    labels: {k: \"a b\"}\n").unwrap_err();
        assert_eq!(e.field(), Some("machines[0].labels.k"));
    }
}
