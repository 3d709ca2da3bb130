//! [`RedfishProvider`]: "creating" a machine claims a free server of the pool, gives it
//! a NoCloud seed by virtual media and powers it on; "deleting" it powers it off, ejects
//! the seed and releases the claim.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use machine_core::{
    Capabilities, Error, ErrorKind, Labels, Machine, MachineName, MachineProvisioner, MachineSpec,
    Phase, PowerOp, PowerOperations, ProviderId, Result, SizeBasis, UserData, UserDataDelivery,
    UserDataFormat, unsupported_power_op, user_data,
};
use provider_http::{HttpClient, HttpSettings, TlsConfig};
use serde::Deserialize;

use super::client::{PowerState, RedfishClient, System};
use super::config::{RedfishPoolConfig, ServerEntry};
use super::media_server::MediaServer;
use super::pool::{Claim, Claims};
use super::seed_iso::{MAX_FILE_BYTES, Seed};

/// The provider ID scheme: `redfish://<bmc-host>/<system-id>`.
pub const SCHEME: &str = "redfish";

/// How long a power change may take to show before delete or stop give up waiting.
const POWER_SETTLE: Duration = Duration::from_secs(30);

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

/// Servers behind Redfish BMCs as machines.
///
/// - `create` adopts the server already claimed under the spec's name, or claims the
///   first free server the spec allows, publishes a NoCloud seed with the user data on
///   its media server, inserts it as the system's virtual CD, sets a one-time boot
///   override and powers the system on (or restarts it when it was on).
/// - Phases come from the system's PowerState and the claim's intent: on → `Provisioned`,
///   off while meant to run → `Provisioning`, meant to be off → `Stopped`.
/// - `delete` lets a pending power-on land, forces the system off (and waits until the
///   BMC shows it), ejects the seed, stops serving it and releases the claim.
/// - Power operations return once the BMC shows the new power state.
/// - Power operations map to reset types (start `On`, stop `ForceOff`, reboot
///   `ForceRestart`); a type the system's `ResetType@Redfish.AllowableValues` lacks is
///   refused before any reset is sent.
///
/// Claims are files in the pool's claim directory, which every controller of the pool
/// must share: sushy-tools (the BMC the tests run against) refuses a PATCH of
/// `AssetTag` and has no other writable field that can hold a name, so the claim cannot
/// live on the BMC there.
pub struct RedfishProvider {
    config: RedfishPoolConfig,
    clients: Vec<RedfishClient>,
    ids: Vec<ProviderId>,
    claims: Claims,
    media: MediaServer,
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
        let mut ids = Vec::with_capacity(config.servers.len());
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
            ids.push(Self::provider_id(s)?);
        }
        let media = MediaServer::start(
            config.media_server.listen,
            config.media_server.url.as_deref(),
        )
        .await?;
        let capabilities = Capabilities::default()
            .with_user_data(UserDataDelivery::new(
                MAX_FILE_BYTES,
                SizeBasis::Raw,
                UserDataFormat::CLOUD_INIT.to_vec(),
            ))
            .with_power(PowerOperations::all());
        Ok(RedfishProvider {
            claims: Claims::new(config.claim_dir.clone()),
            config,
            clients,
            ids,
            media,
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

    /// The provider ID of `server`: `redfish://<bmc host[:port]>/<system id>`.
    pub fn provider_id(server: &ServerEntry) -> Result<ProviderId> {
        ProviderId::new(format!(
            "{SCHEME}://{}/{}",
            server.bmc_host()?,
            server.system_id
        ))
    }

    fn index_of(&self, id: &ProviderId) -> Option<usize> {
        self.ids.iter().position(|i| i == id)
    }

    fn machine(&self, i: usize, claim: Claim, system: &System) -> Machine {
        let phase = match (claim.powered, system.power_state) {
            (true, Some(PowerState::On)) => Phase::Provisioned,
            (true, _) => Phase::Provisioning,
            (false, _) => Phase::Stopped,
        };
        let mut m = Machine::new(claim.name, self.ids[i].clone(), phase);
        m.labels = claim.labels;
        m
    }

    async fn machine_of(&self, i: usize, claim: Claim) -> Result<Machine> {
        let system = self.system(i).await?;
        Ok(self.machine(i, claim, &system))
    }

    async fn system(&self, i: usize) -> Result<System> {
        let s = &self.config.servers[i];
        self.clients[i]
            .system(&s.system_id)
            .await
            .map_err(|e| e.context(format!("server {}", s.name)))
    }

    /// This owner's claims, in pool order.
    async fn owned(&self) -> Result<Vec<(usize, Claim)>> {
        let names = self.config.servers.iter().map(|s| s.name.clone()).collect();
        let claims = self.claims.read_many(names).await?;
        Ok(claims
            .into_iter()
            .enumerate()
            .filter_map(|(i, c)| c.filter(|c| c.owner == self.config.owner).map(|c| (i, c)))
            .collect())
    }

    async fn holders(&self, name: &MachineName) -> Result<Vec<(usize, Claim)>> {
        Ok(self
            .owned()
            .await?
            .into_iter()
            .filter(|(_, c)| &c.name == name)
            .collect())
    }

    fn candidates(&self, settings: &RedfishSettings) -> Result<Vec<usize>> {
        if let Some(name) = &settings.server {
            let i = self
                .config
                .servers
                .iter()
                .position(|s| &s.name == name)
                .ok_or_else(|| {
                    Error::invalid_spec(
                        "provider.server",
                        format!("{name:?} is not a server of the pool"),
                    )
                })?;
            return Ok(vec![i]);
        }
        let matching: Vec<usize> = (0..self.config.servers.len())
            .filter(|&i| {
                let labels = &self.config.servers[i].labels;
                settings
                    .selector
                    .iter()
                    .all(|(k, v)| labels.get(k) == Some(v))
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
        Ok(matching)
    }

    /// Refuses `reset_type` up front when the system does not list it.
    fn allowed(&self, i: usize, system: &System, reset_type: &str) -> Result<()> {
        let allowed = system.reset_types();
        if allowed.is_empty() || allowed.iter().any(|t| t == reset_type) {
            return Ok(());
        }
        Err(Error::permanent(format!(
            "server {} does not allow reset type {reset_type} (it allows {})",
            self.config.servers[i].name,
            allowed.join(", ")
        )))
    }

    async fn reset(&self, i: usize, system: &System, reset_type: &str) -> Result<()> {
        self.allowed(i, system, reset_type)?;
        self.clients[i].reset(system, reset_type).await
    }

    /// Waits until the system's power state is `want` (a BMC applies resets later).
    async fn wait_power(&self, i: usize, want: PowerState) -> Result<()> {
        let deadline = tokio::time::Instant::now() + POWER_SETTLE;
        loop {
            if self.system(i).await?.power_state == Some(want) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::timeout(format!(
                    "server {} did not reach power state {want:?} within {POWER_SETTLE:?}",
                    self.config.servers[i].name
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Seeds and boots server `i`, claimed for `spec`.
    async fn provision(
        &self,
        i: usize,
        spec: &MachineSpec,
        settings: &RedfishSettings,
        user_data: Option<&UserData>,
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
                    self.config.servers[i].name,
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
        if cd.inserted == Some(true) {
            client.eject_media(&cd).await?;
        }
        let meta = format!("instance-id: {0}\nlocal-hostname: {0}\n", spec.name);
        let iso = Seed {
            user_data: user_data.map(|u| u.bytes.as_slice()).unwrap_or_default(),
            meta_data: meta.as_bytes(),
            network_config: None,
        }
        .to_iso()?;
        let url = self.media.publish(self.ids[i].as_str(), iso)?;
        client.insert_media(&cd, &url).await?;
        client.set_boot_override(&system, target, true).await?;
        client.reset(&system, power_op).await
    }

    /// Undoes a claim whose provisioning failed, best effort: the error that made it
    /// fail is what the caller sees.
    async fn abandon(&self, i: usize) {
        self.media.remove(self.ids[i].as_str());
        if let Ok(system) = self.system(i).await
            && let Ok(cd) = self.clients[i].virtual_cd(&system).await
            && cd.inserted == Some(true)
        {
            let _ = self.clients[i].eject_media(&cd).await;
        }
        let _ = self.claims.release(&self.config.servers[i].name).await;
    }
}

#[async_trait]
impl MachineProvisioner for RedfishProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        let settings: RedfishSettings = spec.provider_settings()?;
        let candidates = self.candidates(&settings)?;
        if let Some(existing) = self.find(&spec.name).await? {
            return Ok(existing);
        }
        let claim = Claim {
            owner: self.config.owner.clone(),
            name: spec.name.clone(),
            labels: spec.labels.clone(),
            powered: true,
        };
        let mut taken = Vec::new();
        for i in candidates {
            let server = &self.config.servers[i].name;
            if !self.claims.try_claim(server, &claim).await? {
                taken.push(server.as_str());
                continue;
            }
            tracing::info!(server = %server, machine = %spec.name, "claimed server");
            // Two controllers creating one name at once each claim a server: the first
            // holder in pool order keeps it, the others release theirs.
            let mut holders = self.holders(&spec.name).await?.into_iter();
            let (kept, kept_claim) = holders
                .next()
                .ok_or_else(|| Error::transient(format!("the claim for {} vanished", spec.name)))?;
            if kept != i {
                tracing::warn!(server = %server, machine = %spec.name, "releasing a duplicate claim");
                self.claims.release(server).await?;
                return self.machine_of(kept, kept_claim).await;
            }
            if let Err(e) = self.provision(i, spec, &settings, user_data).await {
                self.abandon(i).await;
                return Err(e.context(format!("server {server}")));
            }
            return self.machine_of(i, claim).await;
        }
        Err(Error::new(
            ErrorKind::QuotaExceeded,
            format!(
                "no free server for machine {}: every server it may have is claimed ({})",
                spec.name,
                taken.join(", ")
            ),
        ))
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        let not_found = || Error::not_found(format!("{self}: no machine {id}"));
        let i = self.index_of(id).ok_or_else(not_found)?;
        match self.claims.read(&self.config.servers[i].name).await? {
            Some(c) if c.owner == self.config.owner => self.machine_of(i, c).await,
            _ => Err(not_found()),
        }
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        match self.holders(name).await?.into_iter().next() {
            Some((i, c)) => self.machine_of(i, c).await.map(Some),
            None => Ok(None),
        }
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        let owned: Vec<_> = self
            .owned()
            .await?
            .into_iter()
            .filter(|(_, c)| selector.iter().all(|(k, v)| c.labels.get(k) == Some(v)))
            .collect();
        let mut machines = join_all(owned.into_iter().map(|(i, c)| self.machine_of(i, c)))
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        machines.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(machines)
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        let Some(i) = self.index_of(id) else {
            return Ok(());
        };
        let server = &self.config.servers[i].name;
        let claim = match self.claims.read(server).await? {
            Some(c) if c.owner == self.config.owner => c,
            _ => return Ok(()),
        };
        if claim.powered {
            // A power-on (or restart) may still be pending at the BMC: sushy keeps one
            // pending reset and drops a ForceOff that matches the current state, so a
            // pending On would power the released server on later. Let it land first;
            // a server that never comes on is forced off all the same.
            match self.wait_power(i, PowerState::On).await {
                Err(e) if e.kind() != ErrorKind::Timeout => return Err(e),
                _ => {}
            }
        }
        let system = self.system(i).await?;
        if system.power_state != Some(PowerState::Off) {
            self.reset(i, &system, "ForceOff").await?;
            // Released only once off: the next claimant's power-on must not be
            // overtaken by this power-off.
            self.wait_power(i, PowerState::Off).await?;
        }
        let cd = self.clients[i].virtual_cd(&system).await?;
        if cd.inserted == Some(true) {
            self.clients[i].eject_media(&cd).await?;
        }
        self.media.remove(id.as_str());
        self.claims.release(server).await?;
        tracing::info!(server = %server, "released server");
        Ok(())
    }

    async fn user_data(&self, _id: &ProviderId) -> Result<Option<UserData>> {
        // The seed is on the BMC's virtual CD, not readable back through Redfish.
        Ok(None)
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        let (reset_type, powered) = match op {
            PowerOp::Start => ("On", true),
            PowerOp::Stop => ("ForceOff", false),
            PowerOp::Reboot => ("ForceRestart", true),
            _ => return Err(unsupported_power_op(self, op)),
        };
        let i = self
            .index_of(id)
            .ok_or_else(|| Error::not_found(format!("{self}: no machine {id}")))?;
        let server = &self.config.servers[i].name;
        let mut claim = match self.claims.read(server).await? {
            Some(c) if c.owner == self.config.owner => c,
            _ => return Err(Error::not_found(format!("{self}: no machine {id}"))),
        };
        let system = self.system(i).await?;
        self.allowed(i, &system, reset_type)?;
        let already = match op {
            PowerOp::Start => system.power_state == Some(PowerState::On),
            PowerOp::Stop => system.power_state == Some(PowerState::Off),
            _ => false,
        };
        if !already {
            self.clients[i].reset(&system, reset_type).await?;
        }
        claim.powered = powered;
        self.claims.update(server, &claim).await?;
        // Returns once the BMC shows the new state: a BMC that applies resets later
        // (sushy: 1-11 s, one pending reset) would otherwise let the next operation be
        // overtaken by this one.
        let want = if powered {
            PowerState::On
        } else {
            PowerState::Off
        };
        self.wait_power(i, want).await
    }

    async fn console_output(&self, _id: &ProviderId) -> Result<Option<String>> {
        Ok(None)
    }

    /// Stops serving the machine's seed: once its software is in place the BMC needs
    /// it no more, and its URL should not keep handing out the user data.
    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        self.media.remove(machine.provider_id.as_str());
        Ok(())
    }
}
