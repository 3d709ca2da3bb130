//! An EC2 instance seen as a machine: provider ID, phase, size, addresses, access, labels.

use aws_sdk_ec2::types::{Instance, InstanceStateName};
use machine_core::{
    Address, AddressKind, Error, Machine, MachineName, Phase, ProviderId, Result, SshEndpoint,
};

use crate::tags;

/// The instance id in a provider ID `aws:///<zone>/<instance-id>` (the zone may be
/// empty, as in `aws:///i-0abc` or `aws:////i-0abc`). Errors name `providerID`.
pub(crate) fn instance_id(id: &ProviderId) -> Result<&str> {
    let ok = id.scheme() == "aws" && id.as_str().starts_with("aws:///");
    let instance = id.resource_id();
    let well_formed = instance
        .strip_prefix("i-")
        .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()));
    if ok && well_formed {
        Ok(instance)
    } else {
        Err(Error::invalid_spec(
            "providerID",
            format!("{id} is not an EC2 provider ID like aws:///us-east-1a/i-0123456789abcdef0"),
        ))
    }
}

/// The provider ID of an instance.
pub(crate) fn provider_id(inst: &Instance) -> Result<ProviderId> {
    let zone = inst
        .placement()
        .and_then(|p| p.availability_zone())
        .unwrap_or("");
    let id = inst
        .instance_id()
        .ok_or_else(|| Error::permanent("EC2 returned an instance without an id"))?;
    ProviderId::new(format!("aws:///{zone}/{id}"))
}

/// The EC2 state name of an instance (`pending`, `running`, ...).
pub(crate) fn state(inst: &Instance) -> Option<&InstanceStateName> {
    inst.state().and_then(|s| s.name())
}

/// Whether the instance is terminated or on its way there.
pub(crate) fn is_gone_or_going(inst: &Instance) -> bool {
    matches!(
        state(inst),
        Some(InstanceStateName::Terminated | InstanceStateName::ShuttingDown)
    )
}

/// Whether the instance carries the marker and `owner`'s tag, and a valid name.
pub(crate) fn is_owned_by(inst: &Instance, owner: &str) -> bool {
    let p = parse_tags(inst);
    p.managed && p.owner.as_deref() == Some(owner) && p.name.is_some()
}

fn parse_tags(inst: &Instance) -> tags::Parsed {
    tags::parse(
        inst.tags()
            .iter()
            .filter_map(|t| Some((t.key()?, t.value().unwrap_or("")))),
    )
}

/// The machine an owned instance is. `default_ssh_user` is used when the instance has
/// no SSH user tag; without either there is no SSH endpoint.
pub(crate) fn to_machine(inst: &Instance, default_ssh_user: Option<&str>) -> Result<Machine> {
    let p = parse_tags(inst);
    let name: MachineName = p.name.ok_or_else(|| {
        Error::permanent(format!(
            "instance {} has no valid Name tag",
            inst.instance_id().unwrap_or("?")
        ))
    })?;
    let mut m = Machine::new(name, provider_id(inst)?, Phase::Pending);
    m.labels = p.labels;
    // The type EC2 runs it as: what the spec's `size` asked, or the config's default.
    m.size = inst
        .instance_type()
        .map(|t| t.as_str().to_owned())
        .filter(|t| !t.is_empty());
    let state = state(inst);
    m.phase = match state {
        Some(InstanceStateName::Pending) => Phase::Provisioning,
        Some(InstanceStateName::Running) => Phase::Provisioned,
        // Powered off, or going there: it exists but does not run until started.
        Some(InstanceStateName::Stopping | InstanceStateName::Stopped) => Phase::Stopped,
        Some(InstanceStateName::ShuttingDown) => Phase::Deleting,
        Some(InstanceStateName::Terminated) => Phase::Deleted,
        _ => Phase::Pending,
    };
    let state_name = state.map_or("unknown", InstanceStateName::as_str);
    let reason = inst.state_reason();
    let reason_code = reason.and_then(|r| r.code()).unwrap_or("");
    let reason_message = reason.and_then(|r| r.message()).unwrap_or("");
    if matches!(
        state,
        Some(InstanceStateName::Terminated | InstanceStateName::ShuttingDown)
    ) && !reason_code.is_empty()
        && !matches!(
            reason_code,
            "Client.UserInitiatedShutdown" | "Client.InstanceInitiatedShutdown"
        )
    {
        // Terminated by EC2 itself (Server.InternalError, Client.VolumeLimitExceeded,
        // Server.InsufficientInstanceCapacity at launch): a failed boot, not a deletion.
        m.fail("BootFailed", format!("{reason_code}: {reason_message}"));
    }
    m.set_condition(
        "InstanceRunning",
        state == Some(&InstanceStateName::Running),
        &camel(state_name),
        if reason_message.is_empty() {
            format!("EC2 reports the instance {state_name}")
        } else {
            format!("EC2 reports the instance {state_name}: {reason_message}")
        },
    );

    let mut push = |kind, value: Option<&str>| {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            m.addresses.push(Address::new(kind, v));
        }
    };
    push(AddressKind::InternalIP, inst.private_ip_address());
    push(AddressKind::ExternalIP, inst.public_ip_address());
    push(AddressKind::InternalDNS, inst.private_dns_name());
    push(AddressKind::ExternalDNS, inst.public_dns_name());

    let user = p.ssh_user.as_deref().or(default_ssh_user);
    let host = inst
        .public_ip_address()
        .or(inst.private_ip_address())
        .filter(|h| !h.is_empty());
    if let (Some(user), Some(host), true) = (user, host, m.phase.is_running()) {
        m.access.ssh = Some(SshEndpoint::new(host, 22, user));
    }
    Ok(m)
}

fn camel(state: &str) -> String {
    state
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{InstanceState, Placement, StateReason, Tag};

    fn instance(state: InstanceStateName, reason: Option<&str>) -> Instance {
        let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
        Instance::builder()
            .instance_id("i-0123456789abcdef0")
            .placement(Placement::builder().availability_zone("us-east-1a").build())
            .state(InstanceState::builder().name(state).build())
            .set_state_reason(reason.map(|c| {
                StateReason::builder()
                    .code(c)
                    .message(format!("{c}: why"))
                    .build()
            }))
            .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
            .private_ip_address("10.0.0.5")
            .public_ip_address("203.0.113.7")
            .private_dns_name("ip-10-0-0-5.ec2.internal")
            .public_dns_name("")
            .tags(tag("Name", "web-1"))
            .tags(tag(tags::MANAGED_TAG, "true"))
            .tags(tag(tags::OWNER_TAG, "ci"))
            .tags(tag(&tags::label_tag("team"), "web"))
            .build()
    }

    #[test]
    fn a_running_instance_is_a_provisioned_machine() {
        let inst = instance(InstanceStateName::Running, None);
        assert!(is_owned_by(&inst, "ci"));
        assert!(!is_owned_by(&inst, "other"));
        let m = to_machine(&inst, Some("admin")).unwrap();
        assert_eq!(
            m.provider_id.as_str(),
            "aws:///us-east-1a/i-0123456789abcdef0"
        );
        assert_eq!(m.phase, Phase::Provisioned);
        assert_eq!(m.size.as_deref(), Some("m5.large"));
        assert_eq!(m.labels["team"], "web");
        assert_eq!(m.address(AddressKind::InternalIP), Some("10.0.0.5"));
        assert_eq!(m.address(AddressKind::ExternalIP), Some("203.0.113.7"));
        assert_eq!(
            m.address(AddressKind::InternalDNS),
            Some("ip-10-0-0-5.ec2.internal")
        );
        assert_eq!(m.address(AddressKind::ExternalDNS), None);
        let ssh = m.access.ssh.clone().unwrap();
        assert_eq!(
            (ssh.host.as_str(), ssh.user.as_str()),
            ("203.0.113.7", "admin")
        );
        assert!(m.condition("InstanceRunning").unwrap().status);
    }

    #[test]
    fn states_map_to_phases() {
        for (state, phase) in [
            (InstanceStateName::Pending, Phase::Provisioning),
            (InstanceStateName::Stopped, Phase::Stopped),
            (InstanceStateName::Stopping, Phase::Stopped),
            (InstanceStateName::ShuttingDown, Phase::Deleting),
            (InstanceStateName::Terminated, Phase::Deleted),
        ] {
            let m = to_machine(
                &instance(state.clone(), Some("Client.UserInitiatedShutdown")),
                None,
            )
            .unwrap();
            assert_eq!(m.phase, phase, "{state:?}");
            assert!(m.access.ssh.is_none());
        }
        let m = to_machine(
            &instance(InstanceStateName::Terminated, Some("Server.InternalError")),
            None,
        )
        .unwrap();
        assert_eq!(m.phase, Phase::Failed);
        assert!(m.failure.unwrap().message.contains("Server.InternalError"));
    }

    #[test]
    fn provider_ids_are_parsed_strictly() {
        let id = ProviderId::new("aws:///us-east-1a/i-0123456789abcdef0").unwrap();
        assert_eq!(instance_id(&id).unwrap(), "i-0123456789abcdef0");
        for bad in [
            "sim:///i-0123",
            "aws://host/i-0123",
            "aws:///us-east-1a/vol-0123",
            "aws:///us-east-1a/i-xyz",
        ] {
            let id = ProviderId::new(bad).unwrap();
            assert_eq!(
                instance_id(&id).unwrap_err().field(),
                Some("providerID"),
                "{bad}"
            );
        }
    }
}
