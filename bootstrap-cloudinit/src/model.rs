//! The typed cloud-config: the keys bootstraps really use, each as cloud-init 22.4's
//! schema defines it, plus an escape hatch ([`CloudConfig::extra`]) for the rest.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::secret::Secret;

/// A cloud-config document. Build it with struct update syntax or the `with_*` helpers,
/// render it with [`crate::render`]. Every field maps to the cloud-init key of the same
/// name; `None` and empty lists are left out of the document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CloudConfig {
    /// `hostname`: the short host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// `fqdn`: the fully qualified name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// `prefer_fqdn_over_hostname`: set the system host name to the FQDN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer_fqdn_over_hostname: Option<bool>,
    /// `manage_etc_hosts`: whether cloud-init writes `/etc/hosts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manage_etc_hosts: Option<ManageEtcHosts>,
    /// `timezone`, such as `Etc/UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// `users`: accounts to create, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<UserEntry>,
    /// `ssh_pwauth`: allow SSH password authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_pwauth: Option<bool>,
    /// `disable_root`: refuse SSH logins as root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_root: Option<bool>,
    /// `ssh_keys`: pre-generated SSH host keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_keys: Option<SshHostKeys>,
    /// `ca_certs`: CA certificates to trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certs: Option<CaCerts>,
    /// `ntp`: time synchronisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntp: Option<Ntp>,
    /// `package_update`: run `apt-get update` (or the distro's equivalent) first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_update: Option<bool>,
    /// `package_upgrade`: upgrade installed packages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_upgrade: Option<bool>,
    /// `packages`: packages to install.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// `write_files`: files to write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write_files: Vec<WriteFile>,
    /// `bootcmd`: commands run early, on every boot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bootcmd: Vec<Command>,
    /// `runcmd`: commands run once, late in the first boot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runcmd: Vec<Command>,
    /// `phone_home`: an HTTP POST when cloud-init has finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone_home: Option<PhoneHome>,
    /// `final_message`: logged when cloud-init has finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_message: Option<String>,
    /// The escape hatch: top-level keys this model does not cover (`apt`, `snap`,
    /// `mounts`, ...), written as given. A key here that the model covers is refused by
    /// validation. Reading a document fills it with keys the model does not know, which
    /// [`crate::parse`] refuses unless the caller allowed them.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// The top-level keys [`CloudConfig`] models, in the order they are rendered.
pub const MODELED_KEYS: &[&str] = &[
    "hostname",
    "fqdn",
    "prefer_fqdn_over_hostname",
    "manage_etc_hosts",
    "timezone",
    "users",
    "ssh_pwauth",
    "disable_root",
    "ssh_keys",
    "ca_certs",
    "ntp",
    "package_update",
    "package_upgrade",
    "packages",
    "write_files",
    "bootcmd",
    "runcmd",
    "phone_home",
    "final_message",
];

impl CloudConfig {
    /// An empty document.
    pub fn new() -> Self {
        CloudConfig::default()
    }

    /// Sets `hostname`.
    pub fn with_hostname(mut self, hostname: impl Into<String>) -> Self {
        self.hostname = Some(hostname.into());
        self
    }

    /// Adds a user.
    pub fn with_user(mut self, user: User) -> Self {
        self.users.push(UserEntry::User(user));
        self
    }

    /// Adds a file.
    pub fn with_file(mut self, file: WriteFile) -> Self {
        self.write_files.push(file);
        self
    }

    /// Adds a `runcmd` shell command.
    pub fn with_runcmd(mut self, command: impl Into<String>) -> Self {
        self.runcmd.push(Command::Shell(command.into()));
        self
    }

    /// Adds a `bootcmd` shell command.
    pub fn with_bootcmd(mut self, command: impl Into<String>) -> Self {
        self.bootcmd.push(Command::Shell(command.into()));
        self
    }

    /// Adds a package.
    pub fn with_package(mut self, package: impl Into<String>) -> Self {
        self.packages.push(package.into());
        self
    }

    /// Adds an escape-hatch key written as given.
    pub fn with_extra(mut self, key: impl Into<String>, value: serde_json::Value) -> Self {
        self.extra.insert(key.into(), value);
        self
    }
}

/// `manage_etc_hosts`: `true`, `false` or `localhost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManageEtcHosts {
    /// Render `/etc/hosts` from cloud-init's template on every boot.
    True,
    /// Leave `/etc/hosts` alone.
    False,
    /// Only keep a line mapping the host name to 127.0.1.1.
    Localhost,
}

impl Serialize for ManageEtcHosts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ManageEtcHosts::True => s.serialize_bool(true),
            ManageEtcHosts::False => s.serialize_bool(false),
            ManageEtcHosts::Localhost => s.serialize_str("localhost"),
        }
    }
}

impl<'de> Deserialize<'de> for ManageEtcHosts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Bool(bool),
            Str(String),
        }
        match Repr::deserialize(d)? {
            Repr::Bool(true) => Ok(ManageEtcHosts::True),
            Repr::Bool(false) => Ok(ManageEtcHosts::False),
            Repr::Str(s) if s == "localhost" => Ok(ManageEtcHosts::Localhost),
            Repr::Str(s) => Err(serde::de::Error::custom(format!(
                "manage_etc_hosts must be true, false or \"localhost\", not {s:?}"
            ))),
        }
    }
}

/// One entry of `users`: the distro's default user, or an account.
#[derive(Debug, Clone, PartialEq)]
pub enum UserEntry {
    /// The image's default user (`default`); listing accounts without it drops it.
    Default,
    /// An account.
    User(User),
}

impl Serialize for UserEntry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            UserEntry::Default => s.serialize_str("default"),
            UserEntry::User(u) => u.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for UserEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Name(String),
            User(User),
        }
        match Repr::deserialize(d)? {
            Repr::Name(n) if n == "default" => Ok(UserEntry::Default),
            Repr::Name(n) => Ok(UserEntry::User(User::new(n))),
            Repr::User(u) => Ok(UserEntry::User(u)),
        }
    }
}

/// An account in `users`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    /// The login name.
    pub name: String,
    /// `gecos`: the full name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gecos: Option<String>,
    /// `groups`: supplementary groups, created when missing.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "string_or_list"
    )]
    pub groups: Vec<String>,
    /// `sudo`: a sudoers rule such as `ALL=(ALL) NOPASSWD:ALL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sudo: Option<String>,
    /// `shell`: the login shell (absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// `lock_passwd`: lock the password (cloud-init's default is `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_passwd: Option<bool>,
    /// `system`: create a system account without a home directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<bool>,
    /// `hashed_passwd`: a crypt(3) hash; secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hashed_passwd: Option<Secret>,
    /// `ssh_authorized_keys`: OpenSSH public keys allowed to log in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_authorized_keys: Vec<String>,
}

impl User {
    /// An account with only a name.
    pub fn new(name: impl Into<String>) -> Self {
        User {
            name: name.into(),
            gecos: None,
            groups: Vec::new(),
            sudo: None,
            shell: None,
            lock_passwd: None,
            system: None,
            hashed_passwd: None,
            ssh_authorized_keys: Vec::new(),
        }
    }

    /// An administrator: passwordless sudo, bash, password locked, these SSH keys.
    pub fn admin(name: impl Into<String>, keys: impl IntoIterator<Item = String>) -> Self {
        User {
            sudo: Some("ALL=(ALL) NOPASSWD:ALL".into()),
            shell: Some("/bin/bash".into()),
            lock_passwd: Some(true),
            ssh_authorized_keys: keys.into_iter().collect(),
            ..User::new(name)
        }
    }
}

fn string_or_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Repr::deserialize(d)? {
        Repr::One(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        Repr::Many(v) => v,
    })
}

/// A command of `runcmd` or `bootcmd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Command {
    /// A line run by `sh`.
    Shell(String),
    /// An argument vector run without a shell (nothing is interpreted).
    Argv(Vec<String>),
}

/// The content of a file in `write_files`. Two contents are equal when the file would
/// hold the same bytes.
#[derive(Debug, Clone)]
pub enum Content {
    /// Text, written as a YAML string.
    Text(String),
    /// Bytes: written as text when they are UTF-8, else base64 (`encoding: b64`).
    Bytes(Vec<u8>),
    /// Secret text: Debug shows it redacted; rendered as text.
    Secret(Secret),
}

impl Content {
    /// The bytes the file will hold.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Content::Text(s) => s.as_bytes(),
            Content::Bytes(b) => b,
            Content::Secret(s) => s.expose().as_bytes(),
        }
    }

    /// Whether the content is secret.
    pub fn is_secret(&self) -> bool {
        matches!(self, Content::Secret(_))
    }
}

impl PartialEq for Content {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl From<&str> for Content {
    fn from(value: &str) -> Self {
        Content::Text(value.to_owned())
    }
}

impl From<String> for Content {
    fn from(value: String) -> Self {
        Content::Text(value)
    }
}

impl From<Vec<u8>> for Content {
    fn from(value: Vec<u8>) -> Self {
        Content::Bytes(value)
    }
}

impl From<Secret> for Content {
    fn from(value: Secret) -> Self {
        Content::Secret(value)
    }
}

/// A file in `write_files`.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteFile {
    /// Absolute path.
    pub path: String,
    /// The content.
    pub content: Content,
    /// `owner`: `user` or `user:group` (cloud-init's default is `root:root`).
    pub owner: Option<String>,
    /// `permissions`: an octal string such as `0644`.
    pub permissions: Option<String>,
    /// `append`: append to an existing file instead of replacing it.
    pub append: bool,
    /// `defer`: write in the final stage, after users and packages exist. Required
    /// when `owner` is a user this document creates.
    pub defer: bool,
}

impl WriteFile {
    /// A file with `content`, default owner and permissions.
    pub fn new(path: impl Into<String>, content: impl Into<Content>) -> Self {
        WriteFile {
            path: path.into(),
            content: content.into(),
            owner: None,
            permissions: None,
            append: false,
            defer: false,
        }
    }

    /// Sets `permissions` (an octal string such as `0600`).
    pub fn permissions(mut self, permissions: impl Into<String>) -> Self {
        self.permissions = Some(permissions.into());
        self
    }

    /// Sets `owner`.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Sets `defer`.
    pub fn deferred(mut self) -> Self {
        self.defer = true;
        self
    }

    /// Sets `append`.
    pub fn appended(mut self) -> Self {
        self.append = true;
        self
    }
}

/// The wire form of [`WriteFile`], as cloud-init's schema has it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteFileRepr<'a> {
    path: std::borrow::Cow<'a, str>,
    #[serde(default)]
    content: std::borrow::Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    permissions: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "is_false")]
    append: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    defer: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Serialize for WriteFile {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use std::borrow::Cow;
        let (content, encoding) = match &self.content {
            Content::Text(t) => (Cow::Borrowed(t.as_str()), None),
            Content::Secret(t) => (Cow::Borrowed(t.expose()), None),
            Content::Bytes(b) => match std::str::from_utf8(b) {
                Ok(t) => (Cow::Borrowed(t), None),
                Err(_) => (
                    Cow::Owned(base64::engine::general_purpose::STANDARD.encode(b)),
                    Some("b64".to_owned()),
                ),
            },
        };
        WriteFileRepr {
            path: Cow::Borrowed(&self.path),
            content,
            encoding,
            owner: self.owner.as_deref().map(Cow::Borrowed),
            permissions: self.permissions.as_deref().map(Cow::Borrowed),
            append: self.append,
            defer: self.defer,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for WriteFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let r = WriteFileRepr::deserialize(d)?;
        let content = match r.encoding.as_deref() {
            None | Some("text/plain") => Content::Text(r.content.into_owned()),
            Some("b64" | "base64") => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(r.content.trim())
                    .map_err(|e| D::Error::custom(format!("content is not base64: {e}")))?;
                // Base64 text is already in memory and decodes smaller; only counted.
                charge_decoded(bytes.len()).map_err(D::Error::custom)?;
                Content::Bytes(bytes)
            }
            Some("gz+b64" | "gzip+base64" | "gz+base64" | "gzip+b64") => {
                let gz = base64::engine::general_purpose::STANDARD
                    .decode(r.content.trim())
                    .map_err(|e| D::Error::custom(format!("content is not base64: {e}")))?;
                Content::Bytes(gunzip_bounded(&gz).map_err(D::Error::custom)?)
            }
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "unknown encoding {other:?} (text/plain, b64, gz+b64)"
                )));
            }
        };
        Ok(WriteFile {
            path: r.path.into_owned(),
            content,
            owner: r.owner.map(|o| o.into_owned()),
            permissions: r.permissions.map(|p| p.into_owned()),
            append: r.append,
            defer: r.defer,
        })
    }
}

/// The most bytes the encoded (`b64`, `gz+b64`) `write_files` contents of one document
/// may decode to, all files together: gzip expands up to about 1000 times, so a
/// 270 KB document could otherwise ask for 200 MiB. [`crate::parse`] charges every
/// decoded byte against it and stops decompressing at the limit, never holding more.
pub const MAX_DECODED_CONTENT: usize = 64 << 20;

thread_local! {
    /// Bytes the document being read may still decode; `None` outside
    /// [`with_decode_budget`], where each file alone is held to the limit.
    static DECODE_BUDGET: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` (which reads one document) with a fresh budget of
/// [`MAX_DECODED_CONTENT`] decoded bytes shared by all its files. Serde gives
/// `Deserialize` no context, so the budget is per thread, restored even on a panic.
pub(crate) fn with_decode_budget<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(Option<usize>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DECODE_BUDGET.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(DECODE_BUDGET.with(|b| b.replace(Some(MAX_DECODED_CONTENT))));
    f()
}

fn decode_budget() -> usize {
    DECODE_BUDGET
        .with(|b| b.get())
        .unwrap_or(MAX_DECODED_CONTENT)
}

fn too_large() -> String {
    format!(
        "content decodes to more than {} MiB, the limit for all encoded write_files contents of one document together",
        MAX_DECODED_CONTENT >> 20
    )
}

fn charge_decoded(n: usize) -> Result<(), String> {
    let left = decode_budget();
    if n > left {
        return Err(too_large());
    }
    DECODE_BUDGET.with(|b| {
        if let Some(v) = b.get() {
            b.set(Some(v - n));
        }
    });
    Ok(())
}

/// Decompresses at most the remaining budget plus one byte, so an oversized content
/// is refused after reading only that much.
fn gunzip_bounded(gz: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let left = decode_budget();
    let mut out = Vec::new();
    // Every gzip member, as cloud-init's Python reads them.
    flate2::read::MultiGzDecoder::new(gz)
        .take(left as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("content is not gzip: {e}"))?;
    charge_decoded(out.len())?;
    Ok(out)
}

/// `ssh_keys`: host keys cloud-init installs instead of generating its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SshHostKeys {
    /// `ed25519_private`: an OpenSSH private key; secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ed25519_private: Option<Secret>,
    /// `ed25519_public`: the matching public key line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ed25519_public: Option<String>,
    /// `ecdsa_private`: an OpenSSH private key; secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecdsa_private: Option<Secret>,
    /// `ecdsa_public`: the matching public key line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecdsa_public: Option<String>,
    /// `rsa_private`: an OpenSSH private key; secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rsa_private: Option<Secret>,
    /// `rsa_public`: the matching public key line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rsa_public: Option<String>,
}

/// `ca_certs`: CA certificates added to the system trust store.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaCerts {
    /// `remove_defaults`: drop the distro's default CAs first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove_defaults: Option<bool>,
    /// `trusted`: PEM certificates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted: Vec<String>,
}

/// `ntp`: time synchronisation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ntp {
    /// `enabled`: configure NTP at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `ntp_client`: `auto`, `chrony`, `ntp`, `systemd-timesyncd`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntp_client: Option<String>,
    /// `servers`: NTP servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<String>,
    /// `pools`: NTP pools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
}

/// `phone_home`: cloud-init POSTs form data to `url` when it has finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhoneHome {
    /// The URL; cloud-init substitutes `$INSTANCE_ID`.
    pub url: String,
    /// `post`: which fields to send.
    pub post: PhoneHomePost,
    /// `tries`: attempts before giving up (cloud-init's default is 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tries: Option<u32>,
}

/// Which fields `phone_home` sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PhoneHomePost {
    /// `all`.
    All,
    /// A list of `pub_key_rsa`, `pub_key_ecdsa`, `pub_key_ed25519`, `instance_id`,
    /// `hostname`, `fqdn`.
    Fields(Vec<String>),
}

impl Serialize for PhoneHomePost {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PhoneHomePost::All => s.serialize_str("all"),
            PhoneHomePost::Fields(f) => f.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for PhoneHomePost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Str(String),
            List(Vec<String>),
        }
        match Repr::deserialize(d)? {
            Repr::Str(s) if s == "all" => Ok(PhoneHomePost::All),
            Repr::Str(s) => Err(serde::de::Error::custom(format!(
                "phone_home.post must be \"all\" or a list, not {s:?}"
            ))),
            Repr::List(l) => Ok(PhoneHomePost::Fields(l)),
        }
    }
}

/// The fields `phone_home` may post.
pub const PHONE_HOME_FIELDS: &[&str] = &[
    "pub_key_rsa",
    "pub_key_ecdsa",
    "pub_key_ed25519",
    "instance_id",
    "hostname",
    "fqdn",
];
