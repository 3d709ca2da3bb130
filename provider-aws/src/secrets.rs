//! The bootstrap data store of user data by reference on AWS: AWS Secrets Manager
//! (see [`machine_core::bootstrap_data`]).
//!
//! Each machine's document is kept as one set of secrets, named
//! `<prefix>/<owner>/<machine>/<set>-<i>` (`<set>` eight random hex digits, `<i>` the
//! part) and tagged with the owner, the machine, the document's SHA-256 and `i/n`;
//! documents over a secret's 65,536-byte limit are split across up to
//! [`SecretsManagerSettings::max_parts`] secrets, which the stub reads in order and
//! joins. The instance reads them with its own role (its instance profile needs
//! `secretsmanager:GetSecretValue` on `arn:aws:secretsmanager:<region>:<account>:secret:<prefix>/<owner>/*`);
//! the controller deletes them (`ForceDeleteWithoutRecovery`) when the bootstrap
//! finished and when the machine is deleted, and [`machine_core::Composer::sweep_bootstrap_data`]
//! deletes the sets a controller killed between `CreateSecret` and `RunInstances` left.
//!
//! Calls per machine: a put is one `ListSecrets` and one `CreateSecret` per part (a
//! put of the same bytes again: the `ListSecrets` only); a withdraw is one
//! `ListSecrets` and one `DeleteSecret` per part; the instance makes one
//! `GetSecretValue` per part (and three calls to its metadata service for credentials).
//! A sweep is one `ListSecrets` a hundred secrets.
//!
//! A put writes a new set and then deletes the machine's older sets, so a put abandoned
//! halfway leaves an incomplete set that the next put or a sweep deletes, and never a
//! set a stub already handed out loses a part.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use async_trait::async_trait;
use aws_sdk_secretsmanager::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_secretsmanager::primitives::Blob;
use aws_sdk_secretsmanager::types::{Filter, FilterNameStringType, Tag};
use machine_core::bootstrap_data::{
    BootstrapDataStore, Location, SecretsManagerLocation, StoredDocument,
};
use machine_core::{Error, ErrorKind, MachineName, Result};
use sha2::{Digest, Sha256};

use crate::config::AwsConfig;

/// The largest secret value Secrets Manager keeps: 65,536 bytes.
pub const SECRET_VALUE_LIMIT: usize = 65_536;

const TAG_OWNER: &str = "machine-core/owner";
const TAG_MACHINE: &str = "machine-core/machine";
const TAG_DIGEST: &str = "machine-core/sha256";
const TAG_PART: &str = "machine-core/part";

/// How a [`SecretsManagerStore`] names, splits and points at its secrets.
/// `#[non_exhaustive]`: start from [`SecretsManagerSettings::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SecretsManagerSettings {
    /// The first part of every secret's name (default `machine-core/bootstrap`).
    pub prefix: String,
    /// The most secrets one document is split across (default 8: 512 KiB).
    pub max_parts: usize,
    /// The Secrets Manager endpoint the controller calls, when not the region's.
    pub endpoint_url: Option<String>,
    /// The Secrets Manager endpoint the instances call, when not the region's (a VPC
    /// endpoint without private DNS, say); defaults to [`Self::endpoint_url`].
    pub instance_endpoint_url: Option<String>,
    /// The instance metadata service the instances ask for their role's credentials,
    /// when not `http://169.254.169.254` (`http://[fd00:ec2::254]` on IPv6-only
    /// instances).
    pub metadata_endpoint: Option<String>,
}

impl Default for SecretsManagerSettings {
    fn default() -> Self {
        SecretsManagerSettings {
            prefix: "machine-core/bootstrap".to_owned(),
            max_parts: 8,
            endpoint_url: None,
            instance_endpoint_url: None,
            metadata_endpoint: None,
        }
    }
}

impl SecretsManagerSettings {
    /// Sets the name prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the most parts a document is split across.
    pub fn with_max_parts(mut self, parts: usize) -> Self {
        self.max_parts = parts;
        self
    }

    /// Sets the endpoint the controller calls (and, unless set apart, the instances).
    pub fn with_endpoint_url(mut self, url: impl Into<String>) -> Self {
        self.endpoint_url = Some(url.into());
        self
    }

    /// Sets the endpoint the instances call.
    pub fn with_instance_endpoint_url(mut self, url: impl Into<String>) -> Self {
        self.instance_endpoint_url = Some(url.into());
        self
    }

    /// Sets the instance metadata service the instances use.
    pub fn with_metadata_endpoint(mut self, url: impl Into<String>) -> Self {
        self.metadata_endpoint = Some(url.into());
        self
    }
}

/// AWS Secrets Manager as a bootstrap data store. See the [module docs](self).
pub struct SecretsManagerStore {
    sdk: aws_sdk_secretsmanager::Client,
    region: String,
    owner: String,
    settings: SecretsManagerSettings,
    calls: Calls,
}

/// Secrets Manager calls this store made, by operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SecretsManagerCalls {
    /// `ListSecrets` pages.
    pub list: u64,
    /// `CreateSecret`.
    pub create: u64,
    /// `DeleteSecret`.
    pub delete: u64,
}

#[derive(Default)]
struct Calls {
    list: AtomicU64,
    create: AtomicU64,
    delete: AtomicU64,
}

impl fmt::Debug for SecretsManagerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsManagerStore")
            .field("region", &self.region)
            .field("owner", &self.owner)
            .field("settings", &self.settings)
            .finish()
    }
}

impl fmt::Display for SecretsManagerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AWS Secrets Manager ({}, {}/{})",
            self.region, self.settings.prefix, self.owner
        )
    }
}

/// One secret of a set, as listed.
struct Listed {
    name: String,
    machine: String,
    digest: String,
    part: usize,
    parts: usize,
    created: SystemTime,
}

impl SecretsManagerStore {
    /// A store in `config`'s region, with its credentials and owner (the provider's
    /// settings, so that documents are scoped as machines are), named and split as
    /// `settings` says. Makes no call.
    pub async fn new(config: &AwsConfig, settings: SecretsManagerSettings) -> Result<Self> {
        if settings.max_parts == 0 {
            return Err(Error::invalid_spec("maxParts", "must be greater than zero"));
        }
        let safe = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/_+=.@-".contains(c))
        };
        if !safe(&settings.prefix) {
            return Err(Error::invalid_spec(
                "prefix",
                "a secret name prefix holds letters, digits and /_+=.@- only",
            ));
        }
        let sdk_config = crate::client::load(config, settings.endpoint_url.as_deref()).await;
        let sm_config = aws_sdk_secretsmanager::config::Builder::from(&sdk_config)
            // CreateSecret's body holds the document: never in the SDK's TRACE log.
            .interceptor(crate::redact::RedactBodies)
            .build();
        Ok(SecretsManagerStore {
            sdk: aws_sdk_secretsmanager::Client::from_conf(sm_config),
            region: config.region().to_owned(),
            owner: config.owner().to_owned(),
            settings,
            calls: Calls::default(),
        })
    }

    /// The calls made so far, by operation.
    pub fn calls(&self) -> SecretsManagerCalls {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SecretsManagerCalls {
            list: n(&self.calls.list),
            create: n(&self.calls.create),
            delete: n(&self.calls.delete),
        }
    }

    /// The names of the secrets this store holds for `name` now (every set), as Secrets
    /// Manager lists them: the store's raw state, for tests and diagnostics.
    pub async fn secret_names(&self, name: &MachineName) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .listed(Some(name))
            .await?
            .into_iter()
            .map(|l| l.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// The owner as a piece of a secret name.
    fn owner_path(&self) -> String {
        self.owner
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "_+=.@-".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    }

    fn name_prefix(&self, machine: Option<&MachineName>) -> String {
        match machine {
            Some(m) => format!("{}/{}/{m}/", self.settings.prefix, self.owner_path()),
            None => format!("{}/{}/", self.settings.prefix, self.owner_path()),
        }
    }

    /// Every secret of this owner (of `machine` only, when given), by its tags.
    async fn listed(&self, machine: Option<&MachineName>) -> Result<Vec<Listed>> {
        let prefix = self.name_prefix(machine);
        let mut out = Vec::new();
        let mut next: Option<String> = None;
        loop {
            self.calls.list.fetch_add(1, Ordering::Relaxed);
            let page = self
                .sdk
                .list_secrets()
                .filters(
                    Filter::builder()
                        .key(FilterNameStringType::Name)
                        .values(&prefix)
                        .build(),
                )
                .max_results(100)
                .set_next_token(next.take())
                .send()
                .await
                .map_err(|e| sm_error("ListSecrets", e))?;
            for entry in page.secret_list() {
                let tag = |key: &str| {
                    entry
                        .tags()
                        .iter()
                        .find(|t| t.key() == Some(key))
                        .and_then(|t| t.value())
                        .map(str::to_owned)
                };
                // The name filter is a case-insensitive prefix: the tags decide.
                let (Some(name), Some(owner), Some(m), Some(digest), Some(part)) = (
                    entry.name(),
                    tag(TAG_OWNER),
                    tag(TAG_MACHINE),
                    tag(TAG_DIGEST),
                    tag(TAG_PART),
                ) else {
                    continue;
                };
                if owner != self.owner || machine.is_some_and(|want| want.as_str() != m) {
                    continue;
                }
                let Some((i, n)) = part
                    .split_once('/')
                    .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)))
                else {
                    continue;
                };
                let created = entry
                    .created_date()
                    .and_then(|d| SystemTime::try_from(*d).ok())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                out.push(Listed {
                    name: name.to_owned(),
                    machine: m,
                    digest,
                    part: i,
                    parts: n,
                    created,
                });
            }
            next = page.next_token().map(str::to_owned);
            if next.is_none() {
                return Ok(out);
            }
        }
    }

    async fn delete(&self, name: &str) -> Result<()> {
        self.calls.delete.fetch_add(1, Ordering::Relaxed);
        match self
            .sdk
            .delete_secret()
            .secret_id(name)
            .force_delete_without_recovery(true)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match sm_error("DeleteSecret", e) {
                gone if gone.kind() == ErrorKind::NotFound => Ok(()),
                e => Err(e),
            },
        }
    }

    fn location(&self, names: Vec<String>) -> Location {
        let endpoint = self
            .settings
            .instance_endpoint_url
            .clone()
            .or_else(|| self.settings.endpoint_url.clone());
        Location::AwsSecretsManager(
            SecretsManagerLocation::new(self.region.clone(), names)
                .with_endpoint(endpoint)
                .with_metadata_endpoint(self.settings.metadata_endpoint.clone()),
        )
    }
}

/// A set of secrets as listed: the digest and part count its tags claim, and the
/// parts found.
struct Set {
    digest: String,
    parts: usize,
    found: Vec<(usize, String)>,
}

/// The complete sets among `listed`: set prefix (name without `-<i>`) to its digest and
/// its names in part order.
fn complete_sets(listed: &[Listed]) -> BTreeMap<String, (String, Vec<String>)> {
    let mut sets: BTreeMap<String, Set> = BTreeMap::new();
    for l in listed {
        let Some((set, _)) = l.name.rsplit_once('-') else {
            continue;
        };
        let entry = sets.entry(set.to_owned()).or_insert_with(|| Set {
            digest: l.digest.clone(),
            parts: l.parts,
            found: Vec::new(),
        });
        // Parts that disagree on what the set is make it incomplete.
        if entry.digest != l.digest || entry.parts != l.parts {
            entry.parts = usize::MAX;
        }
        entry.found.push((l.part, l.name.clone()));
    }
    sets.into_iter()
        .filter_map(|(name, mut set)| {
            set.found.sort();
            let whole = set.found.len() == set.parts
                && set
                    .found
                    .iter()
                    .enumerate()
                    .all(|(i, (part, _))| *part == i);
            whole.then(|| {
                let names = set.found.into_iter().map(|(_, n)| n).collect();
                (name, (set.digest, names))
            })
        })
        .collect()
}

#[async_trait]
impl BootstrapDataStore for SecretsManagerStore {
    fn max_bytes(&self) -> usize {
        SECRET_VALUE_LIMIT.saturating_mul(self.settings.max_parts)
    }

    async fn put(&self, name: &MachineName, document: &[u8]) -> Result<Location> {
        if document.len() > self.max_bytes() {
            return Err(Error::invalid_spec(
                "userData",
                format!(
                    "{} bytes exceed {self}'s limit of {} bytes ({} secrets of {SECRET_VALUE_LIMIT})",
                    document.len(),
                    self.max_bytes(),
                    self.settings.max_parts
                ),
            ));
        }
        let digest = hex::encode(Sha256::digest(document));
        let existing = self.listed(Some(name)).await?;
        if let Some((_, (_, names))) = complete_sets(&existing)
            .into_iter()
            .find(|(_, (d, _))| *d == digest)
        {
            // The same bytes again (a create retried after its put): the same secrets,
            // so a stub already handed to EC2 stays valid.
            return Ok(self.location(names));
        }
        let mut raw = [0u8; 4];
        getrandom::fill(&mut raw)
            .map_err(|e| Error::transient(format!("no randomness for a secret name: {e}")))?;
        let set = format!("{}{}", self.name_prefix(Some(name)), hex::encode(raw));
        let chunks: Vec<&[u8]> = if document.is_empty() {
            vec![document]
        } else {
            document.chunks(SECRET_VALUE_LIMIT).collect()
        };
        let mut names = Vec::with_capacity(chunks.len());
        for (i, chunk) in chunks.iter().enumerate() {
            let secret = format!("{set}-{i}");
            let tags = [
                (TAG_OWNER, self.owner.clone()),
                (TAG_MACHINE, name.to_string()),
                (TAG_DIGEST, digest.clone()),
                (TAG_PART, format!("{i}/{}", chunks.len())),
            ]
            .into_iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
            self.calls.create.fetch_add(1, Ordering::Relaxed);
            self.sdk
                .create_secret()
                .name(&secret)
                .description(format!("machine-core bootstrap data of {name}, part {i}"))
                .secret_binary(Blob::new(chunk.to_vec()))
                .set_tags(Some(tags))
                .send()
                .await
                .map_err(|e| sm_error("CreateSecret", e))?;
            names.push(secret);
        }
        // Only now that the new set is whole do the older ones go.
        for old in existing {
            self.delete(&old.name).await?;
        }
        Ok(self.location(names))
    }

    async fn withdraw(&self, name: &MachineName) -> Result<()> {
        for secret in self.listed(Some(name)).await? {
            self.delete(&secret.name).await?;
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<StoredDocument>> {
        let mut newest: BTreeMap<String, SystemTime> = BTreeMap::new();
        for l in self.listed(None).await? {
            let at = newest.entry(l.machine).or_insert(l.created);
            *at = (*at).max(l.created);
        }
        Ok(newest
            .into_iter()
            .filter_map(|(m, at)| Some(StoredDocument::new(MachineName::new(m).ok()?, at)))
            .collect())
    }
}

/// A Secrets Manager error in machine-core's terms: its own codes first, then the
/// provider's mapping of AWS errors.
fn sm_error<E>(
    op: &str,
    err: SdkError<E, aws_sdk_secretsmanager::config::http::HttpResponse>,
) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let kind = match err.code() {
        Some("ResourceNotFoundException") => Some(ErrorKind::NotFound),
        Some("ResourceExistsException") => Some(ErrorKind::Conflict),
        Some("AccessDeniedException") => Some(ErrorKind::Unauthorized),
        Some("InternalServiceError") => Some(ErrorKind::Transient),
        _ => None,
    };
    match kind {
        Some(kind) => {
            let message = err.message().unwrap_or("").to_owned();
            Error::new(
                kind,
                format!(
                    "Secrets Manager {op}: {}: {message}",
                    err.code().unwrap_or("")
                ),
            )
            .with_source(err)
        }
        None => crate::errors::from_sdk(op, "Secrets Manager", err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(name: &str, digest: &str, part: usize, parts: usize) -> Listed {
        Listed {
            name: name.to_owned(),
            machine: "m".to_owned(),
            digest: digest.to_owned(),
            part,
            parts,
            created: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn only_sets_with_every_part_in_agreement_are_complete() {
        let all = [
            // Whole, listed out of order.
            listed("p/m/aa-1", "d1", 1, 2),
            listed("p/m/aa-0", "d1", 0, 2),
            // A put killed after its first part.
            listed("p/m/bb-0", "d2", 0, 3),
            // Parts that disagree on the digest.
            listed("p/m/cc-0", "d3", 0, 2),
            listed("p/m/cc-1", "d4", 1, 2),
        ];
        let sets = complete_sets(&all);
        assert_eq!(sets.len(), 1, "{:?}", sets.keys().collect::<Vec<_>>());
        let (digest, names) = &sets["p/m/aa"];
        assert_eq!(digest, "d1");
        assert_eq!(names, &["p/m/aa-0", "p/m/aa-1"]);
    }
}
