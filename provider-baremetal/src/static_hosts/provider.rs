//! [`StaticHostsProvider`]: "creating" a machine claims a free host of the inventory,
//! "deleting" it releases the claim. The claim lives on the host, so every controller
//! with the same inventory and owner sees the same machines, and a restarted one adopts
//! them.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::future::join_all;
use machine_core::{
    Access, Address, AddressKind, Capabilities, Connector, Error, Labels, Machine, MachineName,
    MachineProvisioner, MachineSpec, Phase, PowerOp, ProviderId, Result, SshEndpoint, Transport,
    UserData, unsupported_power_op, user_data,
};
use serde::{Deserialize, Serialize};

use super::claim::{Claim, ClaimFile};
use super::config::{HostEntry, StaticHostsConfig};

/// The provider ID scheme: `static:///<host name>`.
pub const SCHEME: &str = "static";

/// What a spec's `provider` field may say to this provider.
///
/// ```yaml
/// provider: {host: rack1-a}           # exactly this host
/// provider: {selector: {rack: r1}}    # any free host with these labels
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticHostSettings {
    /// The inventory name of the one host to claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Labels a host must have to be claimed; empty means any host.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub selector: Labels,
}

/// Existing hosts as machines.
///
/// - `create` adopts the host already claimed under the spec's name, or claims the first
///   free host the spec allows (`provider.host` or `provider.selector`, in inventory
///   order). A host is claimed by writing a claim file on it atomically, so two
///   controllers never claim one host. When all allowed hosts are claimed the error is
///   [`machine_core::ErrorKind::QuotaExceeded`]; when some did not answer it is transient.
/// - `find`, `list` and `get` read the claims from the hosts. A host that does not
///   answer within the probe timeout makes `find` and `list` fail with a transient
///   error rather than answer "no such machine" and risk a second claim.
/// - `delete` removes the claim: the host is free again, with whatever software it got
///   (wiping a host is not this provider's business).
/// - There is no user data (the hosts are running already; use decoupled layers) and no
///   power control.
///
/// Two controllers creating the same name at the same instant may each claim a host;
/// whichever looks next keeps the claim on the first host in inventory order and
/// releases the other.
pub struct StaticHostsProvider {
    config: StaticHostsConfig,
    connector: Arc<dyn Connector>,
    capabilities: Capabilities,
}

impl fmt::Display for StaticHostsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "static-hosts(owner={}, {} hosts)",
            self.config.owner,
            self.config.hosts.len()
        )
    }
}

impl fmt::Debug for StaticHostsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticHostsProvider")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl StaticHostsProvider {
    /// A provider over `config`'s hosts, reaching them through `connector` (an SSH
    /// connector, normally). The config is checked here.
    pub fn new(config: StaticHostsConfig, connector: Arc<dyn Connector>) -> Result<Self> {
        config.validate()?;
        // No user data, no power control, no console: the hosts are already running.
        let capabilities = Capabilities::default()
            .with_host_key_discovery(config.hosts.iter().all(|h| !h.host_keys.is_empty()));
        Ok(StaticHostsProvider {
            config,
            connector,
            capabilities,
        })
    }

    /// The inventory.
    pub fn config(&self) -> &StaticHostsConfig {
        &self.config
    }

    /// The provider ID of the host named `host`.
    pub fn provider_id(host: &str) -> Result<ProviderId> {
        ProviderId::new(format!("{SCHEME}:///{host}"))
    }

    fn endpoint(entry: &HostEntry) -> Access {
        let mut access = Access::ssh(SshEndpoint::new(
            entry.address.clone(),
            entry.port,
            entry.user.clone(),
        ));
        access.host_keys = entry.host_keys.clone();
        access
    }

    /// The machine a claimed host is.
    fn machine(entry: &HostEntry, claim: Claim) -> Result<Machine> {
        let mut m = Machine::new(
            claim.name,
            Self::provider_id(&entry.name)?,
            Phase::Provisioned,
        );
        let kind = if entry.address.parse::<IpAddr>().is_ok() {
            AddressKind::InternalIP
        } else {
            AddressKind::InternalDNS
        };
        m.addresses.push(Address::new(kind, entry.address.clone()));
        m.access = Self::endpoint(entry);
        m.labels = claim.labels;
        Ok(m)
    }

    fn claim_file<'a>(&'a self, entry: &HostEntry, path: &'a str) -> ClaimFile<'a> {
        ClaimFile {
            dir: &self.config.claim_dir,
            path,
            sudo: entry.sudo,
        }
    }

    /// Runs `op` against `entry` within the probe timeout; errors name the host.
    async fn probe<T>(&self, entry: &HostEntry, op: impl Future<Output = Result<T>>) -> Result<T> {
        let answer = tokio::time::timeout(self.config.probe_timeout, op)
            .await
            .unwrap_or_else(|_| {
                Err(Error::transient(format!(
                    "did not answer within {:?}",
                    self.config.probe_timeout
                )))
            });
        answer.map_err(|e| {
            e.context(format!(
                "host {} ({}:{})",
                entry.name, entry.address, entry.port
            ))
        })
    }

    async fn connect(&self, entry: &HostEntry) -> Result<Arc<dyn Transport>> {
        let mut target = Machine::new(
            MachineName::new(entry.name.clone())?,
            Self::provider_id(&entry.name)?,
            Phase::Provisioned,
        );
        target.access = Self::endpoint(entry);
        self.connector.connect(&target).await
    }

    async fn read_claim(&self, entry: &HostEntry) -> Result<Option<Claim>> {
        let path = self.config.claim_path();
        self.probe(entry, async {
            let t = self.connect(entry).await?;
            self.claim_file(entry, &path)
                .read(t.as_ref(), &entry.name)
                .await
        })
        .await
    }

    /// Claims `entry` unless it is claimed already; `true` when this call claimed it.
    async fn try_claim(&self, entry: &HostEntry, claim: &Claim) -> Result<bool> {
        let path = self.config.claim_path();
        self.probe(entry, async {
            let t = self.connect(entry).await?;
            let file = self.claim_file(entry, &path);
            if file.read(t.as_ref(), &entry.name).await?.is_some() {
                return Ok(false);
            }
            file.write(t.as_ref(), claim).await
        })
        .await
    }

    async fn release(
        &self,
        entry: &HostEntry,
        owner: &str,
        name: Option<&MachineName>,
    ) -> Result<()> {
        let path = self.config.claim_path();
        self.probe(entry, async {
            let t = self.connect(entry).await?;
            let file = self.claim_file(entry, &path);
            match file.read(t.as_ref(), &entry.name).await? {
                Some(c) if c.owner == owner && name.is_none_or(|n| &c.name == n) => {
                    file.remove(t.as_ref()).await?;
                    tracing::info!(host = %entry.name, machine = %c.name, "released host");
                    Ok(())
                }
                _ => Ok(()),
            }
        })
        .await
    }

    /// Every host's claim, in inventory order. Hosts that did not answer are listed
    /// apart; any other failure (a refused host key, a refused login) is returned.
    async fn scan(&self) -> Result<(Vec<(&HostEntry, Claim)>, Vec<&str>)> {
        let answers = join_all(self.config.hosts.iter().map(|h| self.read_claim(h))).await;
        let mut claimed = Vec::new();
        let mut silent = Vec::new();
        for (entry, answer) in self.config.hosts.iter().zip(answers) {
            match answer {
                Ok(Some(c)) => claimed.push((entry, c)),
                Ok(None) => {}
                Err(e) if e.is_retryable() => {
                    tracing::warn!(host = %entry.name, error = %e, "host did not answer");
                    silent.push(entry.name.as_str());
                }
                Err(e) => return Err(e),
            }
        }
        Ok((claimed, silent))
    }

    /// The hosts holding this owner's machine `name`, in inventory order.
    async fn holders(&self, name: &MachineName) -> Result<Vec<(&HostEntry, Claim)>> {
        let (claimed, silent) = self.scan().await?;
        let holders: Vec<_> = claimed
            .into_iter()
            .filter(|(_, c)| c.is(&self.config.owner, name))
            .collect();
        if holders.is_empty() && !silent.is_empty() {
            return Err(Error::transient(format!(
                "cannot tell whether machine {name} exists: hosts {} did not answer",
                silent.join(", ")
            )));
        }
        Ok(holders)
    }

    /// Resolves a race after claiming: keeps the first holder of `name` in inventory
    /// order and releases the others.
    async fn settle(&self, name: &MachineName) -> Result<Machine> {
        let mut holders = self.holders(name).await?.into_iter();
        let (entry, claim) = holders.next().ok_or_else(|| {
            Error::transient(format!(
                "the claim for machine {name} vanished right after it was made"
            ))
        })?;
        for (extra, _) in holders {
            tracing::warn!(host = %extra.name, machine = %name, "releasing a duplicate claim");
            self.release(extra, &self.config.owner, Some(name)).await?;
        }
        Self::machine(entry, claim)
    }

    fn candidates(&self, settings: &StaticHostSettings) -> Result<Vec<&HostEntry>> {
        if let Some(host) = &settings.host {
            let entry = self.config.host(host).ok_or_else(|| {
                Error::invalid_spec(
                    "provider.host",
                    format!("{host:?} is not a host of the inventory"),
                )
            })?;
            return Ok(vec![entry]);
        }
        let matching: Vec<_> = self
            .config
            .hosts
            .iter()
            .filter(|h| {
                settings
                    .selector
                    .iter()
                    .all(|(k, v)| h.labels.get(k) == Some(v))
            })
            .collect();
        if matching.is_empty() {
            return Err(Error::invalid_spec(
                "provider.selector",
                format!(
                    "no host of the inventory has the labels {:?}",
                    settings.selector
                ),
            ));
        }
        Ok(matching)
    }

    fn entry_of(&self, id: &ProviderId) -> Option<&HostEntry> {
        (id.scheme() == SCHEME)
            .then(|| self.config.host(id.resource_id()))
            .flatten()
    }
}

#[async_trait]
impl MachineProvisioner for StaticHostsProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        // Static hosts run already: their capabilities declare no user-data delivery.
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        let settings: StaticHostSettings = spec.provider_settings()?;
        let candidates = self.candidates(&settings)?;
        if let Some(existing) = self.find(&spec.name).await? {
            return Ok(existing);
        }
        let claim = Claim::new(&self.config.owner, &spec.name, &spec.labels);
        let (mut taken, mut silent) = (Vec::new(), Vec::new());
        for entry in candidates {
            match self.try_claim(entry, &claim).await {
                Ok(true) => {
                    tracing::info!(host = %entry.name, machine = %spec.name, "claimed host");
                    return self.settle(&spec.name).await;
                }
                Ok(false) => taken.push(entry.name.as_str()),
                Err(e) if e.is_retryable() => silent.push(entry.name.as_str()),
                Err(e) => return Err(e),
            }
        }
        if !silent.is_empty() {
            return Err(Error::transient(format!(
                "no free host for machine {}: hosts {} did not answer",
                spec.name,
                silent.join(", ")
            )));
        }
        Err(Error::new(
            machine_core::ErrorKind::QuotaExceeded,
            format!(
                "no free host for machine {}: every host it may have is claimed ({})",
                spec.name,
                taken.join(", ")
            ),
        ))
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        let not_found = || Error::not_found(format!("{self}: no machine {id}"));
        let entry = self.entry_of(id).ok_or_else(not_found)?;
        match self.read_claim(entry).await? {
            Some(c) if c.owner == self.config.owner => Self::machine(entry, c),
            _ => Err(not_found()),
        }
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        match self.holders(name).await?.into_iter().next() {
            Some((entry, claim)) => Self::machine(entry, claim).map(Some),
            None => Ok(None),
        }
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        let (claimed, silent) = self.scan().await?;
        if !silent.is_empty() {
            return Err(Error::transient(format!(
                "cannot list machines: hosts {} did not answer",
                silent.join(", ")
            )));
        }
        let mut machines = claimed
            .into_iter()
            .filter(|(_, c)| {
                c.owner == self.config.owner
                    && selector.iter().all(|(k, v)| c.labels.get(k) == Some(v))
            })
            .map(|(entry, claim)| Self::machine(entry, claim))
            .collect::<Result<Vec<_>>>()?;
        machines.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(machines)
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        match self.entry_of(id) {
            Some(entry) => self.release(entry, &self.config.owner, None).await,
            None => Ok(()),
        }
    }

    async fn user_data(&self, _id: &ProviderId) -> Result<Option<UserData>> {
        Ok(None)
    }

    async fn power(&self, _id: &ProviderId, op: PowerOp) -> Result<()> {
        Err(unsupported_power_op(self, op))
    }

    async fn console_output(&self, _id: &ProviderId) -> Result<Option<String>> {
        Ok(None)
    }
}
