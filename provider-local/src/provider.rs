//! [`LocalProvider`]: machine-core's [`MachineProvisioner`] over an [`Engine`].

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use machine_core::{
    Access, Address, AddressKind, Capabilities, Error, ErrorKind, Labels, Machine, MachineName,
    MachineProvisioner, MachineSpec, PowerOp, PowerOperations, ProviderId, Result, SizeBasis,
    SshEndpoint, UserData, UserDataDelivery, UserDataFormat, shown, user_data,
};

use crate::config::{LocalConfig, Subnet};
use crate::engine::{Engine, Network};
use crate::errors;
use crate::netns::NamespaceEngine;
use crate::state::{self, Leases, MachineRecord, NameLock};
use crate::status::{self, OUTPUT_LOG};

/// The scheme of this provider's IDs: `local:///<owner>/<name>/<generation>`.
pub const SCHEME: &str = "local";

/// The largest user data accepted, in bytes as given. cloud-init reads the NoCloud
/// seed from a file, so the limit only keeps a runaway document from filling /run.
pub const MAX_USER_DATA: usize = 256 * 1024;

/// The directory, inside an owner's, of the machines' lock files (see [`NameLock`]);
/// never a machine's name, which cannot start with a dot.
const LOCKS_DIR: &str = ".locks";

/// Where the provider puts the authorized keys of `spec.ssh` inside a machine; the
/// machine's sshd reads them beside the user's own `~/.ssh/authorized_keys`, so user
/// data that replaces users cannot lock the provider's user out.
const PROVIDER_KEYS_DIR: &str = "/etc/ssh/provider-keys";

/// The image's own cloud-init settings: the NoCloud seed only; no network
/// configuration (the provider sets the address); no locale (the root has no locales);
/// no growing or resizing of a root that is an overlay; host keys of the fast types
/// only (cloud-init's default adds RSA and DSA, which took 4 of a boot's 12 s on a
/// loaded 2-core host). User data can set any of these again.
const IMAGE_CLOUD_CFG: &str = "datasource_list: [ NoCloud, None ]\nnetwork: {config: disabled}\nlocale: false\nresize_rootfs: false\ngrowpart: {mode: 'off'}\nssh_genkeytypes: [ed25519, ecdsa]\n";

/// Host keys read back, in the order a client prefers them.
const HOST_KEY_FILES: [&str; 3] = [
    "/etc/ssh/ssh_host_ed25519_key.pub",
    "/etc/ssh/ssh_host_ecdsa_key.pub",
    "/etc/ssh/ssh_host_rsa_key.pub",
];

/// Real machines on this host. See the crate documentation.
#[derive(Debug, Clone)]
pub struct LocalProvider {
    config: LocalConfig,
    subnet: Subnet,
    engine: Arc<dyn Engine>,
    capabilities: Capabilities,
}

impl fmt::Display for LocalProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "local({} on {} {})",
            self.config.owner, self.config.bridge, self.subnet
        )
    }
}

impl LocalProvider {
    /// A provider running machines with the namespace engine. Fails when the config is
    /// invalid, when not running as root, or when the root file system is missing or
    /// incomplete (the error names it and the script that builds it).
    pub fn new(config: LocalConfig) -> Result<Self> {
        let engine = Arc::new(NamespaceEngine::new(config.root.clone()));
        Self::with_engine(config, engine)
    }

    /// A provider running machines with `engine`, after its preflight check.
    pub fn with_engine(config: LocalConfig, engine: Arc<dyn Engine>) -> Result<Self> {
        config.validate()?;
        let subnet = config.subnet()?;
        engine.preflight()?;
        Ok(LocalProvider {
            config,
            subnet,
            engine,
            capabilities: Capabilities::default()
                .with_user_data(
                    UserDataDelivery::new(
                        MAX_USER_DATA,
                        SizeBasis::Raw,
                        UserDataFormat::CLOUD_INIT.to_vec(),
                    )
                    .with_gzip(true),
                )
                .with_power(PowerOperations::all())
                .with_console_output(true)
                .with_host_key_discovery(true),
        })
    }

    /// The config this provider runs with.
    pub fn config(&self) -> &LocalConfig {
        &self.config
    }

    /// The directory of machine `name` of this owner.
    pub fn machine_dir(&self, name: &MachineName) -> PathBuf {
        self.owner_dir().join(name.as_str())
    }

    fn owner_dir(&self) -> PathBuf {
        self.config.run_dir.join(&self.config.owner)
    }

    fn network(&self) -> Network {
        Network::new(
            self.config.bridge.clone(),
            self.subnet.gateway(),
            self.subnet.prefix(),
        )
    }

    fn leases(&self) -> Leases {
        Leases::new(&self.config.run_dir)
    }

    fn holder(&self, name: &MachineName) -> String {
        format!("{}/{}", self.config.owner, name)
    }

    /// The ID of the machine `r` records: `local:///<owner>/<name>/<generation>`. The
    /// generation is new for every machine made, so the ID of a deleted machine never
    /// names a later machine of the same name (a stale delete cannot remove it).
    fn provider_id(&self, r: &MachineRecord) -> Result<ProviderId> {
        ProviderId::new(format!(
            "{SCHEME}:///{}/{}/{}",
            self.config.owner,
            r.name,
            r.generation()
        ))
    }

    /// The machine name and generation `id` stands for, when it is one of this
    /// owner's IDs.
    fn name_of(&self, id: &ProviderId) -> Option<(MachineName, String)> {
        if id.scheme() != SCHEME {
            return None;
        }
        let rest = id.as_str().strip_prefix("local:///")?;
        let mut parts = rest.split('/');
        let (owner, name, generation) = (parts.next()?, parts.next()?, parts.next()?);
        if owner != self.config.owner || parts.next().is_some() || generation.is_empty() {
            return None;
        }
        Some((MachineName::new(name).ok()?, generation.to_owned()))
    }

    /// The record of the machine `id` names: `Ok(None)` when there is none, also when
    /// the name is now held by another (later) machine.
    fn record_of(&self, id: &ProviderId) -> Result<Option<(PathBuf, MachineRecord)>> {
        let Some((name, generation)) = self.name_of(id) else {
            return Ok(None);
        };
        Ok(self
            .record(&name)?
            .filter(|(_, r)| r.generation() == generation))
    }

    /// The not-found error for `id`.
    fn no_machine(&self, id: &ProviderId) -> Error {
        Error::not_found(format!("{self} has no machine {id}"))
    }

    fn to_machine(&self, dir: &Path, r: &MachineRecord) -> Result<Machine> {
        let (phase, failure) = status::observe(self.engine.as_ref(), dir, r)?;
        let mut m = Machine::new(r.name.clone(), self.provider_id(r)?, phase);
        m.failure = failure;
        m.labels = r.labels.clone();
        let ip = r.address.to_string();
        m.addresses = vec![
            Address::new(AddressKind::InternalIP, ip.clone()),
            Address::new(AddressKind::Hostname, r.name.as_str()),
        ];
        let mut host_keys = Vec::new();
        for file in HOST_KEY_FILES {
            if let Some(bytes) = self.engine.read_file(dir, file)? {
                let text = String::from_utf8_lossy(&bytes);
                // "type base64 comment": the comment names the machine's root, not the key.
                let key: Vec<&str> = text.split_whitespace().take(2).collect();
                if key.len() == 2 {
                    host_keys.push(key.join(" "));
                }
            }
        }
        m.access = Access::ssh(SshEndpoint::new(ip, 22, r.ssh_user.clone()));
        m.access.host_keys = host_keys;
        if phase.is_running() {
            m.set_condition(
                "InfrastructureReady",
                true,
                "CloudInitDone",
                "cloud-init finished",
            );
        }
        Ok(m)
    }

    /// Reads the record of `name`; `Ok(None)` when there is no such machine.
    fn record(&self, name: &MachineName) -> Result<Option<(PathBuf, MachineRecord)>> {
        let dir = self.machine_dir(name);
        Ok(state::read(&dir)?.map(|r| (dir, r)))
    }

    /// Takes the lock of machine `name` (see [`NameLock`]).
    fn lock(&self, name: &MachineName) -> Result<NameLock> {
        NameLock::acquire(&self.owner_dir().join(LOCKS_DIR).join(name.as_str()))
    }

    /// Step of a create that makes a machine: clears what an earlier create of the name
    /// left before it died (its directory, its address), then takes an address. Under
    /// the name's lock, with no record: nothing of the name runs, since a machine boots
    /// only once its record is written.
    fn prepare(&self, spec: &MachineSpec, ud: Option<&UserData>) -> Result<MachineRecord> {
        let dir = self.machine_dir(&spec.name);
        let holder = self.holder(&spec.name);
        state::remove_machine_dir(&dir)?;
        self.leases().release_all_of(&holder)?;
        fs::create_dir_all(&dir).map_err(|e| errors::io("creating", &dir, e))?;
        let slot = self.leases().take(&self.subnet, &holder)?.ok_or_else(|| {
            Error::new(
                ErrorKind::QuotaExceeded,
                format!(
                    "no free address left in {} for machine {}: all {} are taken",
                    self.subnet,
                    spec.name,
                    self.subnet.slots()
                ),
            )
            .with_field("subnet")
        })?;
        let address = self
            .subnet
            .machine_address(slot)
            .ok_or_else(|| Error::permanent(format!("slot {slot} is outside {}", self.subnet)))?;
        let ssh_user = spec
            .ssh
            .as_ref()
            .map_or_else(|| self.config.default_user.clone(), |s| s.user.clone());
        Ok(MachineRecord {
            name: spec.name.clone(),
            owner: self.config.owner.clone(),
            labels: spec.labels.clone(),
            instance_id: format!("{}-{:08x}", spec.name, fastrand::u32(..)),
            bridge: self.config.bridge.clone(),
            slot,
            address,
            prefix: self.subnet.prefix(),
            gateway: self.subnet.gateway(),
            ssh_user,
            user_data: ud.map(|u| (u.format, u.encoding)),
            powered: true,
            deleting: false,
            boot: None,
            created: SystemTime::now(),
        })
    }

    /// Step of a create that makes a machine: everything its boot reads (user data,
    /// NoCloud seed, the image's settings, the provider's keys), each file written
    /// whole, before the record that says the machine exists.
    fn write_files(
        &self,
        record: &MachineRecord,
        spec: &MachineSpec,
        ud: Option<&UserData>,
    ) -> Result<()> {
        let dir = self.machine_dir(&record.name);
        if let Some(ud) = ud {
            state::write_user_data(&dir, ud)?;
        }
        let e = self.engine.as_ref();
        let seed = "/var/lib/cloud/seed/nocloud";
        e.write_file(
            &dir,
            &format!("{seed}/user-data"),
            ud.map_or(&b""[..], |u| &u.bytes),
            0o600,
        )?;
        let meta = format!(
            "instance-id: {}\nlocal-hostname: {}\n",
            record.instance_id, record.name
        );
        e.write_file(&dir, &format!("{seed}/meta-data"), meta.as_bytes(), 0o600)?;
        e.write_file(
            &dir,
            "/etc/cloud/cloud.cfg.d/90-provider-local.cfg",
            IMAGE_CLOUD_CFG.as_bytes(),
            0o644,
        )?;
        if let Some(ssh) = &spec.ssh {
            let keys = ssh.authorized_keys.join("\n") + "\n";
            e.write_file(
                &dir,
                &format!("{PROVIDER_KEYS_DIR}/{}", ssh.user),
                keys.as_bytes(),
                0o644,
            )?;
        }
        Ok(())
    }

    /// Boots a machine whose record says it should run but names no boot process: a
    /// new machine, or one whose create or start died between writing the record and
    /// recording the boot. Whatever such a boot left running is halted first (it may
    /// have started without being recorded), so exactly one boot holds the machine.
    fn boot_recorded(&self, mut record: MachineRecord) -> Result<MachineRecord> {
        let dir = self.machine_dir(&record.name);
        self.engine.ensure_network(&self.network())?;
        self.engine.halt(&record)?;
        record.boot = Some(self.engine.boot(&dir, &record)?);
        state::write(&dir, &record)?;
        tracing::info!(machine = %record.name, address = %record.address, "local machine booting");
        Ok(record)
    }

    /// Removes whatever is left of machine `name` and gives its address back: for a
    /// create that failed half-way, and for what a delete found with no record.
    /// Idempotent.
    fn discard(&self, name: &MachineName) -> Result<()> {
        if let Some(r) = state::read(&self.machine_dir(name))? {
            self.engine.remove(&r)?;
        }
        self.forget(name)
    }

    /// Gives the addresses of machine `name` back and removes its directory, the record
    /// last: the end of a delete, once the machine is off the host. Idempotent.
    fn forget(&self, name: &MachineName) -> Result<()> {
        let dir = self.machine_dir(name);
        if let Some(r) = state::read(&dir)? {
            self.leases().release(r.address, &self.holder(name))?;
        }
        self.leases().release_all_of(&self.holder(name))?;
        state::remove_machine_dir(&dir)
    }

    /// Runs one step of an operation on a machine, holding its lock for the step's
    /// whole run: a step still running when its caller is dropped keeps the lock until
    /// it ends, so no one sees it half done.
    async fn locked<T: Send + 'static>(
        &self,
        lock: &Arc<NameLock>,
        f: impl FnOnce(LocalProvider) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let lock = lock.clone();
        self.blocking(move |p| {
            let _held = lock;
            f(p)
        })
        .await
    }

    /// Takes the lock of `name` and reads its record: the first step of every change.
    async fn lock_and_read(
        &self,
        name: &MachineName,
    ) -> Result<(Arc<NameLock>, Option<MachineRecord>)> {
        let name = name.clone();
        self.blocking(move |p| {
            let lock = p.lock(&name)?;
            let found = state::read(&p.machine_dir(&name))?;
            Ok((Arc::new(lock), found))
        })
        .await
    }

    /// Makes machine `spec.name` from nothing, one step at a time: a create dropped (or
    /// killed) between any two steps leaves a state the next create or delete of the
    /// name finishes. Returns its record, not yet booted.
    async fn make(
        &self,
        lock: &Arc<NameLock>,
        spec: &MachineSpec,
        ud: Option<&UserData>,
    ) -> Result<MachineRecord> {
        let (spec, ud) = (spec.clone(), ud.cloned());
        let made = async {
            let (s, u) = (spec.clone(), ud.clone());
            let record = self
                .locked(lock, move |p| p.prepare(&s, u.as_ref()))
                .await?;
            let (r, s, u) = (record.clone(), spec.clone(), ud.clone());
            self.locked(lock, move |p| p.write_files(&r, &s, u.as_ref()))
                .await?;
            // From here on the machine exists: find sees it, a new create boots it.
            let r = record.clone();
            self.locked(lock, move |p| state::write(&p.machine_dir(&r.name), &r))
                .await?;
            Ok(record)
        };
        match made.await {
            Ok(record) => Ok(record),
            Err(e) => {
                // Leave nothing behind for a create that failed half-way.
                if let Err(cleanup) = self.discard_all(lock, &spec.name).await {
                    tracing::warn!(machine = %spec.name, error = %cleanup, "cleaning up a failed create");
                }
                Err(e)
            }
        }
    }

    /// Removes whatever is left of machine `name`, then the name's lock file: for a
    /// create that failed, which leaves nothing.
    async fn discard_all(&self, lock: &Arc<NameLock>, name: &MachineName) -> Result<()> {
        let (name, held) = (name.clone(), lock.clone());
        self.locked(lock, move |p| {
            p.discard(&name)?;
            held.remove()
        })
        .await
    }

    /// Finishes deleting machine `record.name`, one step at a time, each idempotent:
    /// marks the record, removes the machine from the host (processes, namespace,
    /// interfaces), then gives its address back and removes its directory, the record
    /// last.
    async fn finish_delete(&self, lock: &Arc<NameLock>, mut record: MachineRecord) -> Result<()> {
        if !record.deleting {
            record.deleting = true;
            let r = record.clone();
            self.locked(lock, move |p| state::write(&p.machine_dir(&r.name), &r))
                .await?;
        }
        let r = record.clone();
        self.locked(lock, move |p| p.engine.remove(&r)).await?;
        let name = record.name.clone();
        self.locked(lock, move |p| p.forget(&name)).await
    }

    fn power_blocking(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        let (name, _) = self.name_of(id).ok_or_else(|| self.no_machine(id))?;
        let lock = self.lock(&name)?;
        let Some((dir, mut r)) = self.record_of(id)? else {
            // Nothing of the name at all: its lock file is not left behind either.
            if !self.machine_dir(&name).exists() {
                lock.remove()?;
            }
            return Err(self.no_machine(id));
        };
        if r.deleting {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!("machine {name} is being deleted"),
            ));
        }
        // The record first, then the act: a power operation killed half-way leaves a
        // record that says what was asked, which the next start, stop or create finishes.
        if matches!(op, PowerOp::Stop | PowerOp::Reboot) {
            r.powered = false;
            state::write(&dir, &r)?;
            self.engine.halt(&r)?;
        }
        if matches!(op, PowerOp::Start | PowerOp::Reboot)
            && !(r.powered && self.engine.is_running(&r))
        {
            r.powered = true;
            r.boot = None;
            state::write(&dir, &r)?;
            self.boot_recorded(r)?;
        }
        Ok(())
    }

    fn list_blocking(&self, selector: &Labels) -> Result<Vec<Machine>> {
        let owner_dir = self.owner_dir();
        let entries = match fs::read_dir(&owner_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(errors::io("listing", &owner_dir, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| errors::io("listing", &owner_dir, e))?;
            // Machines only: their names are DNS labels (the locks' directory is not).
            let is_machine = entry.file_type().is_ok_and(|t| t.is_dir())
                && entry
                    .file_name()
                    .to_str()
                    .is_some_and(|n| MachineName::new(n).is_ok());
            if !is_machine {
                continue;
            }
            let dir = entry.path();
            let Some(r) = state::read(&dir)? else {
                continue;
            };
            if selector.iter().all(|(k, v)| r.labels.get(k) == Some(v)) {
                out.push(self.to_machine(&dir, &r)?);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Deletes every machine of every owner under this provider's run directory, then
    /// the bridge and the run directory itself: for tests and for tearing a host down.
    /// Blocking; safe to call from `Drop` and when nothing is there.
    pub fn teardown(&self) -> Result<()> {
        let run_dir = &self.config.run_dir;
        if let Ok(owners) = fs::read_dir(run_dir) {
            for owner in owners.flatten() {
                let Ok(machines) = fs::read_dir(owner.path()) else {
                    continue;
                };
                for m in machines.flatten() {
                    let dir = m.path();
                    if let Ok(Some(r)) = state::read(&dir) {
                        self.engine.remove(&r)?;
                    }
                    let _ = fs::remove_dir_all(&dir);
                }
            }
        }
        self.engine.remove_network(&self.network())?;
        match fs::remove_dir_all(run_dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(errors::io("removing", run_dir, e)),
        }
    }

    /// Runs blocking host work off the async runtime.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(LocalProvider) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || f(me))
            .await
            .map_err(|e| Error::permanent(format!("provider-local worker failed: {e}")))?
    }
}

#[async_trait]
impl MachineProvisioner for LocalProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        spec.validate()?;
        if let Some(size) = &spec.size {
            return Err(Error::invalid_spec(
                "size",
                format!(
                    "{} is not a size provider-local takes: its machines share this host's CPUs and memory; leave size unset",
                    shown(size)
                ),
            ));
        }
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        self.blocking(|p| p.engine.ensure_network(&p.network()))
            .await?;
        let (lock, found) = self.lock_and_read(&spec.name).await?;
        let (record, made_here) = match found {
            // Adoption: the machine exists (booted, or to be booted below).
            Some(r) if !r.deleting => (r, false),
            found => {
                // Holding the lock, a record being deleted is a delete that died: it is
                // finished before the name is made again.
                if let Some(r) = found {
                    self.finish_delete(&lock, r).await?;
                }
                (self.make(&lock, spec, user_data).await?, true)
            }
        };
        let record = if record.powered && record.boot.is_none() {
            let name = record.name.clone();
            match self.locked(&lock, move |p| p.boot_recorded(record)).await {
                Ok(r) => r,
                Err(e) if made_here => {
                    // A machine this call made and could not boot is not left behind.
                    if let Err(cleanup) = self.discard_all(&lock, &name).await {
                        tracing::warn!(error = %cleanup, "cleaning up a machine that did not boot");
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        } else {
            record
        };
        self.locked(&lock, move |p| {
            p.to_machine(&p.machine_dir(&record.name), &record)
        })
        .await
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        let id = id.clone();
        self.blocking(move |p| match p.record_of(&id)? {
            Some((dir, r)) => p.to_machine(&dir, &r),
            None => Err(p.no_machine(&id)),
        })
        .await
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        let name = name.clone();
        self.blocking(move |p| match p.record(&name)? {
            Some((dir, r)) => p.to_machine(&dir, &r).map(Some),
            None => Ok(None),
        })
        .await
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        let selector = selector.clone();
        self.blocking(move |p| p.list_blocking(&selector)).await
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        // Another owner's machine, or no machine of this provider: nothing to do.
        let Some((name, generation)) = self.name_of(id) else {
            return Ok(());
        };
        let (lock, found) = self.lock_and_read(&name).await?;
        match found {
            Some(r) if r.generation() == generation => self.finish_delete(&lock, r).await?,
            // The name is another machine's now: the one of this ID is gone already.
            Some(_) => return Ok(()),
            // No record: at most the remains of a create that died before writing it.
            None => {
                let name = name.clone();
                self.locked(&lock, move |p| p.discard(&name)).await?;
            }
        }
        // The name's lock file goes last, still held: nothing is left per name used.
        let held = lock.clone();
        self.locked(&lock, move |_| held.remove()).await
    }

    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        let id = id.clone();
        self.blocking(move |p| match p.record_of(&id)? {
            Some((dir, r)) => state::read_user_data(&dir, &r),
            None => Err(p.no_machine(&id)),
        })
        .await
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        let id = id.clone();
        self.blocking(move |p| p.power_blocking(&id, op)).await
    }

    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        let id = id.clone();
        self.blocking(move |p| match p.record_of(&id)? {
            Some((dir, _)) => Ok(Some(
                p.engine
                    .read_file(&dir, OUTPUT_LOG)?
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default(),
            )),
            None => Err(p.no_machine(&id)),
        })
        .await
    }
}
