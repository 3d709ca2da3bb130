//! Cases for the promises a running machine keeps: how it is reached, what it was made
//! from, its exact name, its end, its power and its withdrawn bootstrap data.

use std::time::Duration;

use crate::capabilities::PowerOp;
use crate::error::ErrorKind;
use crate::machine::{Machine, Phase};
use crate::name::{MAX_LABEL_LEN, MachineName};
use crate::provisioner::MachineProvisioner;
use crate::spec::{MAX_LABEL_VALUE_LEN, check_ssh_public_key};
use crate::transport::ExecRequest;

use super::fixture::{Clients, Fixture};
use super::{assert_not_created, sample_format, sample_user_data};

/// Once running, a machine has addresses; an SSH endpoint in `access.ssh` where the
/// fixture says the provider knows one ([`Fixture::ssh_access`]); and, where
/// [`crate::Capabilities::host_key_discovery`] is declared, host keys in
/// `access.host_keys` (within the boot timeout), each an OpenSSH public key line.
pub async fn running_machines_say_how_to_reach_them(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let discovery = p.capabilities().host_key_discovery;
    let (_, m) = fx.create(p, "access").await;
    let mut seen = fx
        .wait_for(p, &m.provider_id, "running", Phase::is_running)
        .await;
    // Host keys may show up a little after the machine runs (console output).
    let deadline = tokio::time::Instant::now() + fx.boot_timeout;
    while discovery && seen.access.host_keys.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(fx.poll).await;
        seen = fx.get(p, &m.provider_id).await;
    }
    fx.cleanup(p, &m).await;
    assert!(
        !seen.addresses.is_empty(),
        "{p}: a running machine has no addresses"
    );
    if fx.ssh_access {
        let ssh = seen
            .access
            .ssh
            .as_ref()
            .unwrap_or_else(|| panic!("{p}: a running machine has no access.ssh endpoint"));
        assert!(
            !ssh.host.is_empty() && ssh.port != 0 && !ssh.user.is_empty(),
            "{p}: a running machine's access.ssh is incomplete: {ssh:?}"
        );
    }
    if discovery {
        assert!(
            !seen.access.host_keys.is_empty(),
            "{p}: declares host_key_discovery but a running machine has no host_keys within {:?}",
            fx.boot_timeout
        );
        for (i, key) in seen.access.host_keys.iter().enumerate() {
            check_ssh_public_key(&format!("access.hostKeys[{i}]"), key)
                .unwrap_or_else(|e| panic!("{p}: a discovered host key is not a key line: {e}"));
        }
    }
}

/// Labels reach the machine exactly, the awkward ones too (mixed case, the longest key
/// and value allowed, `/` and `.`), read back through `get`, `find` and `list`; a label
/// the spec cannot hold (non-ASCII) is refused as an invalid spec naming it, with no
/// machine made. Each of [`Fixture::sizes`] reads back as [`Machine::size`]; a provider
/// that takes no size refuses one (invalid spec on `size`) rather than ignore it.
pub async fn the_spec_is_honoured(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let long_key = format!("k{}", "K".repeat(MAX_LABEL_VALUE_LEN - 1));
    let spec = fx
        .spec("honoured")
        .with_label("Mixed.Case/Key", "MiXeD-Value_1.x")
        .with_label(long_key, "v".repeat(MAX_LABEL_VALUE_LEN))
        .with_label("empty", "");
    let mut cases: Vec<_> = fx.sizes.iter().map(|s| Some(s.clone())).collect();
    if cases.is_empty() {
        cases.push(None);
    }
    for size in cases {
        let mut spec = spec.clone();
        spec.size = size.clone();
        let m = p
            .create(&spec, None)
            .await
            .unwrap_or_else(|e| panic!("{p}: create with awkward labels failed: {e}"));
        let got = fx.get(p, &m.provider_id).await;
        let found = p
            .find(&spec.name)
            .await
            .unwrap_or_else(|e| panic!("{p}: find failed: {e}"))
            .unwrap_or_else(|| panic!("{p}: find misses {}", spec.name));
        let listed = p
            .list(&fx.case_selector("honoured"))
            .await
            .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
        fx.cleanup(p, &m).await;
        let listed = listed
            .into_iter()
            .find(|l| l.provider_id == m.provider_id)
            .unwrap_or_else(|| panic!("{p}: list by labels misses {}", spec.name));
        for (how, seen) in [("get", &got), ("find", &found), ("list", &listed)] {
            for (k, v) in &spec.labels {
                assert_eq!(
                    seen.labels.get(k),
                    Some(v),
                    "{p}: the spec is not honoured: {how} reads label {k} as {:?}, not {v:?}",
                    seen.labels.get(k)
                );
            }
            if let Some(size) = &size {
                assert_eq!(
                    seen.size.as_ref(),
                    Some(size),
                    "{p}: the spec is not honoured: {how} reads the size as {:?}, not {size:?}",
                    seen.size
                );
            }
        }
    }

    if fx.sizes.is_empty() {
        let spec = fx.spec("no-size").with_size("conformance-size");
        match p.create(&spec, None).await {
            Ok(m) => {
                fx.cleanup(p, &m).await;
                panic!(
                    "{p}: the spec is not honoured: a size was accepted by a provider whose fixture lists none"
                );
            }
            Err(e) => assert!(
                e.kind() == ErrorKind::InvalidSpec && e.field() == Some("size"),
                "{p}: a size it does not take is not refused as an invalid spec on size: {e}"
            ),
        }
        assert_not_created(p, &spec.name, "a machine was made for a refused size").await;
    }

    let spec = fx.spec("unicode").with_label("team", "café");
    match p.create(&spec, None).await {
        Ok(m) => {
            fx.cleanup(p, &m).await;
            panic!("{p}: a label value the spec cannot hold (non-ASCII) was accepted");
        }
        Err(e) => assert!(
            e.kind() == ErrorKind::InvalidSpec && e.field() == Some("labels.team"),
            "{p}: a non-ASCII label is not refused as an invalid spec on labels.team: {e}"
        ),
    }
    assert_not_created(p, &spec.name, "a machine was made for a refused label").await;
}

/// Names are matched exactly: `find` of a name that is a prefix, an extension or a
/// near miss of an existing machine's name returns nothing, and `create` of it makes a
/// new machine instead of adopting the other. Names of the longest length that differ
/// only in their last character, or only in the middle, are two machines.
pub async fn names_are_exact(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let room = MAX_LABEL_LEN - fx.prefix.len() - 1;
    let long = |last: char| format!("{}{last}", "l".repeat(room - 1));
    let pairs = [
        ("n1".to_owned(), "n10".to_owned()),
        ("n10".to_owned(), "n1".to_owned()),
        ("m-a-x".to_owned(), "m-b-x".to_owned()),
        (long('a'), long('b')),
    ];
    let mut made: Vec<Machine> = Vec::new();
    let mut broken = None;
    for (first, second) in pairs {
        let a = fx.name(&first);
        let b = fx.name(&second);
        let ma = match made.iter().find(|m| m.name == a) {
            Some(m) => m.clone(),
            None => {
                let (_, m) = fx.create(p, &first).await;
                made.push(m.clone());
                m
            }
        };
        let found = p
            .find(&b)
            .await
            .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
        let already = made.iter().find(|m| m.name == b).cloned();
        match (found, &already) {
            (Some(f), None) => {
                broken = Some(format!(
                    "find({b}) returned {} named {}, with no machine of that name",
                    f.provider_id, f.name
                ));
                break;
            }
            (Some(f), Some(mb)) if f.provider_id != mb.provider_id => {
                broken = Some(format!("find({b}) returned the machine of {}", f.name));
                break;
            }
            _ => {}
        }
        if already.is_none() {
            let (_, mb) = fx.create(p, &second).await;
            made.push(mb.clone());
            if mb.provider_id == ma.provider_id {
                broken = Some(format!("create({b}) adopted the machine named {a}"));
                break;
            }
        }
    }
    for m in &made {
        fx.cleanup(p, m).await;
    }
    if let Some(broken) = broken {
        panic!("{p}: names are not exact: {broken}");
    }
    // A name never created is not found, even when every other one exists around it.
    let none = MachineName::new(format!("{}-n", fx.prefix)).expect("a DNS label");
    assert!(
        p.find(&none)
            .await
            .unwrap_or_else(|e| panic!("{p}: find failed: {e}"))
            .is_none(),
        "{p}: names are not exact: find({none}) returned a machine"
    );
}

/// After `delete`, `get` reports `Deleting`, `Deleted` or not found, and never a
/// running machine again, until the machine is gone (within the fixture's timeout);
/// `find` returns nothing or the machine in `Deleting`.
pub async fn delete_is_seen(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let (spec, m) = fx.create(p, "delete-seen").await;
    fx.wait_for(p, &m.provider_id, "running", Phase::is_running)
        .await;
    p.delete(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: delete failed: {e}"));
    let deadline = tokio::time::Instant::now() + fx.timeout;
    loop {
        match p.get(&m.provider_id).await {
            Ok(g) if g.phase == Phase::Deleted => break,
            Ok(g) => assert_eq!(
                g.phase,
                Phase::Deleting,
                "{p}: delete is not seen: get reports {} after delete returned",
                g.phase
            ),
            Err(e) if e.kind() == ErrorKind::NotFound => break,
            Err(e) if e.is_retryable() => {}
            Err(e) => panic!("{p}: get after delete failed: {e}"),
        }
        if let Some(f) = p
            .find(&spec.name)
            .await
            .unwrap_or_else(|e| panic!("{p}: find failed: {e}"))
        {
            assert_eq!(
                f.phase,
                Phase::Deleting,
                "{p}: delete is not seen: find reports {} after delete returned",
                f.phase
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{p}: machine {} was not gone {:?} after delete",
            m.provider_id,
            fx.timeout
        );
        tokio::time::sleep(fx.poll).await;
    }
}

/// Where power operations are declared and the fixture has a connector, they have
/// effect on the machine, not only on its phase: a stopped machine cannot be reached
/// over its transport, and a started one can again (a command runs).
pub async fn power_has_effect(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let power = p.capabilities().power;
    let Some(connector) = fx.connector.clone() else {
        return;
    };
    if !power.stop {
        return;
    }
    let (_, m) = fx.create(p, "power-effect").await;
    let id = &m.provider_id;
    let running = fx.wait_for(p, id, "running", Phase::is_running).await;
    reachable(p, fx, connector.as_ref(), &running, "before a stop").await;
    p.power(id, PowerOp::Stop)
        .await
        .unwrap_or_else(|e| panic!("{p}: power Stop failed: {e}"));
    let stopped = fx
        .wait_for(p, id, "Stopped after a stop", |ph| ph == Phase::Stopped)
        .await;
    // The stopped machine as it was last reached: its old access, which must not answer.
    let ran = tokio::time::timeout(fx.timeout, async {
        let t = connector.connect(&running).await?;
        t.exec(&ExecRequest::new("true").timeout(Duration::from_secs(5)))
            .await
    })
    .await;
    if let Ok(Ok(out)) = ran {
        fx.cleanup(p, &stopped).await;
        panic!(
            "{p}: power has no effect: a machine reported Stopped still runs commands (status {:?})",
            out.status
        );
    }
    if power.start {
        p.power(id, PowerOp::Start)
            .await
            .unwrap_or_else(|e| panic!("{p}: power Start failed: {e}"));
        let again = fx
            .wait_for(p, id, "running after a start", Phase::is_running)
            .await;
        reachable(p, fx, connector.as_ref(), &again, "after a start").await;
    }
    fx.cleanup(p, &m).await;
}

/// Connects to `m` and runs `true`, retrying retryable errors within the boot timeout.
async fn reachable(
    p: &dyn MachineProvisioner,
    fx: &Fixture,
    connector: &dyn crate::Connector,
    m: &Machine,
    when: &str,
) {
    let deadline = tokio::time::Instant::now() + fx.boot_timeout;
    loop {
        let tried = async {
            let t = connector.connect(m).await?;
            t.exec(&ExecRequest::new("true")).await
        }
        .await;
        match tried {
            Ok(out) if out.success() => return,
            Ok(out) => panic!("{p}: `true` exited {:?} on {} {when}", out.status, m.name),
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(fx.poll).await;
            }
            Err(e) => panic!("{p}: machine {} cannot be reached {when}: {e}", m.name),
        }
    }
}

/// `bootstrap_finished` withdraws the user data where the capabilities say so: then
/// `user_data` reads `None`, through whatever wraps the provider (a wrapper that does not
/// forward the call fails here). Where not declared, the user data stays readable as it
/// was.
pub async fn bootstrap_finished_withdraws_user_data(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let Some(format) = sample_format(p.capabilities()) else {
        return;
    };
    let withdraws = p.capabilities().withdraws_user_data;
    let ud = sample_user_data(format, &fx.prefix);
    let spec = fx.spec("withdrawn");
    let m = p
        .create(&spec, Some(&ud))
        .await
        .unwrap_or_else(|e| panic!("{p}: create with user data failed: {e}"));
    let running = fx
        .wait_for(p, &m.provider_id, "running", Phase::is_running)
        .await;
    let finished = p.bootstrap_finished(&running).await;
    let back = p.user_data(&m.provider_id).await;
    fx.cleanup(p, &m).await;
    finished.unwrap_or_else(|e| panic!("{p}: bootstrap_finished failed: {e}"));
    let back = back.unwrap_or_else(|e| panic!("{p}: user_data failed: {e}"));
    if withdraws {
        assert!(
            back.is_none(),
            "{p}: declares withdraws_user_data, but the user data is still readable after bootstrap_finished (does a wrapper not forward it?)"
        );
    } else if let Some(back) = back {
        assert_eq!(
            back.decoded().unwrap_or_else(|e| panic!("{p}: {e}")),
            ud.bytes,
            "{p}: user data changed after bootstrap_finished, though withdraws_user_data is not declared"
        );
    }
}
