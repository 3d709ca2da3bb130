//! [`VsphereProvider`]: the [`MachineProvisioner`] over vCenter.

use std::collections::HashMap;
use std::fmt;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use machine_core::{
    Capabilities, Error, ErrorKind, Labels, Machine, MachineName, MachineProvisioner, MachineSpec,
    PowerOp, PowerOperations, ProviderId, Result, SizeBasis, UserData, UserDataDelivery,
    UserDataFormat, user_data,
};

use crate::client::{Client, Moref, SessionKey};
use crate::collector::Collector;
use crate::config::{ClonePlan, VsphereConfig};
use crate::guestinfo;
use crate::vm::{
    self, LABELS_KEY, NAME_KEY, OWNER_KEY, SSH_USER_KEY, STARTED_KEY, STOPPED_KEY, Vm, option_value,
};
use crate::xml::Element;

/// The most user data accepted, counted as base64 (what guestinfo holds). vCenter
/// keeps extraConfig values far larger, but every read of the VM's config carries
/// them, so the provider keeps them small.
pub const USER_DATA_LIMIT: usize = 64 * 1024;

/// The longest a long poll waits on the server before asking again.
const LONG_POLL: Duration = Duration::from_secs(30);

/// vCenter VMs cloned from templates, as machines. See the crate documentation.
pub struct VsphereProvider {
    config: VsphereConfig,
    client: Arc<Client>,
    /// The provider's own property collector: its VMs, and what its calls wait for.
    collector: Collector,
    capabilities: Capabilities,
    /// Inventory paths already looked up (templates, folders, pools, datastores,
    /// networks and the watched folder), each once per provider: they are rarely moved,
    /// and a call that names one that was moved or removed fails with
    /// ManagedObjectNotFound, which forgets it (see [`VsphereProvider::forget`]).
    paths: Mutex<HashMap<String, Moref>>,
    /// How a network card joins the network at a path (a distributed port group needs
    /// its switch's UUID and its key), looked up with the path.
    networks: Mutex<HashMap<String, Backing>>,
    /// Templates' devices, read when a clone edits its disk or network card.
    devices: Mutex<HashMap<Moref, Element>>,
}

impl fmt::Display for VsphereProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "vsphere({}, owner {})",
            self.config.sdk_url, self.config.owner
        )
    }
}

impl fmt::Debug for VsphereProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VsphereProvider")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Whether a failed first power-on means the clone will never start as asked: then it
/// is destroyed, so that a refused create leaves no machine. Retryable errors, timeouts
/// and conflicts leave it for the next create.
fn refused(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::InsufficientCapacity
            | ErrorKind::QuotaExceeded
            | ErrorKind::Unauthorized
            | ErrorKind::InvalidSpec
            | ErrorKind::Permanent
    )
}

/// Whether `e` is vCenter's InvalidPowerState (the VM is already, or not yet, there).
fn wrong_power_state(e: &Error) -> bool {
    e.kind() == ErrorKind::Conflict && e.message().contains("InvalidPowerState")
}

/// Locks a cache, whatever a panicking holder left.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl VsphereProvider {
    /// A provider for `config`; makes no call. Providers of one process with the same
    /// URL, user, password, TLS settings and timeouts share one session.
    pub fn new(config: VsphereConfig) -> Result<Self> {
        let client = Client::shared(&SessionKey {
            sdk_url: config.sdk_url.clone(),
            user: config.username.clone(),
            password: config.password.clone(),
            tls: config.tls.clone(),
            connect_timeout: config.connect_timeout,
            call_timeout: config.call_timeout,
            keep_alive: config.keep_alive,
        })?;
        let long_poll = LONG_POLL
            .min(config.call_timeout / 2)
            .max(Duration::from_secs(1));
        let collector = Collector::new(client.clone(), long_poll);
        let capabilities = Capabilities::default()
            .with_user_data(
                UserDataDelivery::new(
                    USER_DATA_LIMIT,
                    SizeBasis::Base64,
                    // cloud-init's VMware datasource hands guestinfo.userdata to
                    // cloud-init, which reads these; Ignition reads other keys.
                    UserDataFormat::CLOUD_INIT.to_vec(),
                )
                .with_gzip(true),
            )
            // Stop and reboot ask the guest (VMware Tools) first, then force.
            .with_power(PowerOperations::all().with_graceful(true))
            .with_withdrawn_user_data(true);
        Ok(VsphereProvider {
            config,
            client,
            collector,
            capabilities,
            paths: Mutex::new(HashMap::new()),
            networks: Mutex::new(HashMap::new()),
            devices: Mutex::new(HashMap::new()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &VsphereConfig {
        &self.config
    }

    /// Ends the session this provider shares with the others of the process that use
    /// the same login (a later call of any of them logs in again). Dropping the last
    /// provider of a session logs it out too.
    pub async fn logout(&self) -> Result<()> {
        self.client.logout().await
    }

    /// Removes `guestinfo.userdata` (and its encoding) from the machine: the body of
    /// [`MachineProvisioner::bootstrap_finished`]. Meta-data stays: cloud-init needs its
    /// instance id at every boot. A machine whose data is already gone is left alone.
    ///
    /// The keys are set to "", which is how vim25 removes an extraConfig key. The raw
    /// property is then read back: a server that keeps the old value beside the empty
    /// one (vcsim before 0.31 appends every entry) still shows the secrets to everyone
    /// who may read the VM's configuration, so that is an error, and a permanent one:
    /// asking again does not remove it. Its message never shows the value.
    async fn scrub_user_data(&self, id: &ProviderId) -> Result<()> {
        let vm = self.owned(id).await?;
        let now = self.read_extra(&vm.moref, id).await?;
        if !now.holds(guestinfo::USERDATA) && !now.holds(guestinfo::USERDATA_ENCODING) {
            return Ok(());
        }
        let spec = format!(
            "<spec xsi:type=\"VirtualMachineConfigSpec\">{}{}</spec>",
            option_value(guestinfo::USERDATA, ""),
            option_value(guestinfo::USERDATA_ENCODING, "")
        );
        self.reconfigure(&vm.moref, &spec).await?;
        let after = self.read_extra(&vm.moref, id).await?;
        if after.holds(guestinfo::USERDATA) {
            return Err(Error::permanent(format!(
                "{self}: {} is still in the extraConfig of {id} after it was set to \"\" \
                 (this server keeps extraConfig values it is asked to remove, as vcsim \
                 before 0.31 does): the user data stays readable to everyone who may read \
                 the VM's configuration",
                guestinfo::USERDATA
            )));
        }
        Ok(())
    }

    /// The VM's extraConfig as the server has it now (read, not from the mirror): what
    /// anyone who may read the VM sees.
    async fn read_extra(&self, vm: &Moref, id: &ProviderId) -> Result<Vm> {
        self.client
            .properties(vm, &["config.extraConfig"])
            .await?
            .map(|o| Vm::from_content(&o))
            .ok_or_else(|| Error::not_found(format!("{self}: no machine {id}")))
    }

    /// The cached object of inventory path `path`, if it was looked up before.
    fn cached(&self, path: &str) -> Option<Moref> {
        lock(&self.paths).get(path).cloned()
    }

    /// Forgets the objects of these inventory paths (and what was read of them): a call
    /// naming one of them was answered ManagedObjectNotFound (moved, removed, or made
    /// again under the path).
    fn forget<'a>(&self, paths: impl IntoIterator<Item = &'a str>) {
        let mut cache = lock(&self.paths);
        let mut networks = lock(&self.networks);
        for p in paths {
            if let Some(m) = cache.remove(p) {
                lock(&self.devices).remove(&m);
            }
            networks.remove(p);
        }
    }

    /// The object at an inventory path, looked up once; `None` when there is none.
    async fn lookup(&self, path: &str) -> Result<Option<Moref>> {
        if let Some(m) = self.cached(path) {
            return Ok(Some(m));
        }
        let found = self.client.find_by_inventory_path(path).await?;
        if let Some(m) = &found {
            lock(&self.paths).insert(path.to_owned(), m.clone());
        }
        Ok(found)
    }

    /// The folder watched for this provider's machines, looked up once and handed to
    /// the collector.
    async fn watch_folder(&self) -> Result<()> {
        let path = self.config.folder();
        let root = match self.lookup(&path).await? {
            Some(m) if m.kind == "Folder" => m,
            found => {
                let what = match found {
                    Some(m) => format!("{path} is a {}, not a folder", m.kind),
                    None => format!("nothing at inventory path {path}"),
                };
                return Err(match self.config.defaults.folder {
                    Some(_) => Error::invalid_spec("defaults.folder", what),
                    None => Error::invalid_spec(
                        "datacenter",
                        format!("no datacenter {:?} ({what})", self.config.datacenter),
                    ),
                });
            }
        };
        self.collector.watch(&root);
        Ok(())
    }

    /// Makes the mirror as current as the server (see [`Collector::barrier`]). A
    /// watched folder the server no longer knows is looked up again, once.
    async fn fresh(&self) -> Result<()> {
        self.watch_folder().await?;
        match self.collector.barrier().await {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.forget([self.config.folder().as_str()]);
                self.watch_folder().await?;
                self.collector.barrier().await.map_err(|e| {
                    if e.kind() == ErrorKind::NotFound {
                        Error::transient(e.message().to_owned())
                    } else {
                        e
                    }
                })
            }
            other => other,
        }
    }

    /// This owner's VMs named `name` in the mirror, oldest (lowest managed object id)
    /// first: the first is the machine, any other a duplicate.
    fn named(&self, name: &MachineName) -> Vec<Vm> {
        let owner = &self.config.owner;
        oldest_first(
            self.collector
                .vms(|v| v.owned_by(owner) && v.machine_name() == Some(name.as_str())),
        )
    }

    /// The VM with this provider ID, when it is in the watched folder: from the
    /// mirror, which is made current first when it does not know it.
    async fn known(&self, id: &ProviderId) -> Result<Option<Vm>> {
        let uuid = vm::uuid_of(id)?;
        if let Some(vm) = self.collector.by_uuid(uuid) {
            return Ok(Some(vm));
        }
        self.fresh().await?;
        Ok(self.collector.by_uuid(uuid))
    }

    /// The VM with this provider ID when this owner made it; NotFound otherwise.
    async fn owned(&self, id: &ProviderId) -> Result<Vm> {
        match self.known(id).await? {
            Some(vm) if vm.owned_by(&self.config.owner) => Ok(vm),
            _ => Err(Error::not_found(format!("{self}: no machine {id}"))),
        }
    }

    /// An inventory path's object (looked up once), or an invalid spec naming `field`.
    async fn resolve(&self, path: &str, field: &str, kinds: &[&str]) -> Result<Moref> {
        match self.lookup(path).await? {
            Some(m) if kinds.contains(&m.kind.as_str()) => Ok(m),
            Some(m) => Err(Error::invalid_spec(
                field,
                format!("{path} is a {}, not a {}", m.kind, kinds[0]),
            )),
            None => Err(Error::invalid_spec(
                field,
                format!("nothing at inventory path {path}"),
            )),
        }
    }

    /// The objects a clone names, from the plan's inventory paths.
    async fn placement(&self, plan: &ClonePlan) -> Result<Placement> {
        let (template_path, template_field) = &plan.template;
        let template = self
            .resolve(template_path, template_field, &["VirtualMachine"])
            .await?;
        let folder = self
            .resolve(&plan.folder, "provider.folder", &["Folder"])
            .await?;
        let pool = self
            .resolve(
                &plan.resource_pool,
                "provider.resourcePool",
                &["ResourcePool", "VirtualApp"],
            )
            .await?;
        let datastore = match &plan.datastore {
            Some(ds) => Some(
                self.resolve(ds, "provider.datastore", &["Datastore"])
                    .await?,
            ),
            None => None,
        };
        let network = match &plan.network {
            Some(path) => Some(self.backing(path).await?),
            None => None,
        };
        let devices = if plan.disk_gib.is_some() || network.is_some() {
            Some(self.template_devices(&template).await?)
        } else {
            None
        };
        Ok(Placement {
            template,
            folder,
            pool,
            datastore,
            network,
            devices,
        })
    }

    /// How a network card joins the network at `path`: a standard port group by its
    /// object, a distributed one by its switch's UUID and its key (read once).
    async fn backing(&self, path: &str) -> Result<Backing> {
        if let Some(b) = lock(&self.networks).get(path) {
            return Ok(b.clone());
        }
        let field = "provider.network";
        let net = self
            .resolve(
                path,
                field,
                &[
                    "Network",
                    "DistributedVirtualPortgroup",
                    "DistributedVirtualSwitch",
                    "VmwareDistributedVirtualSwitch",
                    "OpaqueNetwork",
                ],
            )
            .await?;
        let name = path.rsplit('/').next().unwrap_or(path).to_owned();
        let backing = match net.kind.as_str() {
            "Network" => Backing::Standard { network: net, name },
            "DistributedVirtualPortgroup" => {
                let pg = self
                    .client
                    .properties(&net, &["key", "config.distributedVirtualSwitch"])
                    .await?
                    .ok_or_else(|| Error::not_found(format!("{path} vanished")))?;
                let key = pg.text("key").unwrap_or("").trim().to_owned();
                let switch = pg
                    .prop("config.distributedVirtualSwitch")
                    .and_then(Moref::from_element)
                    .ok_or_else(|| {
                        Error::invalid_spec(field, format!("{path} belongs to no switch"))
                    })?;
                let uuid = self
                    .client
                    .properties(&switch, &["uuid"])
                    .await?
                    .and_then(|o| o.text("uuid").map(|u| u.trim().to_owned()))
                    .filter(|u| !u.is_empty())
                    .ok_or_else(|| {
                        Error::invalid_spec(field, format!("the switch of {path} has no UUID"))
                    })?;
                if key.is_empty() {
                    return Err(Error::invalid_spec(field, format!("{path} has no key")));
                }
                Backing::Distributed {
                    switch_uuid: uuid,
                    portgroup_key: key,
                }
            }
            "OpaqueNetwork" => {
                return Err(Error::invalid_spec(
                    field,
                    format!("{path} is an NSX opaque network, which this provider does not join"),
                ));
            }
            kind => {
                return Err(Error::invalid_spec(
                    field,
                    format!("{path} is a {kind}: name one of its port groups"),
                ));
            }
        };
        lock(&self.networks).insert(path.to_owned(), backing.clone());
        Ok(backing)
    }

    /// The template's devices, read once.
    async fn template_devices(&self, template: &Moref) -> Result<Element> {
        if let Some(d) = lock(&self.devices).get(template) {
            return Ok(d.clone());
        }
        let devices = self
            .client
            .properties(template, &["config.hardware.device"])
            .await?
            .and_then(|o| o.prop("config.hardware.device").cloned())
            .unwrap_or_default();
        lock(&self.devices).insert(template.clone(), devices.clone());
        Ok(devices)
    }

    /// Every inventory path of the plan, to forget them when a call naming them was
    /// answered ManagedObjectNotFound.
    fn plan_paths(plan: &ClonePlan) -> Vec<&str> {
        let mut paths = vec![
            plan.template.0.as_str(),
            plan.folder.as_str(),
            plan.resource_pool.as_str(),
        ];
        paths.extend(plan.datastore.as_deref());
        paths.extend(plan.network.as_deref());
        paths
    }

    /// Calls a method that returns a task on `vm`, and waits for the task through the
    /// collector.
    async fn task(&self, method: &str, body: &str) -> Result<Option<Element>> {
        let task = self.client.start_task(method, body).await?;
        self.collector
            .wait_task(method, &task, self.config.task_timeout)
            .await
    }

    async fn reconfigure(&self, vm: &Moref, spec: &str) -> Result<()> {
        self.task("ReconfigVM_Task", &format!("{}{spec}", vm.xml("_this")))
            .await
            .map(drop)
    }

    /// A power task; InvalidPowerState (already there) counts as done.
    async fn power_task(&self, method: &str, vm: &Moref) -> Result<()> {
        match self.task(method, &vm.xml("_this")).await {
            Err(e) if wrong_power_state(&e) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Asks the guest to shut down (VMware Tools' ShutdownGuest), waits up to the
    /// soft-stop timeout for the VM to be off (pushed by the collector), then powers it
    /// off. `known` is the power state the mirror has, when the caller has it.
    async fn stop_vm(&self, vm: &Moref, known: Option<&str>) -> Result<()> {
        if known == Some("poweredOff") {
            return Ok(());
        }
        match self.client.call("ShutdownGuest", &vm.xml("_this")).await {
            Ok(_) => {
                let off = self
                    .collector
                    .wait_vm(vm, self.config.soft_stop_timeout, |v| {
                        v.is_none_or(|v| v.power != "poweredOn")
                    })
                    .await?;
                if off {
                    return Ok(());
                }
                tracing::info!(vm = %vm, "the guest did not shut down in time; powering off");
            }
            // Off already (or suspended: powered off below).
            Err(e) if wrong_power_state(&e) && known != Some("suspended") => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(e),
            // No VMware Tools in the guest, or a server without the call: hard.
            Err(e) => tracing::debug!(vm = %vm, error = %e, "no guest shutdown; powering off"),
        }
        self.power_task("PowerOffVM_Task", vm).await
    }

    /// Asks the guest to restart (VMware Tools' RebootGuest) and waits up to the
    /// soft-stop timeout for it to go down (its guest state, `running` while VMware
    /// Tools run, changes), else resets the VM.
    async fn reboot_vm(&self, vm: &Moref) -> Result<()> {
        let before = self
            .collector
            .vm(vm)
            .map(|v| (v.power, v.guest_state))
            .unwrap_or_default();
        match self.client.call("RebootGuest", &vm.xml("_this")).await {
            Ok(_) => {
                let restarting = self
                    .collector
                    .wait_vm(vm, self.config.soft_stop_timeout, |v| {
                        v.is_none_or(|v| (&v.power, &v.guest_state) != (&before.0, &before.1))
                    })
                    .await?;
                if restarting {
                    return Ok(());
                }
                tracing::info!(vm = %vm, "the guest did not restart in time; resetting");
            }
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(e),
            Err(e) => tracing::debug!(vm = %vm, error = %e, "no guest restart; resetting"),
        }
        self.power_task("ResetVM_Task", vm).await
    }

    /// Powers off (soft, then hard) and destroys; gone is success. `known` is the power
    /// state the mirror has, when the caller has it: if it was behind (Destroy_Task
    /// answers InvalidPowerState), the VM is powered off and destroyed again.
    async fn destroy(&self, vm: &Moref, known: Option<&str>) -> Result<()> {
        let gone = |e: &Error| e.kind() == ErrorKind::NotFound;
        match self.stop_vm(vm, known).await {
            Err(e) if gone(&e) => return Ok(()),
            other => other?,
        }
        match self.task("Destroy_Task", &vm.xml("_this")).await {
            Err(e) if gone(&e) => Ok(()),
            Err(e) if wrong_power_state(&e) => {
                match self.power_task("PowerOffVM_Task", vm).await {
                    Err(e) if gone(&e) => return Ok(()),
                    other => other?,
                }
                match self.task("Destroy_Task", &vm.xml("_this")).await {
                    Err(e) if gone(&e) => Ok(()),
                    other => other.map(drop),
                }
            }
            other => other.map(drop),
        }
    }

    /// Powers on a clone that was never started. A refusal (no capacity, no permission,
    /// a spec it cannot take) destroys the clone, so that the refused create leaves no
    /// machine; other errors leave it for the next create to finish.
    async fn start_clone(&self, vm: &Moref) -> Result<()> {
        if let Err(e) = self.power_task("PowerOnVM_Task", vm).await {
            if refused(e.kind()) {
                tracing::info!(vm = %vm, error = %e, "the clone cannot start as asked; destroying it");
                if let Err(cleanup) = self.destroy(vm, Some("poweredOff")).await {
                    tracing::warn!(error = %cleanup, "destroying a clone that could not start");
                }
            }
            return Err(e);
        }
        Ok(())
    }

    /// Returns the machine of `existing`, this owner's VM of the spec's name; a clone a
    /// create left before power-on (a crash, a cancel, a lost answer) is started first.
    async fn adopt(&self, existing: Vm, name: &MachineName) -> Result<Machine> {
        if existing.power == "poweredOff" && !existing.stopped_on_purpose() {
            match self.start_clone(&existing.moref).await {
                // Its own creator powered it on meanwhile.
                Err(e) if e.kind() == ErrorKind::Conflict => {}
                other => other?,
            }
            return self.machine_of(&existing.moref, name).await;
        }
        existing
            .machine()
            .ok_or_else(|| Error::transient(format!("{self}: {name} has no BIOS UUID yet")))
    }

    /// The machine of the VM `vm`, from the mirror (current with the tasks this
    /// provider just waited for); made current once when it does not know it.
    async fn machine_of(&self, vm: &Moref, name: &MachineName) -> Result<Machine> {
        if let Some(m) = self.collector.vm(vm).and_then(|v| v.machine()) {
            return Ok(m);
        }
        self.fresh().await?;
        self.collector
            .vm(vm)
            .and_then(|v| v.machine())
            .ok_or_else(|| {
                Error::transient(format!("{self}: {name} vanished or has no BIOS UUID yet"))
            })
    }

    /// Clones the template for `spec`; the new VM. An object of the placement that
    /// the server no longer knows (ManagedObjectNotFound: moved or removed since it was
    /// looked up) is looked up again, once.
    async fn clone_vm(
        &self,
        plan: &ClonePlan,
        spec: &MachineSpec,
        user_data: Option<&UserData>,
    ) -> Result<Moref> {
        let place = self.placement(plan).await?;
        let body = self.clone_body(&place, plan, spec, user_data)?;
        let result = match self.task("CloneVM_Task", &body).await {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.forget(Self::plan_paths(plan));
                let place = self.placement(plan).await?;
                let body = self.clone_body(&place, plan, spec, user_data)?;
                self.task("CloneVM_Task", &body).await?
            }
            other => other?,
        };
        result
            .as_ref()
            .and_then(Moref::from_element)
            .ok_or_else(|| Error::transient("CloneVM_Task: no VM in the task's result"))
    }

    /// The clone spec: where, how big (CPUs, memory, disk and network card: vCenter
    /// applies them in the clone), and the tags and guestinfo in extraConfig (so a VM
    /// is never visible without its owner and name).
    fn clone_body(
        &self,
        place: &Placement,
        plan: &ClonePlan,
        spec: &MachineSpec,
        user_data: Option<&UserData>,
    ) -> Result<String> {
        let labels = serde_json::to_string(&spec.labels)
            .map_err(|e| Error::invalid_spec("labels", e.to_string()))?;
        // A BIOS UUID of its own, the provider ID: vCenter would make one, but vcsim
        // derives it from the VM's file path, which a VM made again under a deleted
        // one's name shares.
        let mut config = format!("<uuid>{}</uuid>", random_uuid());
        if let Some(cpus) = plan.num_cpus {
            let _ = write!(config, "<numCPUs>{cpus}</numCPUs>");
        }
        if let Some(mem) = plan.memory_mib {
            let _ = write!(config, "<memoryMB>{mem}</memoryMB>");
        }
        if let (Some(gib), Some(devices)) = (plan.disk_gib, &place.devices) {
            config.push_str(&disk_edit(devices, gib)?);
        }
        if let (Some(backing), Some(devices)) = (&place.network, &place.devices) {
            config.push_str(&nic_edit(devices, backing)?);
        }
        config.push_str(&option_value(OWNER_KEY, &self.config.owner));
        config.push_str(&option_value(NAME_KEY, spec.name.as_str()));
        config.push_str(&option_value(LABELS_KEY, &labels));
        if let Some(user) = &plan.ssh_user {
            config.push_str(&option_value(SSH_USER_KEY, user));
        }
        let (meta, meta_enc) = guestinfo::encode(
            guestinfo::metadata(&spec.name, &format!("{:08x}", fastrand_u32())).as_bytes(),
        );
        config.push_str(&option_value(guestinfo::METADATA, &meta));
        config.push_str(&option_value(guestinfo::METADATA_ENCODING, meta_enc));
        if let Some(ud) = user_data {
            let (value, enc) = guestinfo::encode_user_data(ud);
            config.push_str(&option_value(guestinfo::USERDATA, &value));
            config.push_str(&option_value(guestinfo::USERDATA_ENCODING, enc));
        }
        let mut location = String::new();
        if let Some(ds) = &place.datastore {
            location.push_str(&ds.xml("datastore"));
        }
        location.push_str(&place.pool.xml("pool"));
        Ok(format!(
            "{}{}<name>{}</name><spec><location>{location}</location><template>false</template>\
             <config>{config}</config><powerOn>false</powerOn></spec>",
            place.template.xml("_this"),
            place.folder.xml("folder"),
            crate::xml::escape(spec.name.as_str()),
        ))
    }
}

/// How a network card joins a network.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Backing {
    /// A standard port group: its object and name.
    Standard { network: Moref, name: String },
    /// A distributed port group: its switch's UUID and its key.
    Distributed {
        switch_uuid: String,
        portgroup_key: String,
    },
}

/// VMs sorted oldest (lowest managed object id, which vCenter hands out in increasing
/// order) first.
fn oldest_first(mut vms: Vec<Vm>) -> Vec<Vm> {
    vms.sort_by_key(|v| (v.moref.serial(), v.moref.value.clone()));
    vms
}

/// A deviceChange growing the first disk to `gib`.
fn disk_edit(devices: &Element, gib: u64) -> Result<String> {
    let mut disk = devices
        .children
        .iter()
        .find(|d| d.xsi_type() == Some("VirtualDisk"))
        .cloned()
        .ok_or_else(|| Error::invalid_spec("provider.diskGiB", "the template has no disk"))?;
    let kib = gib * 1024 * 1024;
    let current: u64 = disk
        .child_text("capacityInKB")
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    if kib < current {
        return Err(Error::invalid_spec(
            "provider.diskGiB",
            format!(
                "{gib} GiB is smaller than the template's disk ({} GiB): disks only grow",
                current.div_ceil(1024 * 1024)
            ),
        ));
    }
    for c in &mut disk.children {
        match c.name.as_str() {
            "capacityInKB" => c.text = kib.to_string(),
            "capacityInBytes" => c.text = (kib * 1024).to_string(),
            _ => {}
        }
    }
    Ok(format!(
        "<deviceChange><operation>edit</operation>{}</deviceChange>",
        disk.to_xml("device")
    ))
}

/// A deviceChange putting the first network card on `backing`'s network.
fn nic_edit(devices: &Element, backing: &Backing) -> Result<String> {
    let mut nic = devices
        .children
        .iter()
        .find(|d| d.child("macAddress").is_some() || d.child("addressType").is_some())
        .cloned()
        .ok_or_else(|| {
            Error::invalid_spec("provider.network", "the template has no network card")
        })?;
    let backing = match backing {
        Backing::Standard { network, name } => format!(
            "<backing xsi:type=\"VirtualEthernetCardNetworkBackingInfo\"><deviceName>{}</deviceName>{}</backing>",
            crate::xml::escape(name),
            network.xml("network")
        ),
        Backing::Distributed {
            switch_uuid,
            portgroup_key,
        } => format!(
            "<backing xsi:type=\"VirtualEthernetCardDistributedVirtualPortBackingInfo\"><port><switchUuid>{}</switchUuid><portgroupKey>{}</portgroupKey></port></backing>",
            crate::xml::escape(switch_uuid),
            crate::xml::escape(portgroup_key)
        ),
    };
    let mut xml = String::new();
    for c in &nic.children {
        if c.name == "backing" {
            xml.push_str(&backing);
        } else {
            xml.push_str(&c.to_xml(&c.name));
        }
    }
    nic.children.clear();
    let ty = nic.xsi_type().unwrap_or("VirtualEthernetCard").to_owned();
    Ok(format!(
        "<deviceChange><operation>edit</operation><device xsi:type=\"{}\">{xml}</device></deviceChange>",
        crate::xml::escape(&ty)
    ))
}

/// The objects a clone names, resolved from their inventory paths.
struct Placement {
    template: Moref,
    folder: Moref,
    pool: Moref,
    datastore: Option<Moref>,
    network: Option<Backing>,
    /// The template's devices, when the clone edits its disk or network card.
    devices: Option<Element>,
}

/// 64 random bits, without a dependency: the hasher's random keys (new for every
/// `RandomState`) over the time.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// A random number for the instance id (so a recreated machine is a new instance to
/// cloud-init).
fn fastrand_u32() -> u32 {
    random_u64() as u32
}

/// A random (version 4) UUID, as vCenter writes BIOS UUIDs.
fn random_uuid() -> String {
    let (hi, lo) = (random_u64(), random_u64());
    let hi = (hi & !0xf000) | 0x4000;
    let lo = (lo & !(0xc << 60)) | (0x8 << 60);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

#[async_trait]
impl MachineProvisioner for VsphereProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Adopts the owner's VM of that name if there is one; otherwise clones, then
    /// settles a race: the oldest of the owner's VMs of that name (lowest managed
    /// object id, which vCenter hands out in increasing order) is the machine, and a
    /// creator whose clone is not the oldest destroys its clone (still powered off) and
    /// adopts the oldest. Only then is the machine powered on. vCenter itself refuses
    /// a second VM of one name in a folder (DuplicateName): then the name's VM is
    /// adopted.
    ///
    /// The lookup before the clone reads the mirror as it is (the composer's `find`
    /// just made it current, and a create racing another is settled after the clone
    /// anyway), and makes it current only to adopt: a VM the mirror missed is found by
    /// vCenter's refusal or by the settlement, a VM it still holds may be gone.
    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        spec.validate()?;
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        let plan = self.config.plan(spec)?;
        self.watch_folder().await?;
        if !self.collector.mirrored() || !self.named(&spec.name).is_empty() {
            self.fresh().await?;
            if let Some(existing) = self.named(&spec.name).into_iter().next() {
                return self.adopt(existing, &spec.name).await;
            }
        }
        let mine = match self.clone_vm(&plan, spec, user_data).await {
            Err(e) if e.kind() == ErrorKind::Conflict && e.message().contains("DuplicateName") => {
                self.fresh().await?;
                return match self.named(&spec.name).into_iter().next() {
                    Some(existing) => self.adopt(existing, &spec.name).await,
                    // A VM of another owner, or none of this owner's yet: not ours.
                    None => Err(e),
                };
            }
            other => other?,
        };
        // The settlement. The mirror is as current as the clone's end (its task's
        // outcome came with the updates before it), so it holds every clone of the name
        // that ended before this one; one that ends later sees this one and gives way.
        let mut same = self.named(&spec.name);
        if !same.iter().any(|v| v.moref == mine) {
            self.fresh().await?;
            same = self.named(&spec.name);
            if !same.iter().any(|v| v.moref == mine) {
                return Err(Error::transient(format!(
                    "{self}: the clone of {} vanished",
                    spec.name
                )));
            }
        }
        if let Some(winner) = same.into_iter().next().filter(|v| v.moref != mine) {
            tracing::info!(name = %spec.name, "the name has an older VM; destroying this clone");
            self.destroy(&mine, Some("poweredOff")).await?;
            // A racing create's, which its creator starts, or one a crashed create
            // left unstarted: started here too (a second power-on is refused harmlessly).
            return self.adopt(winner, &spec.name).await;
        }
        self.start_clone(&mine).await?;
        self.machine_of(&mine, &spec.name).await
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        vm::uuid_of(id)?;
        self.fresh().await?;
        self.owned(id)
            .await?
            .machine()
            .ok_or_else(|| Error::not_found(format!("{self}: no machine {id}")))
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        self.fresh().await?;
        Ok(self.named(name).first().and_then(Vm::machine))
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        self.fresh().await?;
        let owner = &self.config.owner;
        let vms = oldest_first(self.collector.vms(|v| v.owned_by(owner)));
        let mut out: Vec<Machine> = Vec::new();
        for m in vms.iter().filter_map(Vm::machine) {
            let selected = selector.iter().all(|(k, v)| m.labels.get(k) == Some(v));
            // The oldest VM of a name is the machine; a younger one is a duplicate
            // its creator is about to destroy.
            if selected && !out.iter().any(|o| o.name == m.name) {
                out.push(m);
            }
        }
        out.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        Ok(out)
    }

    async fn delete(&self, id: &ProviderId) -> Result<()> {
        let Some(vm) = self.known(id).await? else {
            return Ok(());
        };
        if vm.template || !vm.owned_by(&self.config.owner) {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!("{self}: {id} is not a machine of this owner; not deleting it"),
            ));
        }
        self.destroy(&vm.moref, Some(&vm.power)).await
    }

    /// The user data in `guestinfo.userdata`, read from the VM; `None` once
    /// [`MachineProvisioner::bootstrap_finished`] removed it.
    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        let vm = self.owned(id).await?;
        let vm = self.read_extra(&vm.moref, id).await?;
        let Some(value) = vm.extra(guestinfo::USERDATA).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let encoding = vm.extra(guestinfo::USERDATA_ENCODING).unwrap_or("");
        Ok(Some(UserData::sniff(guestinfo::decode(value, encoding)?)))
    }

    /// Start powers on (taking away the stopped mark first); stop marks the machine
    /// stopped on purpose, asks the guest to shut down (VMware Tools), and powers it off
    /// after the soft-stop timeout; reboot asks the guest to restart and resets the VM
    /// after that timeout. The mark is what keeps a later create from powering a
    /// stopped machine on as one a crashed create left (see [`STOPPED_KEY`]).
    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        self.fresh().await?;
        let vm = self.owned(id).await?;
        match op {
            PowerOp::Start => {
                if vm.stopped_on_purpose() {
                    let mut clear = option_value(STOPPED_KEY, "");
                    if vm.extra(STARTED_KEY).is_some() {
                        clear.push_str(&option_value(STARTED_KEY, ""));
                    }
                    self.reconfigure(
                        &vm.moref,
                        &format!("<spec xsi:type=\"VirtualMachineConfigSpec\">{clear}</spec>"),
                    )
                    .await?;
                }
                self.power_task("PowerOnVM_Task", &vm.moref).await
            }
            PowerOp::Stop => {
                if vm.extra(STOPPED_KEY).is_none_or(str::is_empty) {
                    self.reconfigure(
                        &vm.moref,
                        &format!(
                            "<spec xsi:type=\"VirtualMachineConfigSpec\">{}</spec>",
                            option_value(STOPPED_KEY, "true")
                        ),
                    )
                    .await?;
                }
                self.stop_vm(&vm.moref, Some(&vm.power)).await
            }
            PowerOp::Reboot => self.reboot_vm(&vm.moref).await,
            _ => Err(machine_core::unsupported_power_op(self, op)),
        }
    }

    async fn console_output(&self, _id: &ProviderId) -> Result<Option<String>> {
        Err(Error::permanent(format!(
            "{self} does not read console output (vSphere has no serial console API)"
        )))
    }

    /// Removes the user data (see [`VsphereProvider`]'s scrub): once cloud-init has
    /// read it, the secrets it may hold must not stay readable to everyone with read
    /// access on the VM (Cluster API vSphere issue #582). The composer calls this
    /// before it reports the machine Ready. An error when the server kept the value.
    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        self.scrub_user_data(&machine.provider_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices() -> Element {
        crate::xml::parse(
            br#"<val xmlns="urn:vim25" xmlns:x="http://www.w3.org/2001/XMLSchema-instance"><VirtualDevice x:type="VirtualDisk"><key>2000</key><capacityInKB>2097152</capacityInKB><capacityInBytes>2147483648</capacityInBytes></VirtualDevice><VirtualDevice x:type="VirtualE1000"><key>4000</key><backing x:type="VirtualEthernetCardNetworkBackingInfo"><deviceName>old</deviceName></backing><addressType>generated</addressType><macAddress>00:50:56:00:00:01</macAddress></VirtualDevice></val>"#,
        )
        .unwrap()
    }

    #[test]
    fn uuids_are_random_version_4() {
        let a = random_uuid();
        assert_eq!(a.len(), 36, "{a}");
        assert_eq!(&a[14..15], "4", "{a}");
        assert!("89ab".contains(&a[19..20]), "{a}");
        assert!(vm::provider_id(&a).is_some());
        assert_ne!(a, random_uuid());
    }

    #[test]
    fn disks_grow_and_never_shrink() {
        let edit = disk_edit(&devices(), 4).unwrap();
        assert!(
            edit.contains("<capacityInKB>4194304</capacityInKB>"),
            "{edit}"
        );
        assert!(
            edit.contains("<capacityInBytes>4294967296</capacityInBytes>"),
            "{edit}"
        );
        assert!(edit.contains("xsi:type=\"VirtualDisk\""), "{edit}");
        let e = disk_edit(&devices(), 1).unwrap_err();
        assert_eq!(e.field(), Some("provider.diskGiB"));
    }

    #[test]
    fn the_first_nic_moves_to_a_standard_port_group() {
        let edit = nic_edit(
            &devices(),
            &Backing::Standard {
                network: Moref::new("Network", "network-7"),
                name: "VM Network".into(),
            },
        )
        .unwrap();
        assert!(
            edit.contains("<device xsi:type=\"VirtualE1000\"><key>4000</key>"),
            "{edit}"
        );
        assert!(
            edit.contains(
                "<deviceName>VM Network</deviceName><network type=\"Network\">network-7</network>"
            ),
            "{edit}"
        );
        assert!(!edit.contains("old"), "{edit}");
        assert!(
            edit.contains("<macAddress>00:50:56:00:00:01</macAddress>"),
            "{edit}"
        );
    }

    #[test]
    fn the_first_nic_moves_to_a_distributed_port_group() {
        let edit = nic_edit(
            &devices(),
            &Backing::Distributed {
                switch_uuid: "50 2b 8e".into(),
                portgroup_key: "dvportgroup-11".into(),
            },
        )
        .unwrap();
        assert!(
            edit.contains(
                "<backing xsi:type=\"VirtualEthernetCardDistributedVirtualPortBackingInfo\"><port><switchUuid>50 2b 8e</switchUuid><portgroupKey>dvportgroup-11</portgroupKey></port></backing>"
            ),
            "{edit}"
        );
        assert!(!edit.contains("deviceName"), "{edit}");
    }
}
