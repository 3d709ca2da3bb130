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
    UserData, shown, unsupported_power_op, user_data,
};
use serde::{Deserialize, Serialize};

use super::claim::{Claim, ClaimFile};
use super::config::{HostEntry, StaticHostsConfig};

/// The provider ID scheme: `static:///<host name>/<claim id>`.
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
///   free host the spec allows (`provider.host` or `provider.selector`, and `size`: the
///   hosts of that size class, in inventory order). A host is claimed by writing a claim
///   file on it atomically, so two controllers never claim one host. When all allowed
///   hosts are claimed the error is [`machine_core::ErrorKind::InsufficientCapacity`]
///   (the pool has no room; another size or a released host may); when some did not
///   answer it is transient. A size no allowed host has is an invalid spec on `size`.
/// - A machine's ID is `static:///<host>/<claim id>`: the claim ID is new for every
///   claim, so the ID of a released machine never names a later one on its host.
/// - `find`, `list` and `get` read the claims from the hosts. A host that does not
///   answer within the probe timeout makes `find` and `list` fail with a transient
///   error rather than answer "no such machine" and risk a second claim.
/// - `delete` removes the claim: the host is free again, with whatever software it got
///   (wiping a host is not this provider's business).
/// - There is no user data (the hosts are running already; use decoupled layers) and no
///   power control.
///
/// Controllers creating the same name at the same instant try the same hosts in the
/// same order, and one that finds the name already claimed on a host adopts that claim,
/// so they meet on one host. Should two claims of one name still stand (a host released
/// mid-race), whichever creator looks next keeps the first in inventory order and
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

    /// The provider ID of the host named `host` while it carries the claim `claim_id`:
    /// `static:///<host>/<claim id>`, so that the ID of a released claim never names a
    /// later machine on the same host. A claim written before claims had IDs is
    /// `static:///<host>`.
    pub fn provider_id(host: &str, claim_id: &str) -> Result<ProviderId> {
        if claim_id.is_empty() {
            ProviderId::new(format!("{SCHEME}:///{host}"))
        } else {
            ProviderId::new(format!("{SCHEME}:///{host}/{claim_id}"))
        }
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
            Self::provider_id(&entry.name, &claim.id)?,
            Phase::Provisioned,
        );
        m.size = entry.size.clone();
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
            Self::provider_id(&entry.name, "")?,
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

    /// Claims `entry` for `claim` unless it is claimed already. A claim of the same
    /// owner and name there is adopted: every creator of a name tries the hosts in the
    /// same order, so replicas racing for one name meet on one host instead of each
    /// claiming another.
    async fn try_claim(&self, entry: &HostEntry, claim: &Claim) -> Result<Claimed> {
        let path = self.config.claim_path();
        self.probe(entry, async {
            let t = self.connect(entry).await?;
            let file = self.claim_file(entry, &path);
            if let Some(held) = file.read(t.as_ref(), &entry.name).await? {
                return Ok(Claimed::by(held, claim));
            }
            if file.write(t.as_ref(), claim).await? {
                return Ok(Claimed::Now);
            }
            // Another claim got there between the read and the write: whose is it?
            match file.read(t.as_ref(), &entry.name).await? {
                Some(held) => Ok(Claimed::by(held, claim)),
                None => Err(Error::transient(format!(
                    "the claim of host {} vanished while it was being made",
                    entry.name
                ))),
            }
        })
        .await
    }

    /// Releases `entry`'s claim if it is this owner's and matches `which`.
    async fn release(&self, entry: &HostEntry, which: Which<'_>) -> Result<()> {
        let path = self.config.claim_path();
        let owner = &self.config.owner;
        self.probe(entry, async {
            let t = self.connect(entry).await?;
            let file = self.claim_file(entry, &path);
            match file.read(t.as_ref(), &entry.name).await? {
                Some(c) if &c.owner == owner && which.matches(&c) => {
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
            self.release(extra, Which::Name(name)).await?;
        }
        Self::machine(entry, claim)
    }

    fn candidates(
        &self,
        settings: &StaticHostSettings,
        size: Option<&str>,
    ) -> Result<Vec<&HostEntry>> {
        let candidates = self.allowed(settings)?;
        let Some(size) = size else {
            return Ok(candidates);
        };
        let sized: Vec<_> = candidates
            .into_iter()
            .filter(|h| h.size.as_deref() == Some(size))
            .collect();
        if sized.is_empty() {
            return Err(Error::invalid_spec(
                "size",
                format!(
                    "no host the spec allows is of size {}; sizes are the inventory's size classes",
                    shown(size)
                ),
            ));
        }
        Ok(sized)
    }

    /// The hosts `settings` allow, whatever their size.
    fn allowed(&self, settings: &StaticHostSettings) -> Result<Vec<&HostEntry>> {
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

    /// The host `id` names and the claim ID it carries (empty for the IDs of claims
    /// written before claims had IDs).
    fn entry_of<'a>(&self, id: &'a ProviderId) -> Option<(&HostEntry, &'a str)> {
        if id.scheme() != SCHEME {
            return None;
        }
        let rest = id.as_str().strip_prefix("static:///")?;
        let (host, claim_id) = rest.split_once('/').unwrap_or((rest, ""));
        if claim_id.contains('/') {
            return None;
        }
        Some((self.config.host(host)?, claim_id))
    }
}

/// What a host said to a claim.
enum Claimed {
    /// This call claimed it.
    Now,
    /// It holds a claim of the same owner and name already: that machine.
    Ours(Claim),
    /// It holds another machine's claim.
    Taken,
}

impl Claimed {
    fn by(held: Claim, wanted: &Claim) -> Claimed {
        if held.is(&wanted.owner, &wanted.name) {
            Claimed::Ours(held)
        } else {
            Claimed::Taken
        }
    }
}

/// Which of an owner's claims a release removes.
#[derive(Clone, Copy)]
enum Which<'a> {
    /// The claim of this machine name.
    Name(&'a MachineName),
    /// The claim with this ID (empty: a claim written before claims had IDs).
    Id(&'a str),
}

impl Which<'_> {
    fn matches(self, claim: &Claim) -> bool {
        match self {
            Which::Name(name) => &claim.name == name,
            Which::Id(id) => claim.id == id,
        }
    }
}

#[async_trait]
impl MachineProvisioner for StaticHostsProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        spec.validate()?;
        // Static hosts run already: their capabilities declare no user-data delivery.
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        let settings: StaticHostSettings = spec.provider_settings()?;
        let candidates = self.candidates(&settings, spec.size.as_deref())?;
        if let Some(existing) = self.find(&spec.name).await? {
            return Ok(existing);
        }
        let claim = Claim::new(&self.config.owner, &spec.name, &spec.labels);
        let (mut taken, mut silent) = (Vec::new(), Vec::new());
        for entry in candidates {
            match self.try_claim(entry, &claim).await {
                Ok(Claimed::Now) => {
                    tracing::info!(host = %entry.name, machine = %spec.name, "claimed host");
                    return self.settle(&spec.name).await;
                }
                Ok(Claimed::Ours(held)) => return Self::machine(entry, held),
                Ok(Claimed::Taken) => taken.push(entry.name.as_str()),
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
        Err(Error::insufficient_capacity(format!(
            "no free host for machine {}: every host it may have is claimed ({})",
            spec.name,
            taken.join(", ")
        )))
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        let not_found = || Error::not_found(format!("{self}: no machine {id}"));
        let (entry, claim_id) = self.entry_of(id).ok_or_else(not_found)?;
        match self.read_claim(entry).await? {
            Some(c) if c.owner == self.config.owner && c.id == claim_id => Self::machine(entry, c),
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
            Some((entry, claim_id)) => self.release(entry, Which::Id(claim_id)).await,
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
