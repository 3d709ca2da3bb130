//! [`VsphereProvider`]: the [`MachineProvisioner`] over vCenter.

use std::collections::HashMap;
use std::fmt;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use machine_core::{
    Capabilities, Error, ErrorKind, Labels, Machine, MachineName, MachineProvisioner, MachineSpec,
    PowerOp, PowerOperations, ProviderId, Result, SizeBasis, UserData, UserDataDelivery,
    UserDataFormat, user_data,
};

use crate::client::{Client, Moref, ObjectContent, http_client};
use crate::config::{ClonePlan, VsphereConfig};
use crate::guestinfo;
use crate::vm::{
    self, LABELS_KEY, NAME_KEY, OWNER_KEY, PATHS, SSH_USER_KEY, STARTED_KEY, Vm, option_value,
};

/// The most user data accepted, counted as base64 (what guestinfo holds). vCenter
/// keeps extraConfig values far larger, but every read of the VM's config carries
/// them, so the provider keeps them small.
pub const USER_DATA_LIMIT: usize = 64 * 1024;

/// vCenter VMs cloned from templates, as machines. See the crate documentation.
pub struct VsphereProvider {
    config: VsphereConfig,
    client: Client,
    capabilities: Capabilities,
    /// Inventory paths already looked up (templates, folders, pools, datastores,
    /// networks and the datacenter's `vm` folder), each once per provider: they are
    /// rarely moved, and a call that names one that was moved or removed fails with
    /// ManagedObjectNotFound, which forgets it (see [`VsphereProvider::forget`]).
    paths: Mutex<HashMap<String, Moref>>,
    /// VMs' managed object ids by BIOS UUID (the provider ID), as found before: a VM
    /// keeps its id for life, so a `get` is one call instead of FindByUuid and one.
    vms: Mutex<HashMap<String, Moref>>,
}

/// How many VM ids the provider remembers at most.
const KNOWN_VMS: usize = 8192;

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

/// Whether a failed first power-on (or the hardware edit before it) means the clone
/// will never start as asked: then it is destroyed, so that a refused create leaves no
/// machine. Retryable errors, timeouts and conflicts leave it for the next create.
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

impl VsphereProvider {
    /// A provider for `config`; builds the HTTP client, makes no call.
    pub fn new(config: VsphereConfig) -> Result<Self> {
        let http = http_client(&config.tls, config.connect_timeout, config.call_timeout)?;
        let client = Client::new(
            http,
            config.sdk_url.clone(),
            config.username.clone(),
            config.password.clone(),
            config.task_timeout,
        );
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
            .with_power(PowerOperations::all())
            .with_withdrawn_user_data(true);
        Ok(VsphereProvider {
            config,
            client,
            capabilities,
            paths: Mutex::new(HashMap::new()),
            vms: Mutex::new(HashMap::new()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &VsphereConfig {
        &self.config
    }

    /// Ends the session (a later call logs in again).
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
        if !vm.holds(guestinfo::USERDATA) && !vm.holds(guestinfo::USERDATA_ENCODING) {
            return Ok(());
        }
        let spec = format!(
            "<spec xsi:type=\"VirtualMachineConfigSpec\">{}{}</spec>",
            option_value(guestinfo::USERDATA, ""),
            option_value(guestinfo::USERDATA_ENCODING, "")
        );
        self.reconfigure(&vm.moref, &spec).await?;
        let after = self
            .client
            .properties(&vm.moref, PATHS)
            .await?
            .map(|o| Vm::from_content(&o))
            .ok_or_else(|| Error::not_found(format!("{self}: no machine {id}")))?;
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

    /// The cached object of inventory path `path`, if it was looked up before.
    fn cached(&self, path: &str) -> Option<Moref> {
        self.paths
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(path)
            .cloned()
    }

    /// Forgets the objects of these inventory paths: a call naming one of them was
    /// answered ManagedObjectNotFound (moved, removed, or made again under the path).
    fn forget<'a>(&self, paths: impl IntoIterator<Item = &'a str>) {
        let mut cache = self
            .paths
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for p in paths {
            cache.remove(p);
        }
    }

    /// The object at an inventory path, looked up once; `None` when there is none.
    async fn lookup(&self, path: &str) -> Result<Option<Moref>> {
        if let Some(m) = self.cached(path) {
            return Ok(Some(m));
        }
        let found = self.client.find_by_inventory_path(path).await?;
        if let Some(m) = &found {
            self.paths
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(path.to_owned(), m.clone());
        }
        Ok(found)
    }

    /// The datacenter's `vm` folder's path: every VM of the datacenter is under it.
    fn vm_root_path(&self) -> String {
        format!("{}/vm", self.config.datacenter)
    }

    async fn vm_root(&self) -> Result<Moref> {
        let path = self.vm_root_path();
        self.lookup(&path).await?.ok_or_else(|| {
            Error::invalid_spec(
                "datacenter",
                format!(
                    "no datacenter {:?} (no folder {path})",
                    self.config.datacenter
                ),
            )
        })
    }

    /// Properties `paths` of every VM of the datacenter, in one call; the `vm` folder
    /// is looked up again, once, when the server no longer knows the cached one.
    async fn all_vms(&self, paths: &[&str]) -> Result<Vec<ObjectContent>> {
        let root = self.vm_root().await?;
        match self.client.vms_under(&root, paths).await {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.forget([self.vm_root_path().as_str()]);
                let root = self.vm_root().await?;
                self.client.vms_under(&root, paths).await
            }
            other => other,
        }
    }

    /// Every VM of this owner in the datacenter.
    async fn owned_vms(&self) -> Result<Vec<Vm>> {
        let vms: Vec<Vm> = self
            .all_vms(PATHS)
            .await?
            .iter()
            .map(Vm::from_content)
            .filter(|v| v.owned_by(&self.config.owner))
            .collect();
        for v in &vms {
            if let Some(uuid) = &v.uuid {
                self.remember_vm(uuid, &v.moref);
            }
        }
        Ok(vms)
    }

    /// This owner's VMs named `name`, oldest (lowest managed object id) first: the
    /// first is the machine, any other a duplicate.
    async fn named(&self, name: &MachineName) -> Result<Vec<Vm>> {
        let vms = self
            .owned_vms()
            .await?
            .into_iter()
            .filter(|v| v.machine_name() == Some(name.as_str()))
            .collect();
        Ok(oldest_first(vms))
    }

    /// Settles the name once `mine` was cloned for it: the machine is the oldest of
    /// this owner's VMs of that name; `None` when that is `mine`, else the older VM.
    /// Only VMs whose vSphere name is the machine's are looked at, since every create
    /// clones under the machine's name: a clone a concurrent create made is among them,
    /// and a VM made earlier was adopted before cloning. Usually `mine` is alone, and
    /// the settlement is one listing of names.
    async fn settle(&self, name: &MachineName, mine: &Moref) -> Result<Option<Vm>> {
        let same: Vec<Moref> = self
            .all_vms(&["name"])
            .await?
            .into_iter()
            .filter(|o| o.text("name") == Some(name.as_str()))
            .map(|o| o.obj)
            .collect();
        if !same.contains(mine) {
            return Err(Error::transient(format!(
                "{self}: the clone of {name} vanished"
            )));
        }
        if same.len() == 1 {
            return Ok(None);
        }
        let vms: Vec<Vm> = self
            .client
            .properties_of("VirtualMachine", &same, PATHS)
            .await?
            .iter()
            .map(Vm::from_content)
            .filter(|v| v.owned_by(&self.config.owner) && v.machine_name() == Some(name.as_str()))
            .collect();
        Ok(oldest_first(vms)
            .into_iter()
            .next()
            .filter(|oldest| oldest.moref != *mine))
    }

    /// The VM with this provider ID, when it exists.
    /// A VM found by its UUID before is read directly (one call); one that is gone
    /// from there (destroyed, or registered again under another id) is looked up anew.
    async fn by_id(&self, id: &ProviderId) -> Result<Option<Vm>> {
        let uuid = vm::uuid_of(id)?;
        if let Some(moref) = self.known_vm(uuid) {
            let read = self.client.properties(&moref, PATHS).await?;
            match read.map(|o| Vm::from_content(&o)) {
                Some(vm) if vm.uuid.as_deref() == Some(uuid) => return Ok(Some(vm)),
                _ => self.forget_vm(uuid),
            }
        }
        let Some(moref) = self.client.find_by_uuid(uuid).await? else {
            return Ok(None);
        };
        let vm = self
            .client
            .properties(&moref, PATHS)
            .await?
            .map(|o| Vm::from_content(&o));
        if vm.is_some() {
            self.remember_vm(uuid, &moref);
        }
        Ok(vm)
    }

    fn known_vm(&self, uuid: &str) -> Option<Moref> {
        self.vms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(uuid)
            .cloned()
    }

    /// Remembers a VM's id by its UUID; the memory is bounded (emptied when full),
    /// since it only saves a lookup.
    fn remember_vm(&self, uuid: &str, moref: &Moref) {
        let mut vms = self
            .vms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if vms.len() >= KNOWN_VMS {
            vms.clear();
        }
        vms.insert(uuid.to_owned(), moref.clone());
    }

    fn forget_vm(&self, uuid: &str) {
        self.vms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(uuid);
    }

    /// The VM with this provider ID when this owner made it; NotFound otherwise.
    async fn owned(&self, id: &ProviderId) -> Result<Vm> {
        match self.by_id(id).await? {
            Some(vm) if vm.owned_by(&self.config.owner) => Ok(vm),
            _ => Err(Error::not_found(format!("{self}: no machine {id}"))),
        }
    }

    /// An inventory path's object (looked up once), or an invalid spec naming `field`.
    async fn resolve(&self, path: &str, field: &str, kind: &str) -> Result<Moref> {
        match self.lookup(path).await? {
            Some(m) if m.kind == kind || (kind == "ResourcePool" && m.kind == "VirtualApp") => {
                Ok(m)
            }
            Some(m) => Err(Error::invalid_spec(
                field,
                format!("{path} is a {}, not a {kind}", m.kind),
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
            .resolve(template_path, template_field, "VirtualMachine")
            .await?;
        let folder = self
            .resolve(&plan.folder, "provider.folder", "Folder")
            .await?;
        let pool = self
            .resolve(&plan.resource_pool, "provider.resourcePool", "ResourcePool")
            .await?;
        let datastore = match &plan.datastore {
            Some(ds) => Some(self.resolve(ds, "provider.datastore", "Datastore").await?),
            None => None,
        };
        let network = self.network(plan).await?;
        Ok(Placement {
            template,
            folder,
            pool,
            datastore,
            network,
        })
    }

    /// The plan's network, resolved.
    async fn network(&self, plan: &ClonePlan) -> Result<Option<Moref>> {
        match &plan.network {
            Some(n) => Ok(Some(self.resolve(n, "provider.network", "Network").await?)),
            None => Ok(None),
        }
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

    async fn reconfigure(&self, vm: &Moref, spec: &str) -> Result<()> {
        self.client
            .task("ReconfigVM_Task", &format!("{}{spec}", vm.xml("_this")))
            .await
            .map(drop)
    }

    /// A power task; `ok_state` (InvalidPowerState: already there) counts as done.
    async fn power_task(&self, method: &str, vm: &Moref) -> Result<()> {
        match self.client.task(method, &vm.xml("_this")).await {
            Ok(_) => Ok(()),
            Err(e)
                if e.kind() == ErrorKind::Conflict && e.message().contains("InvalidPowerState") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Asks the guest to shut down, waits up to the soft-stop timeout, then powers off.
    /// `known` is the power state just read, when the caller has it.
    async fn stop_vm(&self, vm: &Moref, known: Option<&str>) -> Result<()> {
        let state = |o: Option<ObjectContent>| {
            o.and_then(|o| o.text("runtime.powerState").map(str::to_owned))
        };
        let now = match known {
            Some(k) => Some(k.to_owned()),
            None => state(self.client.properties(vm, &["runtime.powerState"]).await?),
        };
        match now.as_deref() {
            Some("poweredOff") | None => return Ok(()),
            _ => {}
        }
        // Soft first: a guest without VMware Tools refuses, and the hard stop follows.
        if self
            .client
            .call("ShutdownGuest", &vm.xml("_this"))
            .await
            .is_ok()
        {
            let deadline = tokio::time::Instant::now() + self.config.soft_stop_timeout;
            let mut pause = Duration::from_millis(50);
            loop {
                let now = state(self.client.properties(vm, &["runtime.powerState"]).await?);
                if now.as_deref() != Some("poweredOn") {
                    return Ok(());
                }
                if tokio::time::Instant::now() + pause > deadline {
                    break;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
        self.power_task("PowerOffVM_Task", vm).await
    }

    /// Powers off (soft, then hard) and destroys; gone is success. `known` is the
    /// power state just read, when the caller has it.
    async fn destroy(&self, vm: &Moref, known: Option<&str>) -> Result<()> {
        let gone = |e: &Error| e.kind() == ErrorKind::NotFound;
        match self.stop_vm(vm, known).await {
            Err(e) if gone(&e) => return Ok(()),
            other => other?,
        }
        match self.client.task("Destroy_Task", &vm.xml("_this")).await {
            Err(e) if gone(&e) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Sets CPU, memory, disk size and network on the (powered-off) clone. vCenter
    /// applies the clone spec's CPU and memory itself but vcsim does not, and a disk or
    /// network edit needs the clone's own devices; one reconfigure does all.
    async fn apply_hardware(
        &self,
        vm: &Moref,
        plan: &ClonePlan,
        network: Option<&Moref>,
    ) -> Result<()> {
        let mut spec = String::new();
        if let Some(c) = plan.num_cpus {
            let _ = write!(spec, "<numCPUs>{c}</numCPUs>");
        }
        if let Some(m) = plan.memory_mib {
            let _ = write!(spec, "<memoryMB>{m}</memoryMB>");
        }
        if plan.disk_gib.is_some() || plan.network.is_some() {
            let devices = self
                .client
                .properties(vm, &["config.hardware.device"])
                .await?
                .and_then(|o| o.prop("config.hardware.device").cloned())
                .unwrap_or_default();
            if let Some(gib) = plan.disk_gib {
                spec.push_str(&disk_edit(&devices, gib)?);
            }
            if let (Some(path), Some(network)) = (&plan.network, network) {
                let name = path.rsplit('/').next().unwrap_or(path);
                spec.push_str(&nic_edit(&devices, network, name)?);
            }
        }
        if spec.is_empty() {
            return Ok(());
        }
        self.reconfigure(
            vm,
            &format!("<spec xsi:type=\"VirtualMachineConfigSpec\">{spec}</spec>"),
        )
        .await
    }

    /// Brings a clone that was never started up: its hardware as planned, powered on,
    /// then marked started. A refusal of the hardware or the power-on (no capacity, no
    /// permission, a spec it cannot take) destroys the clone, so that the refused create
    /// leaves no machine; other errors leave it for the next create to finish.
    async fn start_clone(
        &self,
        vm: &Moref,
        plan: &ClonePlan,
        network: Option<&Moref>,
    ) -> Result<()> {
        let started = async {
            self.apply_hardware(vm, plan, network).await?;
            self.power_task("PowerOnVM_Task", vm).await
        }
        .await;
        if let Err(e) = started {
            if refused(e.kind()) {
                tracing::info!(vm = %vm, error = %e, "the clone cannot start as asked; destroying it");
                if let Err(cleanup) = self.destroy(vm, Some("poweredOff")).await {
                    tracing::warn!(error = %cleanup, "destroying a clone that could not start");
                }
            }
            return Err(e);
        }
        self.mark_started(vm).await
    }

    /// Marks the VM as started once (see [`STARTED_KEY`]).
    async fn mark_started(&self, vm: &Moref) -> Result<()> {
        self.reconfigure(
            vm,
            &format!(
                "<spec xsi:type=\"VirtualMachineConfigSpec\">{}</spec>",
                option_value(STARTED_KEY, "true")
            ),
        )
        .await
    }

    /// Returns the machine of `existing`, this owner's VM of the spec's name; a clone a
    /// create left before power-on (a crash, a cancel, a lost answer) is finished first.
    async fn adopt(&self, existing: Vm, plan: &ClonePlan, name: &MachineName) -> Result<Machine> {
        if existing.extra(STARTED_KEY).is_none() {
            match existing.power.as_str() {
                "poweredOff" => {
                    let network = self.network(plan).await?;
                    match self
                        .start_clone(&existing.moref, plan, network.as_ref())
                        .await
                    {
                        // Its own creator powered it on meanwhile (the hardware edit
                        // found it running).
                        Err(e) if e.kind() == ErrorKind::Conflict => {}
                        other => other?,
                    }
                    return self.machine_of(&existing.moref, name).await;
                }
                // Powered on by a create that stopped before marking it.
                "poweredOn" => self.mark_started(&existing.moref).await?,
                _ => {}
            }
        }
        existing
            .machine()
            .ok_or_else(|| Error::transient(format!("{self}: {name} has no BIOS UUID yet")))
    }

    /// The machine of the VM `vm`, read now.
    async fn machine_of(&self, vm: &Moref, name: &MachineName) -> Result<Machine> {
        let read = self
            .client
            .properties(vm, PATHS)
            .await?
            .map(|o| Vm::from_content(&o));
        if let Some(uuid) = read.as_ref().and_then(|v| v.uuid.as_deref()) {
            self.remember_vm(uuid, vm);
        }
        read.and_then(|v| v.machine()).ok_or_else(|| {
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
    ) -> Result<(Moref, Placement)> {
        let mut place = self.placement(plan).await?;
        let mut body = self.clone_body(&place, plan, spec, user_data)?;
        let result = match self.client.task("CloneVM_Task", &body).await {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.forget(Self::plan_paths(plan));
                place = self.placement(plan).await?;
                body = self.clone_body(&place, plan, spec, user_data)?;
                self.client.task("CloneVM_Task", &body).await?
            }
            other => other?,
        };
        let mine = result
            .as_ref()
            .and_then(Moref::from_element)
            .ok_or_else(|| Error::transient("CloneVM_Task: no VM in the task's result"))?;
        Ok((mine, place))
    }

    /// The clone spec: where, how big, and the tags and guestinfo in extraConfig (so
    /// a VM is never visible without its owner and name).
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

/// VMs sorted oldest (lowest managed object id, which vCenter hands out in increasing
/// order) first.
fn oldest_first(mut vms: Vec<Vm>) -> Vec<Vm> {
    vms.sort_by_key(|v| (v.moref.serial(), v.moref.value.clone()));
    vms
}

/// A deviceChange growing the first disk to `gib`.
fn disk_edit(devices: &crate::xml::Element, gib: u64) -> Result<String> {
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

/// A deviceChange putting the first network card on the standard port group `network`.
fn nic_edit(devices: &crate::xml::Element, network: &Moref, name: &str) -> Result<String> {
    let mut nic = devices
        .children
        .iter()
        .find(|d| d.child("macAddress").is_some() || d.child("addressType").is_some())
        .cloned()
        .ok_or_else(|| {
            Error::invalid_spec("provider.network", "the template has no network card")
        })?;
    let backing = format!(
        "<backing xsi:type=\"VirtualEthernetCardNetworkBackingInfo\"><deviceName>{}</deviceName>{}</backing>",
        crate::xml::escape(name),
        network.xml("network")
    );
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
    network: Option<Moref>,
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
    /// returns the oldest. Only then is the machine powered on. vCenter itself refuses
    /// a second VM of one name in a folder (DuplicateName): then another create of the
    /// name cloned first, and its VM is adopted.
    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        spec.validate()?;
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        let plan = self.config.plan(spec)?;
        if let Some(existing) = self.named(&spec.name).await?.into_iter().next() {
            return self.adopt(existing, &plan, &spec.name).await;
        }
        let (mine, place) = match self.clone_vm(&plan, spec, user_data).await {
            Err(e) if e.kind() == ErrorKind::Conflict && e.message().contains("DuplicateName") => {
                return match self.named(&spec.name).await?.into_iter().next() {
                    Some(existing) => self.adopt(existing, &plan, &spec.name).await,
                    // A VM of another owner, or none of this owner's yet: not ours.
                    None => Err(e),
                };
            }
            other => other?,
        };
        if let Some(winner) = self.settle(&spec.name, &mine).await? {
            tracing::info!(name = %spec.name, "another create won the race; destroying this clone");
            self.destroy(&mine, Some("poweredOff")).await?;
            return winner.machine().ok_or_else(|| {
                Error::transient(format!("{self}: {} has no BIOS UUID yet", spec.name))
            });
        }
        self.start_clone(&mine, &plan, place.network.as_ref())
            .await?;
        self.machine_of(&mine, &spec.name).await
    }

    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        self.owned(id)
            .await?
            .machine()
            .ok_or_else(|| Error::not_found(format!("{self}: no machine {id}")))
    }

    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        Ok(self.named(name).await?.first().and_then(Vm::machine))
    }

    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        let vms = oldest_first(self.owned_vms().await?);
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
        let Some(vm) = self.by_id(id).await? else {
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

    /// The user data in `guestinfo.userdata`; `None` once
    /// [`MachineProvisioner::bootstrap_finished`] removed it.
    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        let vm = self.owned(id).await?;
        let Some(value) = vm.extra(guestinfo::USERDATA).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let encoding = vm.extra(guestinfo::USERDATA_ENCODING).unwrap_or("");
        Ok(Some(UserData::sniff(guestinfo::decode(value, encoding)?)))
    }

    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        let vm = self.owned(id).await?;
        match op {
            PowerOp::Start => self.power_task("PowerOnVM_Task", &vm.moref).await,
            PowerOp::Stop => self.stop_vm(&vm.moref, Some(&vm.power)).await,
            // A hard reset: RebootGuest needs VMware Tools in the guest and vcsim lacks it.
            PowerOp::Reboot => self.power_task("ResetVM_Task", &vm.moref).await,
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

    fn devices() -> crate::xml::Element {
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
    fn the_first_nic_moves_to_the_network() {
        let edit = nic_edit(
            &devices(),
            &Moref::new("Network", "network-7"),
            "VM Network",
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
}
