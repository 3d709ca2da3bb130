//! What a provider reports about a machine: identity, phase, addresses, access,
//! conditions and failure.

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, shown};
use crate::name::MachineName;

/// Labels on a machine: free-form key/value pairs used to select machines.
pub type Labels = BTreeMap<String, String>;

/// A machine's stable identity at its provider, as a URI whose scheme names the provider:
/// `aws:///<zone>/<instance-id>`, `vsphere://<bios-uuid>`, `redfish://<bmc>/<system>`,
/// `sim:///<id>`.
///
/// It is what Kubernetes calls `spec.providerID`: a kubelet can report the same string,
/// which is how a machine may optionally be linked to a node.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(into = "String")]
pub struct ProviderId(String);

impl ProviderId {
    /// Parses `uri`, which must be `<scheme>://<rest>` with a lowercase scheme and a
    /// non-empty rest.
    pub fn new(uri: impl Into<String>) -> Result<Self> {
        let uri = uri.into();
        let ok = match uri.split_once("://") {
            Some((scheme, rest)) => {
                !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !rest.trim_matches('/').is_empty()
            }
            None => false,
        };
        if ok {
            Ok(ProviderId(uri))
        } else {
            Err(Error::invalid_spec(
                "providerID",
                format!(
                    "{} is not a provider ID URI like sim:///id or aws:///zone/i-123",
                    shown(&uri)
                ),
            ))
        }
    }

    /// The scheme, such as `aws` or `sim`.
    pub fn scheme(&self) -> &str {
        self.0.split_once("://").map_or("", |(s, _)| s)
    }

    /// The last path segment, which is the provider's own id for every built-in provider.
    pub fn resource_id(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or("")
    }

    /// The URI as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Deserializing validates; the error is the message alone, the reader adds the field.
impl<'de> Deserialize<'de> for ProviderId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let uri = String::deserialize(d)?;
        ProviderId::new(uri).map_err(|e| serde::de::Error::custom(e.message()))
    }
}

impl TryFrom<String> for ProviderId {
    type Error = Error;
    fn try_from(value: String) -> Result<Self> {
        ProviderId::new(value)
    }
}

impl From<ProviderId> for String {
    fn from(value: ProviderId) -> Self {
        value.0
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Where a machine is in its life.
///
/// Providers report `Pending` through `Provisioned`, `Stopped`, `Deleting`, `Deleted` and
/// `Failed`; the composer adds `Bootstrapping` and `Ready`, which depend on software.
///
/// `#[non_exhaustive]`: phases may be added in minor releases, so a `match` outside this
/// crate needs a catch-all arm (treat an unknown phase as "not running yet").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub enum Phase {
    /// Accepted by the provider, no resources yet.
    Pending,
    /// Resources are being made; the machine is not running yet.
    Provisioning,
    /// The machine is running; software may not be on it yet.
    Provisioned,
    /// Software is being applied or awaited.
    Bootstrapping,
    /// Running with all its software.
    Ready,
    /// The machine exists but is powered off (after a stop, or stopping): not running,
    /// not failed. A start brings it back through `Provisioning`; its software stays.
    Stopped,
    /// Going away.
    Deleting,
    /// Gone; some providers list gone machines for a while.
    Deleted,
    /// Will not become ready without intervention; see [`Machine::failure`].
    Failed,
}

impl Phase {
    /// Whether the machine is up at its provider (running, whatever its software).
    /// `Stopped` is not running.
    pub fn is_running(self) -> bool {
        matches!(
            self,
            Phase::Provisioned | Phase::Bootstrapping | Phase::Ready
        )
    }

    /// Whether the machine is going or gone (`Deleting`, `Deleted`).
    pub fn is_deleting(self) -> bool {
        matches!(self, Phase::Deleting | Phase::Deleted)
    }

    /// Whether the phase is final until someone acts: `Ready`, `Stopped` (until a start)
    /// or `Failed` (until a delete). A controller waits for a change there.
    pub fn is_settled(self) -> bool {
        matches!(self, Phase::Ready | Phase::Stopped | Phase::Failed)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The kind of an address, as in Kubernetes' `NodeAddressType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub enum AddressKind {
    /// The machine's hostname.
    Hostname,
    /// An IP address reachable inside the provider's network.
    InternalIP,
    /// An IP address reachable from outside the provider's network.
    ExternalIP,
    /// A DNS name resolving inside the provider's network.
    InternalDNS,
    /// A DNS name resolving from outside.
    ExternalDNS,
}

/// One typed address of a machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Address {
    /// What kind of address this is.
    pub kind: AddressKind,
    /// The address itself.
    pub address: String,
}

impl SshEndpoint {
    /// An endpoint at `host:port`, logging in as `user`.
    pub fn new(host: impl Into<String>, port: u16, user: impl Into<String>) -> Self {
        SshEndpoint {
            host: host.into(),
            port,
            user: user.into(),
        }
    }
}

impl Access {
    /// Access over `ssh`, with no host keys known yet.
    pub fn ssh(ssh: SshEndpoint) -> Self {
        Access {
            ssh: Some(ssh),
            host_keys: Vec::new(),
        }
    }
}

impl Failure {
    /// A failure with a CamelCase `reason` and a `message`.
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Failure {
            reason: reason.into(),
            message: message.into(),
        }
    }
}

impl Condition {
    /// A condition of `kind` that changed to `status` now.
    pub fn now(kind: &str, status: bool, reason: &str, message: impl Into<String>) -> Self {
        Condition {
            kind: kind.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.into(),
            last_transition: SystemTime::now(),
        }
    }
}

impl NodeRef {
    /// A link to the node `name`.
    pub fn new(name: impl Into<String>) -> Self {
        NodeRef { name: name.into() }
    }
}

impl Address {
    /// An address of `kind`.
    pub fn new(kind: AddressKind, address: impl Into<String>) -> Self {
        Address {
            kind,
            address: address.into(),
        }
    }
}

/// How to reach a machine to apply decoupled software.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Access {
    /// The SSH endpoint, when the machine has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshEndpoint>,
    /// Host public keys the machine is known to have, in OpenSSH format
    /// (`ssh-ed25519 AAAA...`): from pre-generated keys in user data, or reported by the
    /// provider (console output). A transport pins these instead of trusting on first use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_keys: Vec<String>,
}

/// An SSH endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SshEndpoint {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    #[serde(default = "default_ssh_port")]
    pub port: u16,
    /// User to log in as.
    pub user: String,
}

fn default_ssh_port() -> u16 {
    22
}

/// The status of one aspect of a machine, in the style of Kubernetes conditions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Condition {
    /// What the condition is about, in CamelCase: `InfrastructureReady`, `Reachable`,
    /// `BootstrapComplete`, `LayerApplied/<layer>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Whether it holds.
    pub status: bool,
    /// A CamelCase reason for the status.
    pub reason: String,
    /// A human-readable message.
    pub message: String,
    /// When the status last changed.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schemars", schemars(with = "String"))]
    pub last_transition: SystemTime,
}

/// Why a machine failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Failure {
    /// A CamelCase reason: `CreateError`, `BootFailed`, `BootstrapFailed`, `Timeout`.
    pub reason: String,
    /// What happened, in the words of whoever saw it fail.
    pub message: String,
}

/// Optional link from a machine to the Kubernetes node it became. The core never needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NodeRef {
    /// The node's name.
    pub name: String,
}

/// A machine as its provider (and, for software phases, the composer) sees it now.
///
/// `#[non_exhaustive]`, like the types it holds: fields may be added in minor releases,
/// so a provider builds one with [`Machine::new`] and sets the public fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Machine {
    /// The caller's name for the machine.
    pub name: MachineName,
    /// The provider's identity for it.
    #[serde(rename = "providerID")]
    pub provider_id: ProviderId,
    /// Where it is in its life.
    pub phase: Phase,
    /// Typed addresses, in the provider's order.
    #[serde(default)]
    pub addresses: Vec<Address>,
    /// How to reach it.
    #[serde(default)]
    pub access: Access,
    /// Its labels, as stored at the provider.
    #[serde(default)]
    pub labels: Labels,
    /// Its size as the provider reads it back from the infrastructure, in the notation of
    /// [`crate::MachineSpec::size`] (an instance type, `2x4096`); `None` where the provider
    /// takes no size. A machine made from a spec with a size reports that same string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Conditions, one per kind.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Why it failed, when phase is `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The node it became, when a caller links it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeRef>,
}

impl Machine {
    /// A machine with no addresses, access, conditions or labels yet.
    pub fn new(name: MachineName, provider_id: ProviderId, phase: Phase) -> Self {
        Machine {
            name,
            provider_id,
            phase,
            addresses: Vec::new(),
            access: Access::default(),
            labels: Labels::new(),
            size: None,
            conditions: Vec::new(),
            failure: None,
            node: None,
        }
    }

    /// The coupled revision the machine was made from, as stamped by the composer
    /// ([`crate::revision::REVISION_LABEL`]); `None` for a machine made otherwise.
    pub fn revision(&self) -> Option<&str> {
        self.labels
            .get(crate::revision::REVISION_LABEL)
            .map(String::as_str)
    }

    /// The first address of `kind`.
    pub fn address(&self, kind: AddressKind) -> Option<&str> {
        self.addresses
            .iter()
            .find(|a| a.kind == kind)
            .map(|a| a.address.as_str())
    }

    /// The condition of `kind`, if set.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    /// Sets a condition, keeping its transition time when its status did not change.
    pub fn set_condition(
        &mut self,
        kind: &str,
        status: bool,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        match self.conditions.iter_mut().find(|c| c.kind == kind) {
            Some(c) => {
                if c.status != status {
                    c.last_transition = SystemTime::now();
                }
                c.status = status;
                c.reason = reason.to_owned();
                c.message = message;
            }
            None => self.conditions.push(Condition {
                kind: kind.to_owned(),
                status,
                reason: reason.to_owned(),
                message,
                last_transition: SystemTime::now(),
            }),
        }
    }

    /// Carries over `earlier`'s conditions that this machine does not have, so that
    /// setting them again keeps their transition time while their status holds.
    pub fn keep_conditions_of(&mut self, earlier: &Machine) {
        for c in &earlier.conditions {
            if self.condition(&c.kind).is_none() {
                self.conditions.push(c.clone());
            }
        }
    }

    /// Marks the machine failed with `reason` and `message`.
    pub fn fail(&mut self, reason: &str, message: impl Into<String>) {
        self.phase = Phase::Failed;
        self.failure = Some(Failure {
            reason: reason.to_owned(),
            message: message.into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_are_uris_with_a_scheme() {
        let id = ProviderId::new("aws:///us-east-1a/i-0abc").unwrap();
        assert_eq!(id.scheme(), "aws");
        assert_eq!(id.resource_id(), "i-0abc");
        for bad in ["", "i-0abc", "://x", "AWS:///x", "sim:///"] {
            assert!(ProviderId::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_bad_provider_id_read_from_a_document_says_its_prefix_once() {
        let e = crate::from_json::<Machine>(
            "{\"name\": \"a\", \"providerID\": \"nope\", \"phase\": \"Ready\"}",
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("providerID"), "{e}");
        assert_eq!(e.to_string().matches("invalid spec").count(), 1, "{e}");
    }

    #[test]
    fn machine_round_trips_through_json_and_yaml() {
        let mut m = Machine::new(
            MachineName::new("web-1").unwrap(),
            ProviderId::new("sim:///m-1").unwrap(),
            Phase::Ready,
        );
        m.addresses
            .push(Address::new(AddressKind::InternalIP, "10.0.0.5"));
        m.access.ssh = Some(SshEndpoint {
            host: "10.0.0.5".into(),
            port: 22,
            user: "ops".into(),
        });
        m.access.host_keys.push("ssh-ed25519 AAAAC3Nza".into());
        m.labels.insert("team".into(), "web".into());
        m.set_condition("InfrastructureReady", true, "Running", "up");
        m.node = Some(NodeRef {
            name: "web-1".into(),
        });
        let json = serde_json::to_string(&m).unwrap();
        assert!(json.contains("\"providerID\":\"sim:///m-1\""), "{json}");
        assert_eq!(serde_json::from_str::<Machine>(&json).unwrap(), m);
        let yaml = serde_saphyr::to_string(&m).unwrap();
        assert_eq!(serde_saphyr::from_str::<Machine>(&yaml).unwrap(), m);
    }

    #[test]
    fn set_condition_keeps_transition_time_when_status_holds() {
        let mut m = Machine::new(
            MachineName::new("a").unwrap(),
            ProviderId::new("sim:///1").unwrap(),
            Phase::Pending,
        );
        m.set_condition("Reachable", false, "Connecting", "first");
        let t0 = m.condition("Reachable").unwrap().last_transition;
        m.set_condition("Reachable", false, "Connecting", "second");
        let c = m.condition("Reachable").unwrap();
        assert_eq!(c.last_transition, t0);
        assert_eq!(c.message, "second");
    }
}
