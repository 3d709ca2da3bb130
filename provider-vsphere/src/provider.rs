//! [`VsphereProvider`]: the [`MachineProvisioner`] over vCenter.

use std::fmt;
use std::fmt::Write as _;
use std::time::Duration;

use async_trait::async_trait;
use machine_core::{
    Capabilities, Error, ErrorKind, Labels, Machine, MachineName, MachineProvisioner, MachineSpec,
    PowerOp, PowerOperations, ProviderId, Result, SizeBasis, UserData, UserDataDelivery,
    UserDataFormat, user_data,
};
use tokio::sync::OnceCell;

use crate::client::{Client, Moref, http_client};
use crate::config::{ClonePlan, VsphereConfig};
use crate::guestinfo;
use crate::vm::{self, LABELS_KEY, NAME_KEY, OWNER_KEY, PATHS, STARTED_KEY, Vm, option_value};

/// The most user data accepted, counted as base64 (what guestinfo holds). vCenter
/// keeps extraConfig values far larger, but every read of the VM's config carries
/// them, so the provider keeps them small.
pub const USER_DATA_LIMIT: usize = 64 * 1024;

/// vCenter VMs cloned from templates, as machines. See the crate documentation.
pub struct VsphereProvider {
    config: VsphereConfig,
    client: Client,
    capabilities: Capabilities,
    /// The datacenter's `vm` folder: every VM of the datacenter is under it.
    vm_root: OnceCell<Moref>,
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
            .with_power(PowerOperations::all());
        Ok(VsphereProvider {
            config,
            client,
            capabilities,
            vm_root: OnceCell::new(),
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

    /// Empties `guestinfo.userdata` (and its encoding) of the machine: the body of
    /// [`MachineProvisioner::bootstrap_finished`]. Meta-data stays: cloud-init needs its
    /// instance id at every boot. A machine whose data is already empty is left alone.
    async fn scrub_user_data(&self, id: &ProviderId) -> Result<()> {
        let vm = self.owned(id).await?;
        if vm.extra(guestinfo::USERDATA).is_none_or(str::is_empty) {
            return Ok(());
        }
        // Empty values: vCenter removes a key set to "".
        let spec = format!(
            "<spec xsi:type=\"VirtualMachineConfigSpec\">{}{}</spec>",
            option_value(guestinfo::USERDATA, ""),
            option_value(guestinfo::USERDATA_ENCODING, "")
        );
        self.reconfigure(&vm.moref, &spec).await
    }

    async fn vm_root(&self) -> Result<&Moref> {
        self.vm_root
            .get_or_try_init(|| async {
                let path = format!("{}/vm", self.config.datacenter);
                self.client
                    .find_by_inventory_path(&path)
                    .await?
                    .ok_or_else(|| {
                        Error::invalid_spec(
                            "datacenter",
                            format!(
                                "no datacenter {:?} (no folder {path})",
                                self.config.datacenter
                            ),
                        )
                    })
            })
            .await
    }

    /// Every VM of this owner in the datacenter.
    async fn owned_vms(&self) -> Result<Vec<Vm>> {
        let root = self.vm_root().await?.clone();
        let all = self
            .client
            .properties_under(&root, "VirtualMachine", PATHS)
            .await?;
        Ok(all
            .iter()
            .map(Vm::from_content)
            .filter(|v| v.owned_by(&self.config.owner))
            .collect())
    }

    /// This owner's VMs named `name`, oldest (lowest managed object id) first: the
    /// first is the machine, any other a duplicate.
    async fn named(&self, name: &MachineName) -> Result<Vec<Vm>> {
        let mut vms: Vec<Vm> = self
            .owned_vms()
            .await?
            .into_iter()
            .filter(|v| v.machine_name() == Some(name.as_str()))
            .collect();
        vms.sort_by_key(|v| (v.moref.serial(), v.moref.value.clone()));
        Ok(vms)
    }

    /// The VM with this provider ID, when it exists.
    async fn by_id(&self, id: &ProviderId) -> Result<Option<Vm>> {
        let uuid = vm::uuid_of(id)?;
        let Some(moref) = self.client.find_by_uuid(uuid).await? else {
            return Ok(None);
        };
        Ok(self
            .client
            .properties(&moref, PATHS)
            .await?
            .map(|o| Vm::from_content(&o)))
    }

    /// The VM with this provider ID when this owner made it; NotFound otherwise.
    async fn owned(&self, id: &ProviderId) -> Result<Vm> {
        match self.by_id(id).await? {
            Some(vm) if vm.owned_by(&self.config.owner) => Ok(vm),
            _ => Err(Error::not_found(format!("{self}: no machine {id}"))),
        }
    }

    /// An inventory path's object, or an invalid spec naming `field`.
    async fn resolve(&self, path: &str, field: &str, kind: &str) -> Result<Moref> {
        match self.client.find_by_inventory_path(path).await? {
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
    async fn stop_vm(&self, vm: &Moref) -> Result<()> {
        let state = |o: Option<crate::client::ObjectContent>| {
            o.and_then(|o| o.text("runtime.powerState").map(str::to_owned))
        };
        let now = state(self.client.properties(vm, &["runtime.powerState"]).await?);
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

    /// Powers off (soft, then hard) and destroys; gone is success.
    async fn destroy(&self, vm: &Moref) -> Result<()> {
        let gone = |e: &Error| e.kind() == ErrorKind::NotFound;
        match self.stop_vm(vm).await {
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

    /// Powers a fresh clone on and marks it started; `hardware` (the plan and its
    /// network) is applied first when a later create finishes what an earlier one
    /// left.
    async fn finish(
        &self,
        vm: &Moref,
        hardware: Option<(&ClonePlan, Option<&Moref>)>,
    ) -> Result<()> {
        if let Some((plan, network)) = hardware {
            self.apply_hardware(vm, plan, network).await?;
        }
        self.power_task("PowerOnVM_Task", vm).await?;
        self.reconfigure(
            vm,
            &format!(
                "<spec xsi:type=\"VirtualMachineConfigSpec\">{}</spec>",
                option_value(STARTED_KEY, "true")
            ),
        )
        .await
    }

    /// The machine of the VM `vm`, read now.
    async fn machine_of(&self, vm: &Moref, name: &MachineName) -> Result<Machine> {
        self.client
            .properties(vm, PATHS)
            .await?
            .map(|o| Vm::from_content(&o))
            .and_then(|v| v.machine())
            .ok_or_else(|| {
                Error::transient(format!("{self}: {name} vanished or has no BIOS UUID yet"))
            })
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
        let mut config = String::new();
        if let Some(cpus) = plan.num_cpus {
            let _ = write!(config, "<numCPUs>{cpus}</numCPUs>");
        }
        if let Some(mem) = plan.memory_mib {
            let _ = write!(config, "<memoryMB>{mem}</memoryMB>");
        }
        config.push_str(&option_value(OWNER_KEY, &self.config.owner));
        config.push_str(&option_value(NAME_KEY, spec.name.as_str()));
        config.push_str(&option_value(LABELS_KEY, &labels));
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
}

/// A random number for the instance id (so a recreated machine is a new instance to
/// cloud-init), without a dependency: the hasher's per-process random keys.
fn fastrand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() as u32
}

#[async_trait]
impl MachineProvisioner for VsphereProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Adopts the owner's VM of that name if there is one; otherwise clones, then
    /// settles a race: every VM of this owner and name is listed, the oldest (lowest
    /// managed object id, which vCenter hands out in increasing order) is the machine,
    /// and a creator whose clone is not the oldest destroys its clone (still powered
    /// off) and returns the oldest. Only then is the machine powered on.
    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        spec.validate()?;
        user_data::admit(user_data, self.capabilities.user_data.as_ref())?;
        let plan = self.config.plan(spec)?;
        if let Some(existing) = self.named(&spec.name).await?.into_iter().next() {
            if existing.extra(STARTED_KEY).is_none() && existing.power == "poweredOff" {
                // A create stopped between clone and power-on (a crash, a cancel, a
                // lost answer): finish it.
                let network = match &plan.network {
                    Some(n) => Some(self.resolve(n, "provider.network", "Network").await?),
                    None => None,
                };
                match self
                    .finish(&existing.moref, Some((&plan, network.as_ref())))
                    .await
                {
                    // Its own creator finished it meanwhile.
                    Err(e) if e.kind() == ErrorKind::Conflict => {}
                    other => other?,
                }
                return self.machine_of(&existing.moref, &spec.name).await;
            }
            return existing.machine().ok_or_else(|| {
                Error::transient(format!("{self}: {} has no BIOS UUID yet", spec.name))
            });
        }
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
        let network = match &plan.network {
            Some(n) => Some(self.resolve(n, "provider.network", "Network").await?),
            None => None,
        };
        let place = Placement {
            template,
            folder,
            pool,
            datastore,
        };
        let body = self.clone_body(&place, &plan, spec, user_data)?;
        let result = self.client.task("CloneVM_Task", &body).await?;
        let mine = result
            .as_ref()
            .and_then(Moref::from_element)
            .ok_or_else(|| Error::transient("CloneVM_Task: no VM in the task's result"))?;
        let named = self.named(&spec.name).await?;
        let winner = named.first().cloned().ok_or_else(|| {
            Error::transient(format!("{self}: the clone of {} vanished", spec.name))
        })?;
        if winner.moref != mine {
            tracing::info!(name = %spec.name, "another create won the race; destroying this clone");
            self.destroy(&mine).await?;
            return winner.machine().ok_or_else(|| {
                Error::transient(format!("{self}: {} has no BIOS UUID yet", spec.name))
            });
        }
        if let Err(e) = self.apply_hardware(&mine, &plan, network.as_ref()).await {
            // A spec the clone cannot take (a disk smaller than the template's) leaves
            // nothing behind.
            if let Err(cleanup) = self.destroy(&mine).await {
                tracing::warn!(error = %cleanup, "destroying a clone whose hardware failed");
            }
            return Err(e);
        }
        self.finish(&mine, None).await?;
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
        let mut vms = self.owned_vms().await?;
        vms.sort_by_key(|v| (v.moref.serial(), v.moref.value.clone()));
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
        self.destroy(&vm.moref).await
    }

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
            PowerOp::Stop => self.stop_vm(&vm.moref).await,
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

    /// Scrubs the user data: once cloud-init has read it, the secrets it may hold must
    /// not stay readable to everyone with read access on the VM (Cluster API vSphere
    /// issue #582). The composer calls this before it reports the machine Ready.
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
