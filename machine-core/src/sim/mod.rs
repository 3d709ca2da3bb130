//! `sim`: a complete in-memory provider, the smallest one to read and the one the tests
//! of everything else lean on (object_store's `memory.rs` plays this part there).
//!
//! A [`SimCloud`] is the shared "cloud": several [`SimProvider`]s on one cloud see the
//! same machines, which is how a restarted process adopting machines is simulated.
//! Machines boot after a configurable latency with jitter, observed lazily (no
//! background tasks), so ten thousand machines cost only memory.
//!
//! The sim's init stands in for cloud-init: at boot it stores the user data at
//! `/var/lib/cloud/instance/user-data.txt`, records it as run, and, when the user data
//! holds a completion waiter reporting to files (what [`crate::SentinelFile`] adds),
//! writes its success file as a successful bootstrap would. It does not execute
//! scripts, and writes no sentinel that the user data did not ask for. Decoupled layers reach the machine through [`SimConnector`], which
//! records files and commands so tests can assert what happened on each machine.
//!
//! Power operations are all supported: a stop makes the machine [`Phase::Stopped`] at
//! once (connections refused), a start or reboot boots it again within the boot latency,
//! keeping its files.
//!
//! A cloud lives in memory; [`SimCloud::snapshot`] and [`SimCloud::restore`] carry it
//! from one process to the next (the `machines` CLI keeps it in a state file).

mod host;
mod mime;
mod snapshot;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

// tokio's clock, so that composer tests run on a paused clock.
use tokio::time::Instant;

use async_trait::async_trait;

use host::HostCell;
pub use host::{SimConnector, SimFile, SimHost, SimTransport};
pub use snapshot::SimSnapshot;

use crate::capabilities::{Capabilities, PowerOp, PowerOperations, SizeBasis, UserDataDelivery};
use crate::conformance::{BackendFault, FaultHook};
use crate::error::{Error, Result};
use crate::machine::{Address, AddressKind, Labels, Machine, Phase, ProviderId, SshEndpoint};
use crate::name::MachineName;
use crate::provisioner::MachineProvisioner;
use crate::spec::MachineSpec;
use crate::transport::ExecOutput;
use crate::user_data::{self, UserData, UserDataFormat};

/// How a [`SimProvider`] behaves.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SimConfig {
    /// The owner tag this provider instance creates and finds machines under.
    pub owner: String,
    /// Time from create to running.
    pub boot_latency: Duration,
    /// Random extra boot time, uniform between zero and this.
    pub boot_jitter: Duration,
    /// Time from delete to gone.
    pub delete_latency: Duration,
    /// The user-data limit in bytes (raw basis), 16 KiB by default as on EC2.
    pub user_data_limit: usize,
    /// Whether gzip user data is accepted.
    pub gzip: bool,
    /// Share of machines (0.0 to 1.0) that fail to boot and end in phase Failed.
    pub boot_failure_rate: f64,
    /// Seed for the random draws; `None` seeds from the OS.
    pub seed: Option<u64>,
}

impl Default for SimConfig {
    /// Owner `sim`, instant boot and delete, 16 KiB user data with gzip, no failures.
    fn default() -> Self {
        SimConfig {
            owner: crate::DEFAULT_OWNER.to_owned(),
            boot_latency: Duration::ZERO,
            boot_jitter: Duration::ZERO,
            delete_latency: Duration::ZERO,
            user_data_limit: 16 * 1024,
            gzip: true,
            boot_failure_rate: 0.0,
            seed: None,
        }
    }
}

/// `#[non_exhaustive]`: start from [`SimConfig::default`] and adjust with these.
impl SimConfig {
    /// Sets the owner tag.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Sets the time from create to running.
    pub fn with_boot_latency(mut self, boot_latency: Duration) -> Self {
        self.boot_latency = boot_latency;
        self
    }

    /// Sets the random extra boot time.
    pub fn with_boot_jitter(mut self, boot_jitter: Duration) -> Self {
        self.boot_jitter = boot_jitter;
        self
    }

    /// Sets the time from delete to gone.
    pub fn with_delete_latency(mut self, delete_latency: Duration) -> Self {
        self.delete_latency = delete_latency;
        self
    }

    /// Sets the user-data limit in bytes.
    pub fn with_user_data_limit(mut self, user_data_limit: usize) -> Self {
        self.user_data_limit = user_data_limit;
        self
    }

    /// Sets whether gzip user data is accepted.
    pub fn with_gzip(mut self, gzip: bool) -> Self {
        self.gzip = gzip;
        self
    }

    /// Sets the share of machines that fail to boot.
    pub fn with_boot_failure_rate(mut self, boot_failure_rate: f64) -> Self {
        self.boot_failure_rate = boot_failure_rate;
        self
    }

    /// Sets the seed for the random draws.
    pub fn with_seed(mut self, seed: Option<u64>) -> Self {
        self.seed = seed;
        self
    }
}

struct SimMachine {
    name: MachineName,
    owner: String,
    id: ProviderId,
    labels: Labels,
    size: Option<String>,
    ssh_user: String,
    user_data: Option<UserData>,
    boot_at: Instant,
    boot_fails: bool,
    booted: bool,
    /// Powered off by a stop, until a start.
    stopped: bool,
    delete_at: Option<Instant>,
    cell: Arc<HostCell>,
    seq: u64,
    /// How often the composer said its bootstrap finished.
    bootstrap_finished: usize,
}

impl SimMachine {
    fn phase(&self, now: Instant, delete_latency: Duration) -> Phase {
        match self.delete_at {
            Some(at)
                if at
                    .checked_add(delete_latency)
                    .is_some_and(|gone| now >= gone) =>
            {
                Phase::Deleted
            }
            Some(_) => Phase::Deleting,
            None if self.stopped => Phase::Stopped,
            None if now < self.boot_at => Phase::Provisioning,
            None if self.boot_fails => Phase::Failed,
            None => Phase::Provisioned,
        }
    }
}

#[derive(Default)]
struct State {
    seq: u64,
    machines: HashMap<ProviderId, SimMachine>,
    by_name: HashMap<(String, MachineName), ProviderId>,
    api_calls: u64,
    exec_responses: Vec<(String, ExecOutput)>,
    /// The fault every create is answered with, and how many were.
    fault: Option<BackendFault>,
    faults_answered: u64,
}

/// The shared in-memory cloud behind [`SimProvider`]s and [`SimConnector`]s.
#[derive(Clone, Default)]
pub struct SimCloud {
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for SimCloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("SimCloud")
            .field("machines", &st.machines.len())
            .field("api_calls", &st.api_calls)
            .finish()
    }
}

impl SimCloud {
    /// An empty cloud.
    pub fn new() -> Self {
        SimCloud::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many provider API calls this cloud has answered, from every provider on it.
    pub fn api_calls(&self) -> u64 {
        self.lock().api_calls
    }

    /// How many machines exist, in any phase, deleted ones included.
    pub fn machine_count(&self) -> usize {
        self.lock().machines.len()
    }

    /// How many times [`MachineProvisioner::bootstrap_finished`] was called for the
    /// machine with `id` (0 for an unknown machine). The simulator withdraws nothing;
    /// it counts, so that tests see when the composer calls it.
    pub fn bootstrap_finished_calls(&self, id: &ProviderId) -> usize {
        self.lock()
            .machines
            .get(id)
            .map_or(0, |m| m.bootstrap_finished)
    }

    /// A copy of what happened on the machine with `id`: its files and commands.
    pub fn host(&self, id: &ProviderId) -> Option<SimHost> {
        self.lock().machines.get(id).map(|m| m.cell.lock().clone())
    }

    /// Removes the file at `path` from the machine with `id`, as an operator (or a lost
    /// disk) would; `Ok` whether or not it was there.
    pub fn remove_file(&self, id: &ProviderId, path: &str) -> Result<()> {
        let st = self.lock();
        let m = st
            .machines
            .get(id)
            .ok_or_else(|| Error::not_found(format!("no simulated machine {id}")))?;
        m.cell.lock().files.remove(path);
        Ok(())
    }

    /// Cuts (`false`) or restores (`true`) the link to the machine with `id`: connects
    /// time out and open transports fail with a transient error while cut.
    pub fn set_reachable(&self, id: &ProviderId, reachable: bool) -> Result<()> {
        let st = self.lock();
        let m = st
            .machines
            .get(id)
            .ok_or_else(|| Error::not_found(format!("no simulated machine {id}")))?;
        m.cell
            .reachable
            .store(reachable, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// A hook that makes this cloud refuse creates the way a cloud does (quota, capacity,
    /// permission, throttle), for the conformance suite's
    /// [`backend_faults_come_back_with_their_kind`](crate::conformance::backend_faults_come_back_with_their_kind).
    pub fn fault_hook(&self) -> Arc<dyn FaultHook> {
        Arc::new(SimFaults(self.clone()))
    }

    /// Makes every command that starts with `prefix` answer `output` on every machine
    /// (the most recently added matching prefix wins); other commands exit 0 silently.
    pub fn on_exec(&self, prefix: impl Into<String>, output: ExecOutput) {
        self.lock().exec_responses.push((prefix.into(), output));
    }

    fn exec_response(&self, command: &str) -> ExecOutput {
        self.lock()
            .exec_responses
            .iter()
            .rev()
            .find(|(p, _)| command.starts_with(p.as_str()))
            .map(|(_, o)| o.clone())
            .unwrap_or(ExecOutput {
                status: Some(0),
                stdout: Vec::new(),
                stderr: Vec::new(),
                truncated: false,
            })
    }

    fn running_host(&self, id: &ProviderId) -> Result<Arc<HostCell>> {
        let mut st = self.lock();
        let m = st
            .machines
            .get_mut(id)
            .ok_or_else(|| Error::not_found(format!("no simulated machine {id}")))?;
        // The delete latency does not matter here: deleting machines refuse connections.
        match m.phase(Instant::now(), Duration::MAX) {
            Phase::Provisioned => {
                boot(m);
                Ok(m.cell.clone())
            }
            phase => Err(Error::transient(format!(
                "connection to {} refused: machine is {phase}",
                m.name
            ))),
        }
    }
}

/// The simulated cloud's refusals, switched by the conformance suite.
struct SimFaults(SimCloud);

#[async_trait]
impl FaultHook for SimFaults {
    fn supports(&self, _fault: BackendFault) -> bool {
        true
    }

    async fn inject(&self, fault: BackendFault) {
        let mut st = self.0.lock();
        st.fault = Some(fault);
        st.faults_answered = 0;
    }

    async fn clear(&self) {
        self.0.lock().fault = None;
    }

    fn answered(&self) -> u64 {
        self.0.lock().faults_answered
    }
}

/// The error the simulated cloud answers a create with under `fault`.
fn refusal(fault: BackendFault) -> Error {
    match fault {
        BackendFault::Quota => Error::quota_exceeded("simulated instance quota reached"),
        BackendFault::Capacity => {
            Error::insufficient_capacity("simulated zone has no capacity for the size")
        }
        BackendFault::Permission => Error::new(
            crate::ErrorKind::Unauthorized,
            "simulated credentials may not create machines",
        ),
        BackendFault::Throttle => {
            Error::throttled("simulated rate limit", Some(Duration::from_millis(1)))
        }
    }
}

/// The sim's init: runs once, when a machine is first seen running.
fn boot(m: &mut SimMachine) {
    if m.booted {
        return;
    }
    m.booted = true;
    let mut host = m.cell.lock();
    let Some(ud) = &m.user_data else {
        return;
    };
    let content = ud.decoded().unwrap_or_else(|_| ud.bytes.clone());
    host.commands.push(format!(
        "[init] ran user data ({:?}, {} bytes)",
        ud.format,
        ud.bytes.len()
    ));
    // Only a completion waiter in the user data reports success, as on a real machine:
    // user data without one leaves no sentinel for a check to find.
    let success = waiter_success_file(&content);
    host.files.insert(
        "/var/lib/cloud/instance/user-data.txt".to_owned(),
        SimFile {
            content,
            mode: 0o600,
            owner: Some("root".to_owned()),
        },
    );
    if let Some(path) = success {
        host.files.insert(
            path,
            SimFile {
                content: b"success\n".to_vec(),
                mode: 0o644,
                owner: Some("root".to_owned()),
            },
        );
    }
}

/// The success file a [`CompletionWaiter::files`](crate::user_data::CompletionWaiter::files)
/// part in `user_data` would write, read from the waiter's settings word.
fn waiter_success_file(user_data: &[u8]) -> Option<String> {
    mime::parts(user_data).iter().find_map(|part| {
        user_data::CompletionWaiter::success_file_in(&String::from_utf8_lossy(part))
    })
}

/// The in-memory provider. See the [module docs](self).
pub struct SimProvider {
    cloud: SimCloud,
    config: SimConfig,
    capabilities: Capabilities,
    rng: Mutex<fastrand::Rng>,
}

impl SimProvider {
    /// A provider on `cloud` behaving as `config` says. Refuses a failure rate outside
    /// 0.0..=1.0 and an empty owner, naming the field.
    pub fn new(cloud: SimCloud, config: SimConfig) -> Result<Self> {
        if !(0.0..=1.0).contains(&config.boot_failure_rate) {
            return Err(Error::invalid_spec(
                "bootFailureRate",
                format!(
                    "{} is not a probability between 0.0 and 1.0",
                    config.boot_failure_rate
                ),
            ));
        }
        if config.owner.is_empty() {
            return Err(Error::invalid_spec("owner", "must not be empty"));
        }
        // Built as a provider outside this crate must build it: the struct is
        // non-exhaustive, so a capability added later defaults to unsupported.
        let capabilities = Capabilities::default()
            .with_user_data(
                UserDataDelivery::new(
                    config.user_data_limit,
                    SizeBasis::Raw,
                    [&UserDataFormat::CLOUD_INIT[..], &[UserDataFormat::Raw]].concat(),
                )
                .with_gzip(config.gzip),
            )
            .with_power(PowerOperations::all())
            .with_console_output(true)
            .with_host_key_discovery(true);
        let rng = config
            .seed
            .map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        Ok(SimProvider {
            cloud,
            config,
            capabilities,
            rng: Mutex::new(rng),
        })
    }

    /// The cloud this provider works on.
    pub fn cloud(&self) -> &SimCloud {
        &self.cloud
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    fn view(&self, m: &mut SimMachine, now: Instant) -> Machine {
        let phase = m.phase(now, self.config.delete_latency);
        if phase == Phase::Provisioned {
            boot(m);
        }
        let mut out = Machine::new(m.name.clone(), m.id.clone(), phase);
        out.labels = m.labels.clone();
        out.size = m.size.clone();
        if phase == Phase::Failed {
            out.fail(
                "BootFailed",
                "the simulated machine failed to boot (injected)",
            );
        }
        if phase.is_running() {
            let ip = format!(
                "10.{}.{}.{}",
                (m.seq >> 16) & 0xff,
                (m.seq >> 8) & 0xff,
                m.seq & 0xff
            );
            out.addresses = vec![
                Address::new(AddressKind::Hostname, m.name.as_str()),
                Address::new(AddressKind::InternalIP, ip.clone()),
            ];
            out.access.ssh = Some(SshEndpoint {
                host: ip,
                port: 22,
                user: m.ssh_user.clone(),
            });
            out.access.host_keys = vec![sim_host_key(&m.id)];
        }
        out
    }
}

/// A well-formed OpenSSH ed25519 public key line, stable per machine: the key blob is
/// the SSH wire encoding of the algorithm name and 32 bytes derived from the ID.
fn sim_host_key(id: &ProviderId) -> String {
    use base64::Engine;
    use sha2::Digest;
    const ALGO: &[u8] = b"ssh-ed25519";
    let key = sha2::Sha256::digest(id.as_str().as_bytes());
    let mut blob = Vec::with_capacity(4 + ALGO.len() + 4 + key.len());
    blob.extend_from_slice(&(ALGO.len() as u32).to_be_bytes());
    blob.extend_from_slice(ALGO);
    blob.extend_from_slice(&(key.len() as u32).to_be_bytes());
    blob.extend_from_slice(&key);
    format!(
        "ssh-ed25519 {} sim",
        base64::engine::general_purpose::STANDARD.encode(blob)
    )
}

impl fmt::Display for SimProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sim(owner={})", self.config.owner)
    }
}

impl fmt::Debug for SimProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimProvider")
            .field("config", &self.config)
            .field("cloud", &self.cloud)
            .finish()
    }
}

#[async_trait]
impl MachineProvisioner for SimProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        spec.validate()?;
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        let (jitter, boot_fails) = {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            let jitter = self.config.boot_jitter.mul_f64(rng.f64());
            (jitter, rng.f64() < self.config.boot_failure_rate)
        };
        let now = Instant::now();
        let mut st = self.cloud.lock();
        st.api_calls += 1;
        if let Some(fault) = st.fault {
            st.faults_answered += 1;
            return Err(refusal(fault));
        }
        let key = (self.config.owner.clone(), spec.name.clone());
        if let Some(id) = st.by_name.get(&key).cloned()
            && let Some(m) = st.machines.get_mut(&id)
            && m.phase(now, self.config.delete_latency) != Phase::Deleted
        {
            return Ok(self.view(m, now));
        }
        st.seq += 1;
        let seq = st.seq;
        let id = ProviderId::new(format!("sim:///m-{seq:08}"))?;
        let mut m = SimMachine {
            name: spec.name.clone(),
            owner: self.config.owner.clone(),
            id: id.clone(),
            labels: spec.labels.clone(),
            size: spec.size.clone(),
            ssh_user: spec
                .ssh
                .as_ref()
                .map_or_else(|| "root".to_owned(), |s| s.user.clone()),
            user_data: user_data.cloned(),
            boot_at: now + self.config.boot_latency + jitter,
            boot_fails,
            booted: false,
            stopped: false,
            delete_at: None,
            cell: HostCell::new(),
            seq,
            bootstrap_finished: 0,
        };
        let view = self.view(&mut m, now);
        st.by_name.insert(key, id.clone());
        st.machines.insert(id, m);
        Ok(view)
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        let now = Instant::now();
        let mut st = self.cloud.lock();
        st.api_calls += 1;
        match st.machines.get_mut(id) {
            Some(m) if m.owner == self.config.owner => Ok(self.view(m, now)),
            _ => Err(Error::not_found(format!("no machine {id}"))),
        }
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        let now = Instant::now();
        let mut st = self.cloud.lock();
        st.api_calls += 1;
        let key = (self.config.owner.clone(), name.clone());
        let Some(id) = st.by_name.get(&key).cloned() else {
            return Ok(None);
        };
        let Some(m) = st.machines.get_mut(&id) else {
            return Ok(None);
        };
        let view = self.view(m, now);
        if view.phase == Phase::Deleted {
            st.by_name.remove(&key);
            return Ok(None);
        }
        Ok(Some(view))
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        let now = Instant::now();
        let mut st = self.cloud.lock();
        st.api_calls += 1;
        let mut out: Vec<Machine> = st
            .machines
            .values_mut()
            .filter(|m| m.owner == self.config.owner)
            .filter(|m| selector.iter().all(|(k, v)| m.labels.get(k) == Some(v)))
            .map(|m| self.view(m, now))
            .filter(|m| m.phase != Phase::Deleted)
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        let mut st = self.cloud.lock();
        st.api_calls += 1;
        if let Some(m) = st.machines.get_mut(id)
            && m.owner == self.config.owner
            && m.delete_at.is_none()
        {
            m.delete_at = Some(Instant::now());
        }
        Ok(())
    }

    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        let mut st = self.cloud.lock();
        st.api_calls += 1;
        match st.machines.get(id) {
            Some(m) if m.owner == self.config.owner => Ok(m.user_data.clone()),
            _ => Err(Error::not_found(format!("no machine {id}"))),
        }
    }

    /// Stop powers the machine off at once (phase Stopped, connections refused); start
    /// and reboot boot it again, taking the configured boot latency. Files on the
    /// machine stay, and its init does not run again, as with cloud-init.
    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        let now = Instant::now();
        let mut st = self.cloud.lock();
        st.api_calls += 1;
        let m = match st.machines.get_mut(id) {
            Some(m) if m.owner == self.config.owner => m,
            _ => return Err(Error::not_found(format!("no machine {id}"))),
        };
        if m.delete_at.is_some() {
            return Err(Error::new(
                crate::ErrorKind::Conflict,
                format!("machine {} is being deleted", m.name),
            ));
        }
        match op {
            PowerOp::Stop => m.stopped = true,
            PowerOp::Start if !m.stopped => {}
            PowerOp::Start | PowerOp::Reboot => {
                m.stopped = false;
                m.boot_at = now + self.config.boot_latency;
            }
        }
        Ok(())
    }

    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        let machine = self.get(id).await?;
        let mut log = format!("[sim] {} booting\n", machine.name);
        if machine.phase.is_running() {
            log.push_str("-----BEGIN SSH HOST KEY KEYS-----\n");
            for key in &machine.access.host_keys {
                log.push_str(key);
                log.push('\n');
            }
            log.push_str("-----END SSH HOST KEY KEYS-----\n");
        }
        Ok(Some(log))
    }

    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        let mut st = self.cloud.lock();
        st.api_calls += 1;
        match st.machines.get_mut(&machine.provider_id) {
            Some(m) if m.owner == self.config.owner => {
                m.bootstrap_finished += 1;
                Ok(())
            }
            _ => Err(Error::not_found(format!(
                "no machine {}",
                machine.provider_id
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::user_data::CompletionWaiter;
    use crate::{CAPI_SENTINEL, MachineSpec};

    async fn booted_host(user_data: UserData) -> SimHost {
        let cloud = SimCloud::new();
        let config = SimConfig {
            boot_latency: Duration::ZERO,
            boot_jitter: Duration::ZERO,
            ..SimConfig::default()
        };
        let p = SimProvider::new(cloud.clone(), config).unwrap();
        let spec = MachineSpec::new(MachineName::new("m").unwrap());
        let m = p.create(&spec, Some(&user_data)).await.unwrap();
        assert_eq!(
            p.get(&m.provider_id).await.unwrap().phase,
            Phase::Provisioned
        );
        cloud.host(&m.provider_id).unwrap()
    }

    #[tokio::test]
    async fn only_a_completion_waiter_in_the_user_data_writes_the_sentinel() {
        let plain = UserData::new(UserDataFormat::CloudConfig, "#cloud-config\n{}\n");
        let host = booted_host(plain).await;
        assert!(
            !host.files.contains_key(CAPI_SENTINEL),
            "{:?}",
            host.files.keys()
        );

        let waiter = CompletionWaiter::files("/run/a b/done", "/run/a b/failed").part();
        let ud = UserData::new(UserDataFormat::ShellScript, waiter.content.clone());
        let host = booted_host(ud).await;
        assert_eq!(
            host.files
                .get("/run/a b/done")
                .map(|f| f.content.as_slice()),
            Some(&b"success\n"[..]),
            "{:?}",
            host.files.keys()
        );
    }
}
