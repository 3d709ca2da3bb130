//! [`RedfishProvider`]: "creating" a machine claims a free server of the pool, gives it
//! a NoCloud seed by virtual media and powers it on; "deleting" it powers it off, ejects
//! the seed and releases the claim.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use machine_core::{
    Access, Address, AddressKind, Capabilities, Error, ErrorKind, Failure, Labels, Machine,
    MachineName, MachineProvisioner, MachineSpec, Phase, PowerOp, PowerOperations, ProviderId,
    Result, SizeBasis, SshEndpoint, UserData, UserDataDelivery, UserDataFormat,
    unsupported_power_op, user_data,
};
use provider_http::{HttpClient, HttpSettings, TlsConfig};
use serde::Deserialize;
use tokio::time::Instant;

use super::client::{PowerState, RedfishClient, System, VirtualMedia};
use super::config::{RedfishPoolConfig, ServerEntry};
use super::media_server::MediaServer;
use super::pool::{Claim, Claims, LEASE_TTL, Lease, unix_now};
use super::seed_iso::{MAX_FILE_BYTES, Seed};

/// The provider ID scheme: `redfish://<bmc-host>/<system-id>/<claim id>`, the claim id
/// drawn anew for every claim of the server (see [`RedfishProvider::provider_id`]).
pub const SCHEME: &str = "redfish";

/// How long a power operation may take to show before stop, start or reboot give up
/// waiting.
const POWER_SETTLE: Duration = Duration::from_secs(30);

/// How often power-on is asked before a server that stays off is `Failed`.
const POWER_ON_ASKS: u32 = 2;

/// How long a create waits for another controller's create of the same name (its lease
/// holder) before it returns what stands: long enough to see a killed holder's lease go
/// stale and take it over.
const CREATE_WAIT: Duration = Duration::from_secs(LEASE_TTL.as_secs() * 2 + 5);

/// How often a waiting create looks again.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// How long the check that a BMC's seed URL is still served may take.
const SEED_PROBE: Duration = Duration::from_secs(5);

/// What a spec's `provider` field may say to this provider.
///
/// ```yaml
/// provider: {server: rack1-a}                 # exactly this server
/// provider: {selector: {rack: r1}, boot: Pxe}  # any free server with these labels
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedfishSettings {
    /// The pool name of the one server to claim.
    #[serde(default)]
    pub server: Option<String>,
    /// Labels a server must have to be claimed; empty means any.
    #[serde(default)]
    pub selector: Labels,
    /// The one-time boot target: `Cd` (the seed, default), `Pxe` or `UefiHttp`.
    #[serde(default)]
    pub boot: Option<String>,
}

/// The seed this process serves for a server's claim, and the user data in it.
struct Served {
    claim: String,
    /// What the media server knows the seed by: the machine's provider ID.
    key: String,
    user_data: Option<UserData>,
}

/// How far a create's provisioning got, for undoing it when it fails.
#[derive(Default)]
struct Progress {
    /// The CD the seed went (or was going) into.
    cd: Option<VirtualMedia>,
    /// The power-on was recorded in the claim, and maybe sent.
    asked: bool,
}

/// What the claim and the BMC's power state say of a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The machine is in this phase.
    Phase(Phase),
    /// On for the first time since power-on was asked: running, and worth recording.
    FirstSeenOn,
    /// Still off well after the BMC accepted a power-on: ask again.
    AskAgain,
    /// Still off after every power-on asked: the BMC does not apply them.
    Ignored,
}

/// Refuses a claim id that cannot be one segment of a provider ID: claims are files
/// anyone with access to the directory can edit.
fn check_claim_id(server: &str, id: &str) -> Result<()> {
    if id.is_empty()
        || id.len() > 64
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(Error::permanent(format!(
            "the claim on server {server} has a malformed id {}: it was not written by this crate",
            machine_core::shown(id)
        )));
    }
    Ok(())
}

/// The cloud-init instance-id of the machine of `claim`: new for every claim, so that a
/// server whose disk holds an earlier machine's cloud-init state runs the new machine's
/// per-instance modules (its user data). Machines of claims written before keep their
/// name, the instance-id they booted with.
fn instance_id(claim: &Claim) -> String {
    if claim.is_legacy() {
        claim.name.to_string()
    } else {
        format!("{}-{}", claim.name, claim.id)
    }
}

/// The phase of a machine from its claim and its system's power state, `now` (Unix
/// seconds) and the pool's power-on grace.
fn judge(claim: &Claim, state: Option<PowerState>, now: u64, grace: Duration) -> Verdict {
    if claim.deleting {
        return Verdict::Phase(Phase::Deleting);
    }
    if claim.creating {
        return Verdict::Phase(Phase::Pending);
    }
    if !claim.powered {
        return Verdict::Phase(Phase::Stopped);
    }
    match state {
        Some(PowerState::On) if claim.power_on_seen => Verdict::Phase(Phase::Provisioned),
        Some(PowerState::On) => Verdict::FirstSeenOn,
        // On since it was asked, off now: powered off from elsewhere (its OS shut down).
        Some(PowerState::Off) if claim.power_on_seen => Verdict::Phase(Phase::Stopped),
        Some(PowerState::Off) => match claim.power_on_asked {
            Some(asked) if now >= asked.saturating_add(grace.as_secs()) => {
                if claim.power_on_asks < POWER_ON_ASKS {
                    Verdict::AskAgain
                } else {
                    Verdict::Ignored
                }
            }
            _ => Verdict::Phase(Phase::Provisioning),
        },
        _ => Verdict::Phase(Phase::Provisioning),
    }
}

/// Servers behind Redfish BMCs as machines.
///
/// - A machine's ID is `redfish://<bmc host[:port]>/<system id>/<claim id>`: the claim id
///   is drawn anew for every claim, so the ID of a deleted machine never names a later
///   machine on the same server (a late, retried delete of it does nothing). Machines of
///   claims written before IDs named claims keep their `redfish://<bmc>/<system id>`.
///   Its cloud-init instance-id is `<name>-<claim id>`, new for every claim, so a server
///   whose disk holds an earlier machine's cloud-init state runs the new user data.
/// - `create` claims the name first (a create lease in the claim directory, one holder
///   at a time), then the least recently released free server the spec allows (by
///   `provider.server`, `provider.selector` and the spec's size class), publishes a
///   NoCloud seed with the user data on its media server, inserts it as the system's
///   virtual CD, sets a one-time boot override, records the power-on in the claim and
///   powers the system on (or restarts it when it was on). Replicas creating one name
///   at once wait for the lease holder and are all told its server.
/// - A create that finds its name's claim adopts it. A claim whose create stopped before
///   the power-on (a crash) is finished: seed, boot override, power-on. A running
///   machine whose bootstrap has not finished gets its seed published again when the
///   URL its BMC holds is no longer served (the media server lives in the process that
///   published it) and the CD is given the new URL.
/// - Phases come from the claim and the system's PowerState: on → `Provisioned`;
///   off while meant to run → `Provisioning`; off after having been on, or meant to be
///   off → `Stopped`; a create still before its power-on → `Pending`. A server the BMC
///   still shows off [`RedfishPoolConfig::power_on_grace`] after a power-on is asked
///   again (by whichever call observes it: `get`, `find`, `list`, `create`), and once
///   more after that it is `Failed` (reason `PowerOnIgnored`).
/// - A claim whose create stopped before its power-on and that nobody holds the lease
///   of is no machine: `get`, `find` and `list` do not show it (so a composer creates
///   the machine again, which finishes it), and when the pool is otherwise full, a
///   create takes its server.
/// - `delete` marks the claim, lets a pending power-on land (a BMC applies resets later:
///   sushy keeps one pending reset and drops a ForceOff that matches the current state,
///   so a pending On would power the released server on later), forces the system off
///   and waits until the BMC shows it, ejects the seed (from the CD the claim names: no
///   read of the virtual media), stops serving it and releases the claim.
/// - Power operations return once the BMC shows the new power state. They map to reset
///   types (start `On`, stop `ForceOff`, reboot `ForceRestart`); a type the system's
///   `ResetType@Redfish.AllowableValues` lacks is refused before any reset is sent.
/// - `bootstrap_finished` stops serving the seed and records it, so that no later
///   create publishes it again; `user_data` reads the user data while this process
///   serves its seed, `None` otherwise (and always after `bootstrap_finished`).
///
/// A pool with no free server of what the spec asks is
/// [`ErrorKind::InsufficientCapacity`]: the place has no room, which is no account limit
/// (a BMC has none) and may change as machines are deleted.
///
/// Claims are files in the pool's claim directory, which every controller of the pool
/// must share: sushy-tools (the BMC the tests run against) refuses a PATCH of
/// `AssetTag` and has no other writable field that can hold a name, so the claim cannot
/// live on the BMC there. See `pool.rs` for what the directory holds.
pub struct RedfishProvider {
    config: RedfishPoolConfig,
    clients: Vec<RedfishClient>,
    /// Each server's ID prefix, `redfish://<bmc host[:port]>/<system id>`: the whole ID
    /// of a machine whose claim was written before IDs named claims.
    servers: Vec<String>,
    names: Vec<String>,
    claims: Claims,
    media: MediaServer,
    served: Mutex<HashMap<usize, Served>>,
    probe: HttpClient,
    capabilities: Capabilities,
}

impl fmt::Display for RedfishProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "redfish(owner={}, {} servers)",
            self.config.owner,
            self.config.servers.len()
        )
    }
}

impl fmt::Debug for RedfishProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedfishProvider")
            .field("config", &self.config)
            .field("media", &self.media)
            .finish_non_exhaustive()
    }
}

impl RedfishProvider {
    /// A provider over `config`'s pool, its BMC clients built with `http`'s timeouts and
    /// each server's TLS trust (a pinned fingerprint, a CA file, verification off when
    /// `insecure`, warned on every handshake; else `http`'s). Servers with the same trust
    /// share one client and its connection pool. Starts the media server, so it needs a
    /// tokio runtime.
    pub async fn new(config: RedfishPoolConfig, http: &HttpSettings) -> Result<Self> {
        config.validate()?;
        let mut built: Vec<(Option<TlsConfig>, HttpClient)> = Vec::new();
        let mut clients = Vec::with_capacity(config.servers.len());
        let mut servers = Vec::with_capacity(config.servers.len());
        for (i, s) in config.servers.iter().enumerate() {
            let url = s.bmc_url()?;
            let own = (s.fingerprint.is_some() || s.ca_file.is_some() || s.insecure)
                .then(|| s.tls())
                .transpose()?;
            let client = match built.iter().find(|(t, _)| *t == own) {
                Some((_, c)) => c.clone(),
                None => {
                    let settings = match &own {
                        Some(tls) => http.clone().with_tls(tls.clone()),
                        None => http.clone(),
                    };
                    let c = HttpClient::new(&settings)
                        .map_err(|e| e.within(&format!("servers[{i}]")))?;
                    built.push((own, c.clone()));
                    c
                }
            };
            clients.push(RedfishClient::new(client, url, s.credentials.clone()));
            servers.push(Self::provider_id(s, "")?.as_str().to_owned());
        }
        let media = MediaServer::start(
            config.media_server.listen,
            config
                .media_server
                .url
                .as_ref()
                .map(machine_core::UrlSetting::as_str),
        )
        .await?;
        let capabilities = Capabilities::default()
            .with_user_data(UserDataDelivery::new(
                MAX_FILE_BYTES,
                SizeBasis::Raw,
                UserDataFormat::CLOUD_INIT.to_vec(),
            ))
            .with_power(PowerOperations::all())
            .with_withdrawn_user_data(true);
        Ok(RedfishProvider {
            claims: Claims::new(config.claim_dir.clone()),
            names: config.servers.iter().map(|s| s.name.clone()).collect(),
            probe: HttpClient::new(http)?,
            config,
            clients,
            servers,
            media,
            served: Mutex::default(),
            capabilities,
        })
    }

    /// The pool.
    pub fn config(&self) -> &RedfishPoolConfig {
        &self.config
    }

    /// The server that serves the seeds.
    pub fn media_server(&self) -> &MediaServer {
        &self.media
    }

    /// The provider ID of the machine `server` is while it carries the claim `claim_id`:
    /// `redfish://<bmc host[:port]>/<system id>/<claim id>`, so that the ID of a released
    /// claim never names a later machine on the same server. An empty `claim_id` gives
    /// `redfish://<bmc host[:port]>/<system id>`, the ID of a machine whose claim was
    /// written before IDs named claims.
    pub fn provider_id(server: &ServerEntry, claim_id: &str) -> Result<ProviderId> {
        let prefix = format!("{SCHEME}://{}/{}", server.bmc_host()?, server.system_id);
        if claim_id.is_empty() {
            ProviderId::new(prefix)
        } else {
            check_claim_id(&server.name, claim_id)?;
            ProviderId::new(format!("{prefix}/{claim_id}"))
        }
    }

    /// The ID of server `i`'s machine of `claim`.
    fn id_of(&self, i: usize, claim: &Claim) -> Result<ProviderId> {
        if claim.is_legacy() {
            return ProviderId::new(self.servers[i].clone());
        }
        check_claim_id(&self.names[i], &claim.id)?;
        ProviderId::new(format!("{}/{}", self.servers[i], claim.id))
    }

    /// The server `id` names and the claim id it carries (`None`: an ID of a claim
    /// written before IDs named claims).
    fn locate<'a>(&self, id: &'a ProviderId) -> Option<(usize, Option<&'a str>)> {
        self.servers.iter().enumerate().find_map(|(i, prefix)| {
            match id.as_str().strip_prefix(prefix.as_str())? {
                "" => Some((i, None)),
                rest => {
                    let claim = rest.strip_prefix('/')?;
                    (!claim.is_empty() && !claim.contains('/')).then_some((i, Some(claim)))
                }
            }
        })
    }

    fn not_found(&self, id: &ProviderId) -> Error {
        Error::not_found(format!("{self}: no machine {id}"))
    }

    /// The machine of server `i`'s `claim`, in `phase`.
    fn machine(&self, i: usize, claim: &Claim, phase: Phase) -> Result<Machine> {
        let s = &self.config.servers[i];
        let mut m = Machine::new(claim.name.clone(), self.id_of(i, claim)?, phase);
        m.labels = claim.labels.clone();
        m.size = s.size.clone();
        if let Some(address) = &s.address {
            let kind = if address.parse::<IpAddr>().is_ok() {
                AddressKind::InternalIP
            } else {
                AddressKind::InternalDNS
            };
            m.addresses.push(Address::new(kind, address.clone()));
            let user = claim.ssh_user.clone().unwrap_or_else(|| s.ssh_user.clone());
            m.access = Access::ssh(SshEndpoint::new(address.clone(), s.ssh_port, user));
        }
        Ok(m)
    }

    /// The machine of server `i`'s `claim` as `system` shows it. Observing is also when
    /// an ignored power-on is noticed: it is asked again, once, then reported `Failed`.
    async fn observe(&self, i: usize, mut claim: Claim, system: &System) -> Result<Machine> {
        let server = &self.names[i];
        let grace = self.config.power_on_grace;
        match judge(&claim, system.power_state, unix_now(), grace) {
            Verdict::Phase(phase) => self.machine(i, &claim, phase),
            Verdict::FirstSeenOn => {
                claim.power_on_seen = true;
                claim.power_on_asks = 0;
                if let Err(e) = self.claims.update(server, &claim) {
                    tracing::warn!(server = %server, error = %e, "could not record the server on");
                }
                self.machine(i, &claim, Phase::Provisioned)
            }
            Verdict::AskAgain => {
                tracing::warn!(server = %server, machine = %claim.name, "the BMC accepted a power-on but still shows the server off: asking again");
                // Sent, then recorded: a request that fails is asked again at the next
                // look, and one sent by a process that dies before recording it is
                // merely sent twice (a BMC takes On for a server coming on).
                self.reset(i, system, "On").await?;
                claim.power_on_asked = Some(unix_now());
                claim.power_on_asks += 1;
                if let Err(e) = self.claims.update(server, &claim) {
                    tracing::warn!(server = %server, error = %e, "could not record the power-on asked again");
                }
                self.machine(i, &claim, Phase::Provisioning)
            }
            Verdict::Ignored => {
                let mut m = self.machine(i, &claim, Phase::Failed)?;
                m.failure = Some(Failure::new(
                    "PowerOnIgnored",
                    format!(
                        "the BMC accepted {} power-on requests for server {server} but still shows it off {}s after the last",
                        claim.power_on_asks,
                        unix_now().saturating_sub(claim.power_on_asked.unwrap_or_default())
                    ),
                ));
                Ok(m)
            }
        }
    }

    async fn machine_of(&self, i: usize, claim: Claim) -> Result<Machine> {
        let system = self.system(i).await?;
        self.observe(i, claim, &system).await
    }

    async fn system(&self, i: usize) -> Result<System> {
        let s = &self.config.servers[i];
        self.clients[i]
            .system(&s.system_id)
            .await
            .map_err(|e| e.context(format!("server {}", s.name)))
    }

    /// Whether `claim` is a machine: a claim whose create stopped before the power-on is
    /// one only while a live controller holds its lease (it is still being created).
    fn visible(&self, claim: &Claim) -> bool {
        !claim.creating || self.claims.lease_live(&claim.name, &claim.owner)
    }

    /// This owner's claims, in pool order.
    fn owned(&self) -> Result<Vec<(usize, Claim)>> {
        Ok(self
            .claims
            .scan(&self.names)?
            .into_iter()
            .enumerate()
            .filter_map(|(i, c)| c.filter(|c| c.owner == self.config.owner).map(|c| (i, c)))
            .collect())
    }

    /// This owner's claims for `name`: the machine's first (not being deleted, past its
    /// power-on, first in pool order), then any left by a crash or a race.
    fn holders(&self, name: &MachineName) -> Result<Vec<(usize, Claim)>> {
        let mut held: Vec<_> = self
            .owned()?
            .into_iter()
            .filter(|(_, c)| &c.name == name)
            .collect();
        held.sort_by_key(|(i, c)| (c.deleting, c.creating, *i));
        Ok(held)
    }

    fn candidates(&self, settings: &RedfishSettings, size: Option<&str>) -> Result<Vec<usize>> {
        let servers = &self.config.servers;
        let sized = |i: &usize| size.is_none_or(|c| servers[*i].size.as_deref() == Some(c));
        let no_size = |among: &str| {
            let mut classes: Vec<&str> = servers.iter().filter_map(|s| s.size.as_deref()).collect();
            classes.sort_unstable();
            classes.dedup();
            Error::invalid_spec(
                "size",
                format!(
                    "no server {among} is of size {:?} (the pool's sizes: {})",
                    size.unwrap_or_default(),
                    if classes.is_empty() {
                        "none".to_owned()
                    } else {
                        classes.join(", ")
                    }
                ),
            )
        };
        if let Some(name) = &settings.server {
            let i = servers
                .iter()
                .position(|s| &s.name == name)
                .ok_or_else(|| {
                    Error::invalid_spec(
                        "provider.server",
                        format!("{name:?} is not a server of the pool"),
                    )
                })?;
            if !sized(&i) {
                return Err(no_size(&format!("named {name:?}")));
            }
            return Ok(vec![i]);
        }
        let matching: Vec<usize> = (0..servers.len())
            .filter(|&i| {
                settings
                    .selector
                    .iter()
                    .all(|(k, v)| servers[i].labels.get(k) == Some(v))
            })
            .collect();
        if matching.is_empty() {
            return Err(Error::invalid_spec(
                "provider.selector",
                format!(
                    "no server of the pool has the labels {:?}",
                    settings.selector
                ),
            ));
        }
        let fitting: Vec<usize> = matching.into_iter().filter(sized).collect();
        if fitting.is_empty() {
            return Err(no_size(if settings.selector.is_empty() {
                "of the pool"
            } else {
                "with the selected labels"
            }));
        }
        Ok(fitting)
    }

    /// Refuses `reset_type` up front when the system does not list it.
    fn allowed(&self, i: usize, system: &System, reset_type: &str) -> Result<()> {
        let allowed = system.reset_types();
        if allowed.is_empty() || allowed.iter().any(|t| t == reset_type) {
            return Ok(());
        }
        Err(Error::permanent(format!(
            "server {} does not allow reset type {reset_type} (it allows {})",
            self.names[i],
            allowed.join(", ")
        )))
    }

    async fn reset(&self, i: usize, system: &System, reset_type: &str) -> Result<()> {
        self.allowed(i, system, reset_type)?;
        self.clients[i].reset(system, reset_type).await
    }

    /// Waits until the system's power state is `want` (a BMC applies resets later),
    /// until `deadline`; returns the system as last read.
    async fn wait_power(&self, i: usize, want: PowerState, deadline: Instant) -> Result<System> {
        loop {
            let system = self.system(i).await?;
            if system.power_state == Some(want) {
                return Ok(system);
            }
            if Instant::now() > deadline {
                return Err(Error::timeout(format!(
                    "server {} did not reach power state {want:?} in time (it shows {:?})",
                    self.names[i], system.power_state
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Free servers among `candidates`, least recently released first.
    fn by_release(&self, candidates: &[usize]) -> Vec<usize> {
        let servers: Vec<_> = candidates
            .iter()
            .map(|&i| (i, self.names[i].as_str()))
            .collect();
        self.claims.by_release(&servers)
    }

    /// Claims a free server of `candidates` for `spec`, under its name's lease. A
    /// server whose create stopped before the power-on and that nobody holds the lease
    /// of is taken when no other is free.
    async fn claim_server(
        &self,
        spec: &MachineSpec,
        candidates: &[usize],
    ) -> Result<(usize, Claim)> {
        let mut claim = Claim::new(&self.config.owner, spec.name.clone(), spec.labels.clone());
        claim.ssh_user = spec.ssh.as_ref().map(|s| s.user.clone());
        let order = self.by_release(candidates);
        for &i in &order {
            if self.claims.try_claim(&self.names[i], &claim)? {
                tracing::info!(server = %self.names[i], machine = %spec.name, "claimed server");
                return Ok((i, claim));
            }
        }
        let held = self.claims.scan(&self.names)?;
        let mut taken = Vec::new();
        for &i in &order {
            let reclaimed = match &held[i] {
                Some(c) if c.creating && !self.claims.lease_live(&c.name, &c.owner) => {
                    self.reclaim(i, c)?
                }
                Some(_) => false,
                // Released since the first pass.
                None => true,
            };
            if reclaimed && self.claims.try_claim(&self.names[i], &claim)? {
                tracing::info!(server = %self.names[i], machine = %spec.name, "claimed server");
                return Ok((i, claim));
            }
            taken.push(self.names[i].as_str());
        }
        Err(Error::insufficient_capacity(format!(
            "no free server for machine {}: every server it may have is claimed ({})",
            spec.name,
            taken.join(", ")
        )))
    }

    /// Releases server `i`'s claim `c`, whose create stopped before the power-on, under
    /// its name's lease; `true` when released. No BMC call: it never powered the server
    /// on, and the next create ejects what it may have inserted.
    fn reclaim(&self, i: usize, c: &Claim) -> Result<bool> {
        let Some(_lease) = self.claims.try_lease(&c.name, &c.owner)? else {
            return Ok(false);
        };
        match self.claims.read(&self.names[i])? {
            Some(now) if now.id == c.id && now.creating => {}
            _ => return Ok(false),
        }
        tracing::warn!(server = %self.names[i], machine = %c.name, owner = %c.owner, "releasing a server whose create stopped before its power-on");
        self.unpublish(i);
        self.claims.release(&self.names[i], &c.id)?;
        Ok(true)
    }

    /// The seed of `spec`'s machine of `claim`, with `user_data`.
    fn seed(spec: &MachineSpec, claim: &Claim, user_data: Option<&UserData>) -> Result<Vec<u8>> {
        let meta = format!(
            "instance-id: {}\nlocal-hostname: {}\n",
            instance_id(claim),
            spec.name
        );
        Seed {
            user_data: user_data.map(|u| u.bytes.as_slice()).unwrap_or_default(),
            meta_data: meta.as_bytes(),
            network_config: None,
        }
        .to_iso()
    }

    /// Serves `iso` for server `i`'s `claim` (instead of any earlier seed of the
    /// server); returns its URL.
    fn publish(
        &self,
        i: usize,
        claim: &Claim,
        iso: Vec<u8>,
        user_data: Option<&UserData>,
    ) -> Result<String> {
        let key = self.id_of(i, claim)?.as_str().to_owned();
        self.unpublish(i);
        // A legacy claim's key is the server's: whatever this process served for it.
        self.media.remove(&key);
        let url = self.media.publish(&key, iso)?;
        self.served_map().insert(
            i,
            Served {
                claim: claim.id.clone(),
                key,
                user_data: user_data.cloned(),
            },
        );
        Ok(url)
    }

    /// Stops serving server `i`'s seed.
    fn unpublish(&self, i: usize) {
        let served = self.served_map().remove(&i);
        if let Some(s) = served {
            self.media.remove(&s.key);
        }
    }

    fn served_map(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Served>> {
        // A panic while holding the lock cannot leave the map half-changed.
        self.served.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this process serves the seed of server `i`'s `claim`.
    fn serving(&self, i: usize, claim: &Claim) -> bool {
        self.served_map()
            .get(&i)
            .is_some_and(|s| s.claim == claim.id && self.media.serves(&s.key))
    }

    /// Whether `url` answers (the seed a BMC holds is still served by someone).
    async fn answers(&self, url: &str) -> bool {
        let head = self.probe.inner().head(url).timeout(SEED_PROBE).send();
        matches!(head.await, Ok(r) if r.status().is_success())
    }

    /// Seeds and boots server `i`, claimed by `claim` for `spec`: its create up to and
    /// including the power-on, which is recorded in the claim before it is sent.
    async fn provision(
        &self,
        i: usize,
        claim: &mut Claim,
        spec: &MachineSpec,
        settings: &RedfishSettings,
        user_data: Option<&UserData>,
        progress: &mut Progress,
    ) -> Result<()> {
        let client = &self.clients[i];
        let system = self.system(i).await?;
        let target = settings.boot.as_deref().unwrap_or("Cd");
        if !system.boot.allowed_targets.is_empty()
            && !system.boot.allowed_targets.iter().any(|t| t == target)
        {
            return Err(Error::invalid_spec(
                "provider.boot",
                format!(
                    "server {} does not boot from {target:?} (it allows {})",
                    self.names[i],
                    system.boot.allowed_targets.join(", ")
                ),
            ));
        }
        let power_op = if system.power_state == Some(PowerState::On) {
            "ForceRestart"
        } else {
            "On"
        };
        self.allowed(i, &system, power_op)?;
        let cd = client.virtual_cd(&system).await?;
        progress.cd = Some(cd.clone());
        if cd.inserted == Some(true) {
            client.eject_media(&cd).await?;
        }
        let url = self.publish(i, claim, Self::seed(spec, claim, user_data)?, user_data)?;
        client.insert_media(&cd, &url).await?;
        client.set_boot_override(&system, target, true).await?;
        claim.creating = false;
        claim.power_on_asked = Some(unix_now());
        claim.power_on_asks = 1;
        claim.power_on_seen = false;
        claim.cd = Some(cd.path().to_owned());
        self.claims.update(&self.names[i], claim)?;
        progress.asked = true;
        client.reset(&system, power_op).await
    }

    /// Provisions server `i` for `spec` under its name's `lease`, the claim made or
    /// found unfinished; undoes what it did when it fails before the power-on is sent,
    /// or when the BMC refuses the power-on.
    async fn finish(
        &self,
        i: usize,
        mut claim: Claim,
        spec: &MachineSpec,
        settings: &RedfishSettings,
        user_data: Option<&UserData>,
        lease: Lease,
    ) -> Result<Machine> {
        let mut progress = Progress::default();
        let done = self
            .provision(i, &mut claim, spec, settings, user_data, &mut progress)
            .await;
        let out = match done {
            Ok(()) => self.machine(i, &claim, Phase::Provisioning),
            // The power-on is recorded, its answer lost (a 5xx, a cut connection): the
            // machine is made, and whether the BMC applied it is what observing it
            // finds out (asked again after the grace if it did not).
            Err(e) if progress.asked && e.is_retryable() => {
                tracing::warn!(server = %self.names[i], machine = %claim.name, error = %e, "the power-on's answer was lost; it is asked again if the server stays off");
                self.machine(i, &claim, Phase::Provisioning)
            }
            Err(e) => {
                self.abandon(i, &claim, progress.cd.as_ref()).await;
                Err(e.context(format!("server {}", self.names[i])))
            }
        };
        drop(lease);
        out
    }

    /// Undoes a claim whose provisioning failed, best effort: the error that made it
    /// fail is what the caller sees.
    async fn abandon(&self, i: usize, claim: &Claim, cd: Option<&VirtualMedia>) {
        self.unpublish(i);
        if let Some(cd) = cd
            && let Err(e) = self.clients[i].eject_media(cd).await
        {
            tracing::debug!(server = %self.names[i], error = %e, "ejecting the seed of a failed create");
        }
        if let Err(e) = self.claims.release(&self.names[i], &claim.id) {
            tracing::warn!(server = %self.names[i], error = %e, "could not release the claim of a failed create");
        }
    }

    /// Makes sure the seed of a machine whose bootstrap has not finished is served at
    /// the URL its CD holds: when this process does not serve it and the URL does not
    /// answer (the process that published it is gone), publishes it again here and
    /// inserts the new URL.
    async fn ensure_seed(
        &self,
        i: usize,
        claim: &mut Claim,
        system: &System,
        spec: &MachineSpec,
        user_data: Option<&UserData>,
    ) -> Result<()> {
        if self.serving(i, claim) {
            return Ok(());
        }
        let client = &self.clients[i];
        let cd = match &claim.cd {
            Some(path) => client.media_at(path).await?,
            None => client.virtual_cd(system).await?,
        };
        let inserted = cd.inserted == Some(true);
        if let Some(url) = cd.image.as_deref().filter(|u| inserted && !u.is_empty())
            && self.answers(url).await
        {
            return Ok(());
        }
        let url = self.publish(i, claim, Self::seed(spec, claim, user_data)?, user_data)?;
        if inserted {
            client.eject_media(&cd).await?;
        }
        client.insert_media(&cd, &url).await?;
        if claim.cd.as_deref() != Some(cd.path()) {
            claim.cd = Some(cd.path().to_owned());
            self.claims.update(&self.names[i], claim)?;
        }
        tracing::info!(server = %self.names[i], machine = %claim.name, "published the seed again: the URL its CD held was no longer served");
        Ok(())
    }

    /// Adopts server `i`'s finished `claim` for a create of `spec`.
    async fn adopt(
        &self,
        i: usize,
        mut claim: Claim,
        spec: &MachineSpec,
        user_data: Option<&UserData>,
    ) -> Result<Machine> {
        let system = self.system(i).await?;
        if claim.powered && !claim.deleting && !claim.bootstrap_finished {
            self.ensure_seed(i, &mut claim, &system, spec, user_data)
                .await?;
        }
        self.observe(i, claim, &system).await
    }

    /// This owner's claim `id` names, with its server's index: the claim on the server
    /// whose id the ID carries (an ID without one names only a claim written before IDs
    /// named claims), so that an old machine's ID never names a newer claim.
    fn owned_claim(&self, id: &ProviderId) -> Result<Option<(usize, Claim)>> {
        let Some((i, claim_id)) = self.locate(id) else {
            return Ok(None);
        };
        Ok(self
            .claims
            .read(&self.names[i])?
            .filter(|c| c.owner == self.config.owner)
            .filter(|c| match claim_id {
                Some(claim_id) => !c.is_legacy() && c.id == claim_id,
                None => c.is_legacy(),
            })
            .map(|c| (i, c)))
    }
}

#[async_trait]
impl MachineProvisioner for RedfishProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        spec.validate()?;
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        let settings: RedfishSettings = spec.provider_settings()?;
        let candidates = self.candidates(&settings, spec.size.as_deref())?;
        let owner = &self.config.owner;
        let waiting_since = Instant::now();
        loop {
            let held = self.holders(&spec.name)?;
            if let Some((i, claim)) = held.iter().find(|(_, c)| !c.creating).cloned() {
                return self.adopt(i, claim, spec, user_data).await;
            }
            // The name is claimed before any server: one controller at a time claims a
            // server for it, and the others are told that server.
            if let Some(lease) = self.claims.try_lease(&spec.name, owner)? {
                // Looked at again under the lease: its last holder may just have finished.
                let held = self.holders(&spec.name)?;
                if held.iter().any(|(_, c)| !c.creating) {
                    drop(lease);
                    continue;
                }
                let (i, claim) = match held.into_iter().next() {
                    Some(unfinished) => {
                        tracing::info!(server = %self.names[unfinished.0], machine = %spec.name, "finishing a create that stopped before its power-on");
                        unfinished
                    }
                    None => self.claim_server(spec, &candidates).await?,
                };
                return self
                    .finish(i, claim, spec, &settings, user_data, lease)
                    .await;
            }
            if waiting_since.elapsed() > CREATE_WAIT {
                // Its holder is alive but slow: what stands is the answer.
                return match held.into_iter().next() {
                    Some((i, claim)) => self.machine(i, &claim, Phase::Pending),
                    None => Err(Error::transient(format!(
                        "another controller has been creating machine {} for {CREATE_WAIT:?} without claiming a server",
                        spec.name
                    ))),
                };
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        match self.owned_claim(id)? {
            Some((i, c)) if self.visible(&c) => self.machine_of(i, c).await,
            _ => Err(self.not_found(id)),
        }
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        let held = self.holders(name)?;
        match held.into_iter().find(|(_, c)| self.visible(c)) {
            Some((i, c)) => self.machine_of(i, c).await.map(Some),
            None => Ok(None),
        }
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        let owned: Vec<_> = self
            .owned()?
            .into_iter()
            .filter(|(_, c)| selector.iter().all(|(k, v)| c.labels.get(k) == Some(v)))
            .filter(|(_, c)| self.visible(c))
            .collect();
        let mut machines = join_all(owned.into_iter().map(|(i, c)| self.machine_of(i, c)))
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        machines.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(machines)
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        let Some((i, mut claim)) = self.owned_claim(id)? else {
            return Ok(());
        };
        let server = &self.names[i];
        // A create still before its power-on is finished or undone under its lease:
        // take it, so that no live create powers the server on after its release.
        let _lease = if claim.creating {
            let Some(lease) = self.claims.try_lease(&claim.name, &claim.owner)? else {
                return Err(Error::transient(format!(
                    "machine {} on server {server} is being created by another controller: delete it once it is",
                    claim.name
                )));
            };
            match self.claims.read(server)? {
                Some(c) if c.id == claim.id => claim = c,
                _ => return Ok(()),
            }
            Some(lease)
        } else {
            None
        };
        // Marked, so that every look sees it going (and no observer asks for power
        // again); a create stopped before its power-on is no machine to mark: a delete
        // that stops half-way leaves it as it was, for a create or the pool to take.
        if !claim.deleting && !claim.creating {
            claim.deleting = true;
            self.claims.update(server, &claim)?;
        }
        // A power-on may still be pending at the BMC: sushy keeps one pending reset and
        // drops a ForceOff that matches the current state, so a pending On would power
        // the released server on later. Let it land first; a server that never comes on
        // within the grace is forced off all the same.
        let mut seen = None;
        if let Some(asked) = claim.power_on_asked
            && claim.powered
            && !claim.power_on_seen
        {
            let until = asked.saturating_add(self.config.power_on_grace.as_secs());
            let left = Duration::from_secs(until.saturating_sub(unix_now()));
            if !left.is_zero() {
                match self
                    .wait_power(i, PowerState::On, Instant::now() + left)
                    .await
                {
                    Ok(system) => seen = Some(system),
                    Err(e) if e.kind() == ErrorKind::Timeout => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let system = match seen {
            Some(system) => system,
            None => self.system(i).await?,
        };
        if system.power_state != Some(PowerState::Off) {
            self.reset(i, &system, "ForceOff").await?;
            // Released only once off: the next claimant's power-on must not be
            // overtaken by this power-off.
            self.wait_power(i, PowerState::Off, Instant::now() + POWER_SETTLE)
                .await?;
        }
        let client = &self.clients[i];
        match &claim.cd {
            // The create recorded where the seed went: eject it there, unread.
            Some(path) => {
                if let Err(e) = client.eject_media_at(path).await {
                    if e.is_retryable() || e.kind() == ErrorKind::Unauthorized {
                        return Err(e);
                    }
                    // Some BMCs refuse to eject an empty drive: fine when it is empty.
                    if client.media_at(path).await?.inserted == Some(true) {
                        return Err(e);
                    }
                }
            }
            None => {
                let cd = client.virtual_cd(&system).await?;
                if cd.inserted == Some(true) {
                    client.eject_media(&cd).await?;
                }
            }
        }
        self.unpublish(i);
        self.claims.release(server, &claim.id)?;
        tracing::info!(server = %server, "released server");
        Ok(())
    }

    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        // The seed is on the BMC's virtual CD, not readable back through Redfish: what
        // this process serves is what there is to show.
        let Some((i, claim)) = self.owned_claim(id)? else {
            return Err(self.not_found(id));
        };
        Ok(self
            .served_map()
            .get(&i)
            .filter(|s| s.claim == claim.id)
            .and_then(|s| s.user_data.clone()))
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        let (reset_type, powered) = match op {
            PowerOp::Start => ("On", true),
            PowerOp::Stop => ("ForceOff", false),
            PowerOp::Reboot => ("ForceRestart", true),
            _ => return Err(unsupported_power_op(self, op)),
        };
        let Some((i, mut claim)) = self.owned_claim(id)? else {
            return Err(self.not_found(id));
        };
        if !self.visible(&claim) {
            return Err(self.not_found(id));
        }
        if claim.creating || claim.deleting {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "machine {} is being {}",
                    claim.name,
                    if claim.creating { "created" } else { "deleted" }
                ),
            ));
        }
        let system = self.system(i).await?;
        self.allowed(i, &system, reset_type)?;
        let already = match op {
            PowerOp::Start => system.power_state == Some(PowerState::On),
            PowerOp::Stop => system.power_state == Some(PowerState::Off),
            _ => false,
        };
        claim.powered = powered;
        if powered {
            // Recorded before it is sent, as at create: an ignored one is noticed.
            claim.power_on_asked = Some(unix_now());
            claim.power_on_asks = 1;
            claim.power_on_seen = false;
        }
        self.claims.update(&self.names[i], &claim)?;
        if !already {
            self.clients[i].reset(&system, reset_type).await?;
        }
        // Returns once the BMC shows the new state: a BMC that applies resets later
        // (sushy: 1-11 s, one pending reset) would otherwise let the next operation be
        // overtaken by this one.
        let want = if powered {
            PowerState::On
        } else {
            PowerState::Off
        };
        self.wait_power(i, want, Instant::now() + POWER_SETTLE)
            .await
            .map(drop)
    }

    async fn console_output(&self, _id: &ProviderId) -> Result<Option<String>> {
        Ok(None)
    }

    /// Stops serving the machine's seed and records that its bootstrap finished: once
    /// its software is in place the BMC needs the seed no more, its URL should not keep
    /// handing out the user data, and no later create publishes it again.
    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        let Some((i, mut claim)) = self.owned_claim(&machine.provider_id)? else {
            return Ok(());
        };
        if claim.name != machine.name {
            return Ok(());
        }
        self.unpublish(i);
        if !claim.bootstrap_finished {
            claim.bootstrap_finished = true;
            self.claims.update(&self.names[i], &claim)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Claim {
        let mut c = Claim::new("o", MachineName::new("m").unwrap(), Labels::new());
        c.creating = false;
        c.power_on_asked = Some(1000);
        c.power_on_asks = 1;
        c
    }

    #[test]
    fn every_claim_has_an_instance_id_of_its_own_and_old_claims_keep_theirs() {
        let (a, b) = (claim(), claim());
        assert_eq!(instance_id(&a), format!("m-{}", a.id));
        assert_ne!(instance_id(&a), instance_id(&b));
        // A claim file of an earlier version (no `version`) keeps the name.
        let old: Claim = serde_json::from_str(
            r#"{"owner":"o","name":"m","id":"0123456789abcdef","creating":false}"#,
        )
        .unwrap();
        assert!(old.is_legacy());
        assert_eq!(instance_id(&old), "m");
        for bad in ["", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_claim_id("s0", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_ignored_power_on_is_asked_again_once_then_failed() {
        let grace = Duration::from_secs(30);
        let off = Some(PowerState::Off);
        let c = claim();
        assert_eq!(
            judge(&c, off, 1010, grace),
            Verdict::Phase(Phase::Provisioning)
        );
        assert_eq!(judge(&c, off, 1030, grace), Verdict::AskAgain);
        let mut again = c.clone();
        again.power_on_asks = 2;
        again.power_on_asked = Some(1030);
        assert_eq!(
            judge(&again, off, 1059, grace),
            Verdict::Phase(Phase::Provisioning)
        );
        assert_eq!(judge(&again, off, 1060, grace), Verdict::Ignored);
        assert_eq!(
            judge(&again, Some(PowerState::On), 1060, grace),
            Verdict::FirstSeenOn
        );
    }

    #[test]
    fn phases_follow_the_claim_then_the_power_state() {
        let grace = Duration::from_secs(30);
        let mut c = claim();
        c.power_on_seen = true;
        assert_eq!(
            judge(&c, Some(PowerState::On), 2000, grace),
            Verdict::Phase(Phase::Provisioned)
        );
        // Off after having been on: its OS shut down, or someone pressed the button.
        assert_eq!(
            judge(&c, Some(PowerState::Off), 2000, grace),
            Verdict::Phase(Phase::Stopped)
        );
        assert_eq!(
            judge(&c, Some(PowerState::PoweringOn), 9000, grace),
            Verdict::Phase(Phase::Provisioning)
        );
        c.powered = false;
        assert_eq!(
            judge(&c, Some(PowerState::On), 2000, grace),
            Verdict::Phase(Phase::Stopped)
        );
        c.deleting = true;
        assert_eq!(
            judge(&c, Some(PowerState::On), 2000, grace),
            Verdict::Phase(Phase::Deleting)
        );
        let fresh = Claim::new("o", MachineName::new("m").unwrap(), Labels::new());
        assert_eq!(
            judge(&fresh, Some(PowerState::Off), 0, grace),
            Verdict::Phase(Phase::Pending)
        );
    }
}
