//! [`LocalProvider`]: machine-core's [`MachineProvisioner`] over an [`Engine`].

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use machine_core::{
    Access, Address, AddressKind, Capabilities, Error, ErrorKind, Labels, Machine, MachineName,
    MachineProvisioner, MachineSpec, PowerOp, PowerOperations, ProviderId, Result, SizeBasis,
    SshEndpoint, UserData, UserDataDelivery, UserDataFormat, user_data,
};

use crate::config::{LocalConfig, Subnet};
use crate::engine::{Engine, Network};
use crate::errors;
use crate::netns::NamespaceEngine;
use crate::state::{self, Leases, MachineRecord};
use crate::status::{self, OUTPUT_LOG};

/// The scheme of this provider's IDs: `local:///<owner>/<name>`.
pub const SCHEME: &str = "local";

/// The largest user data accepted, in bytes as given. cloud-init reads the NoCloud
/// seed from a file, so the limit only keeps a runaway document from filling /run.
pub const MAX_USER_DATA: usize = 256 * 1024;

/// How long a create waits for a concurrent create of the same name to record it.
const ADOPT_WAIT: Duration = Duration::from_secs(30);

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

    fn provider_id(&self, name: &MachineName) -> Result<ProviderId> {
        ProviderId::new(format!("{SCHEME}:///{}/{}", self.config.owner, name))
    }

    /// The machine name `id` stands for, when it is one of this owner's IDs.
    fn name_of(&self, id: &ProviderId) -> Option<MachineName> {
        if id.scheme() != SCHEME {
            return None;
        }
        let rest = id.as_str().strip_prefix("local:///")?;
        let (owner, name) = rest.split_once('/')?;
        if owner != self.config.owner {
            return None;
        }
        MachineName::new(name).ok()
    }

    fn to_machine(&self, dir: &Path, r: &MachineRecord) -> Result<Machine> {
        let (phase, failure) = status::observe(self.engine.as_ref(), dir, r)?;
        let mut m = Machine::new(r.name.clone(), self.provider_id(&r.name)?, phase);
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

    fn create_blocking(&self, spec: &MachineSpec, ud: Option<&UserData>) -> Result<Machine> {
        self.engine.ensure_network(&self.network())?;
        let owner_dir = self.owner_dir();
        fs::create_dir_all(&owner_dir).map_err(|e| errors::io("creating", &owner_dir, e))?;
        let dir = self.machine_dir(&spec.name);
        // Creating the directory is the claim on the name: exactly one creator wins,
        // every other one adopts what the winner records.
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return self.adopt(&dir, &spec.name);
            }
            Err(e) => return Err(errors::io("creating", &dir, e)),
        }
        match self.make(&dir, spec, ud) {
            Ok(m) => Ok(m),
            Err(e) => {
                // Leave nothing behind for a create that failed half-way.
                if let Ok(Some(r)) = state::read(&dir) {
                    let _ = self.engine.remove(&r);
                }
                let _ = self.leases().release_all_of(&self.holder(&spec.name));
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    fn adopt(&self, dir: &Path, name: &MachineName) -> Result<Machine> {
        let deadline = Instant::now() + ADOPT_WAIT;
        loop {
            if let Some(r) = state::read(dir)? {
                if r.deleting {
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!("machine {name} is being deleted; create it again when it is gone"),
                    ));
                }
                return self.to_machine(dir, &r);
            }
            if !dir.exists() {
                return Err(Error::transient(format!(
                    "machine {name} vanished while another create made it"
                )));
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "{} exists without a state file for {ADOPT_WAIT:?}: a create crashed half-way; delete the directory",
                        dir.display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn make(&self, dir: &Path, spec: &MachineSpec, ud: Option<&UserData>) -> Result<Machine> {
        let holder = self.holder(&spec.name);
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
        let mut record = MachineRecord {
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
        };
        if let Some(ud) = ud {
            state::write_user_data(dir, ud)?;
        }
        state::write(dir, &record)?;

        let e = self.engine.as_ref();
        let seed = "/var/lib/cloud/seed/nocloud";
        e.write_file(
            dir,
            &format!("{seed}/user-data"),
            ud.map_or(&b""[..], |u| &u.bytes),
            0o600,
        )?;
        let meta = format!(
            "instance-id: {}\nlocal-hostname: {}\n",
            record.instance_id, record.name
        );
        e.write_file(dir, &format!("{seed}/meta-data"), meta.as_bytes(), 0o600)?;
        e.write_file(
            dir,
            "/etc/cloud/cloud.cfg.d/90-provider-local.cfg",
            IMAGE_CLOUD_CFG.as_bytes(),
            0o644,
        )?;
        if let Some(ssh) = &spec.ssh {
            let keys = ssh.authorized_keys.join("\n") + "\n";
            e.write_file(
                dir,
                &format!("{PROVIDER_KEYS_DIR}/{}", ssh.user),
                keys.as_bytes(),
                0o644,
            )?;
        }
        record.boot = Some(e.boot(dir, &record)?);
        state::write(dir, &record)?;
        tracing::info!(machine = %record.name, address = %record.address, "local machine booting");
        self.to_machine(dir, &record)
    }

    fn delete_blocking(&self, name: &MachineName) -> Result<()> {
        let dir = self.machine_dir(name);
        let Some(mut r) = state::read(&dir)? else {
            // A directory without a state file is a create that died before recording
            // anything: nothing runs for it.
            if dir.exists() {
                fs::remove_dir_all(&dir).map_err(|e| errors::io("removing", &dir, e))?;
                self.leases().release_all_of(&self.holder(name))?;
            }
            return Ok(());
        };
        if !r.deleting {
            r.deleting = true;
            state::write(&dir, &r)?;
        }
        self.engine.remove(&r)?;
        self.leases().release(r.address, &self.holder(name))?;
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(errors::io("removing", &dir, e)),
        }
    }

    fn power_blocking(&self, name: &MachineName, op: PowerOp) -> Result<()> {
        let (dir, mut r) = self
            .record(name)?
            .ok_or_else(|| Error::not_found(format!("machine {name} does not exist")))?;
        if r.deleting {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!("machine {name} is being deleted"),
            ));
        }
        if matches!(op, PowerOp::Stop | PowerOp::Reboot) {
            r.powered = false;
            state::write(&dir, &r)?;
            self.engine.halt(&r)?;
        }
        if matches!(op, PowerOp::Start | PowerOp::Reboot) && !self.engine.is_running(&r) {
            self.engine.ensure_network(&self.network())?;
            r.powered = true;
            r.boot = Some(self.engine.boot(&dir, &r)?);
            state::write(&dir, &r)?;
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
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        let spec = spec.clone();
        let ud = user_data.cloned();
        self.blocking(move |p| p.create_blocking(&spec, ud.as_ref()))
            .await
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        let name = self
            .name_of(id)
            .ok_or_else(|| Error::not_found(format!("{self} has no machine {id}")))?;
        self.blocking(move |p| match p.record(&name)? {
            Some((dir, r)) => p.to_machine(&dir, &r),
            None => Err(Error::not_found(format!("machine {name} does not exist"))),
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
        let Some(name) = self.name_of(id) else {
            return Ok(());
        };
        self.blocking(move |p| p.delete_blocking(&name)).await
    }

    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        let name = self
            .name_of(id)
            .ok_or_else(|| Error::not_found(format!("{self} has no machine {id}")))?;
        self.blocking(move |p| match p.record(&name)? {
            Some((dir, r)) => state::read_user_data(&dir, &r),
            None => Err(Error::not_found(format!("machine {name} does not exist"))),
        })
        .await
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        let name = self
            .name_of(id)
            .ok_or_else(|| Error::not_found(format!("{self} has no machine {id}")))?;
        self.blocking(move |p| p.power_blocking(&name, op)).await
    }

    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        let name = self
            .name_of(id)
            .ok_or_else(|| Error::not_found(format!("{self} has no machine {id}")))?;
        self.blocking(move |p| match p.record(&name)? {
            Some((dir, _)) => Ok(Some(
                p.engine
                    .read_file(&dir, OUTPUT_LOG)?
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default(),
            )),
            None => Err(Error::not_found(format!("machine {name} does not exist"))),
        })
        .await
    }
}
