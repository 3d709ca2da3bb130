//! A virtual machine as read from vCenter, and how the provider's own machines are
//! marked: extraConfig keys for owner, name and labels, set in the clone spec so that
//! a VM is never visible untagged.

use machine_core::{
    Address, AddressKind, Labels, Machine, MachineName, Phase, ProviderId, SshEndpoint,
};

use crate::client::{Moref, ObjectContent};

/// The owner key.
pub const OWNER_KEY: &str = "machineprovisioning.owner";
/// The machine name key.
pub const NAME_KEY: &str = "machineprovisioning.name";
/// The labels key: one JSON object holding every label. One key for all (rather than
/// a key per label) keeps a label with an empty value: vCenter removes an extraConfig
/// key set to "", but `{"empty":""}` is never empty; and any label key (`/`, mixed case)
/// is JSON, where an extraConfig key has rules of its own.
pub const LABELS_KEY: &str = "machineprovisioning.labels";
/// The user SSH logs in as (the spec's `ssh.user` or `provider.sshUser`), when known.
pub const SSH_USER_KEY: &str = "machineprovisioning.sshUser";
/// Set (to `true`) while the machine is stopped on purpose ([`machine_core::PowerOp::Stop`]),
/// removed when it is started again: a powered-off VM without it was left by a create
/// that stopped between clone and power-on (or powered off outside the provider), and
/// the next create of its name powers it on; one with it stays off.
pub const STOPPED_KEY: &str = "machineprovisioning.stopped";
/// Written by earlier versions once the machine was first powered on; a powered-off VM
/// that has it was stopped on purpose, as one with [`STOPPED_KEY`]. No longer written.
pub const STARTED_KEY: &str = "machineprovisioning.started";

/// The properties read of every VM, and watched: `config.hardware` whole rather than
/// its CPU and memory, because a change to either is published under it (vcsim publishes
/// `config.hardware.device` on every reconfigure and nothing finer).
pub(crate) const PATHS: &[&str] = &[
    "name",
    "config.uuid",
    "config.template",
    "config.extraConfig",
    "config.hardware",
    "runtime.powerState",
    "guest.ipAddress",
    "guest.net",
    "guest.guestState",
];

/// The provider ID scheme.
pub const SCHEME: &str = "vsphere";

/// What the provider knows of one VM.
#[derive(Debug, Clone)]
pub(crate) struct Vm {
    pub moref: Moref,
    pub uuid: Option<String>,
    pub template: bool,
    pub power: String,
    /// extraConfig, in order; a key listed twice counts with its last value (vcsim
    /// 0.24.2 appends rather than replaces).
    pub extra: Vec<(String, String)>,
    pub addresses: Vec<String>,
    /// `<cpus>x<memory MiB>`, as the VM's hardware is now.
    pub size: Option<String>,
    /// VMware Tools' view of the guest: `running`, `shuttingDown`, `resetting`,
    /// `notRunning`... (empty when unknown).
    pub guest_state: String,
}

impl Vm {
    /// A VM from the properties in [`PATHS`].
    pub fn from_content(o: &ObjectContent) -> Vm {
        let extra = o
            .prop("config.extraConfig")
            .map(|v| {
                v.children
                    .iter()
                    .filter_map(|opt| {
                        Some((
                            opt.child_text("key")?.to_owned(),
                            opt.child_text("value").unwrap_or("").to_owned(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut addresses: Vec<String> = Vec::new();
        let mut add = |ip: &str| {
            let ip = ip.trim();
            if !ip.is_empty() && !ip.starts_with("fe80:") && !addresses.iter().any(|a| a == ip) {
                addresses.push(ip.to_owned());
            }
        };
        if let Some(ip) = o.text("guest.ipAddress") {
            add(ip);
        }
        if let Some(net) = o.prop("guest.net") {
            for nic in &net.children {
                for ip in nic.children_named("ipAddress") {
                    add(&ip.text);
                }
            }
        }
        let hardware = |field: &str| {
            o.prop("config.hardware")
                .and_then(|h| h.child_text(field))
                .and_then(|t| t.trim().parse::<u64>().ok())
                .filter(|n| *n > 0)
        };
        let size = match (hardware("numCPU"), hardware("memoryMB")) {
            (Some(cpus), Some(mib)) => Some(format!("{cpus}x{mib}")),
            _ => None,
        };
        Vm {
            moref: o.obj.clone(),
            uuid: o
                .text("config.uuid")
                .map(str::to_owned)
                .filter(|u| !u.is_empty()),
            template: o.text("config.template") == Some("true"),
            power: o.text("runtime.powerState").unwrap_or("").to_owned(),
            extra,
            addresses,
            size,
            guest_state: o.text("guest.guestState").unwrap_or("").to_owned(),
        }
    }

    /// Whether the VM is off because it was stopped on purpose (see [`STOPPED_KEY`]).
    pub fn stopped_on_purpose(&self) -> bool {
        self.extra(STOPPED_KEY).is_some_and(|v| !v.is_empty())
            || self.extra(STARTED_KEY).is_some_and(|v| !v.is_empty())
    }

    /// Whether any extraConfig entry of `key` holds a value: what a reader of the raw
    /// property sees, even where a later entry of the same key is empty.
    pub fn holds(&self, key: &str) -> bool {
        self.extra.iter().any(|(k, v)| k == key && !v.is_empty())
    }

    /// The last value of extraConfig `key`.
    pub fn extra(&self, key: &str) -> Option<&str> {
        self.extra
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether `owner` made this VM (templates never count).
    pub fn owned_by(&self, owner: &str) -> bool {
        !self.template && self.extra(OWNER_KEY) == Some(owner)
    }

    /// The machine name it was made for.
    pub fn machine_name(&self) -> Option<&str> {
        self.extra(NAME_KEY)
    }

    /// The labels it was made with.
    pub fn labels(&self) -> Labels {
        self.extra(LABELS_KEY)
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_default()
    }

    /// The machine, when the VM carries a name and a BIOS UUID. A powered-on VM is
    /// running (Provisioned) once its guest has reported an address (VMware Tools);
    /// before that it is still booting (Provisioning): nothing could reach it yet.
    pub fn machine(&self) -> Option<Machine> {
        let name = MachineName::new(self.machine_name()?).ok()?;
        let id = provider_id(self.uuid.as_deref()?)?;
        let phase = match self.power.as_str() {
            "poweredOn" if !self.addresses.is_empty() => Phase::Provisioned,
            "poweredOff" | "suspended" => Phase::Stopped,
            _ => Phase::Provisioning,
        };
        let mut m = Machine::new(name, id, phase);
        m.labels = self.labels();
        m.size = self.size.clone();
        m.addresses = self
            .addresses
            .iter()
            .map(|a| Address::new(AddressKind::InternalIP, a.clone()))
            .collect();
        let user = self.extra(SSH_USER_KEY).filter(|u| !u.is_empty());
        if let (Some(user), Some(host), true) = (user, self.addresses.first(), phase.is_running()) {
            m.access.ssh = Some(SshEndpoint::new(host.clone(), 22, user));
        }
        Some(m)
    }
}

/// `vsphere://<bios-uuid>`.
pub(crate) fn provider_id(uuid: &str) -> Option<ProviderId> {
    ProviderId::new(format!("{SCHEME}://{uuid}")).ok()
}

/// The BIOS UUID in a provider ID of this provider.
pub(crate) fn uuid_of(id: &ProviderId) -> machine_core::Result<&str> {
    let uuid = id.resource_id();
    let hexish = uuid.len() == 36 && uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    if id.scheme() != SCHEME || !hexish {
        return Err(machine_core::Error::invalid_spec(
            "providerID",
            format!("{id} is not a vsphere://<bios-uuid> provider ID"),
        ));
    }
    Ok(uuid)
}

/// One `<extraConfig>` entry of a config spec.
pub(crate) fn option_value(key: &str, value: &str) -> String {
    format!(
        "<extraConfig xsi:type=\"OptionValue\"><key>{}</key><value xsi:type=\"xsd:string\">{}</value></extraConfig>",
        crate::xml::escape(key),
        crate::xml::escape(value)
    )
}
