//! The provider conformance suite: the [`MachineProvisioner`] contract as code.
//!
//! Like object_store's integration module, these are public async functions that every
//! provider's tests call against its simulator or a real backend. A provider written by
//! a stranger proves itself by passing them. They panic with a message naming the broken
//! promise, as test helpers do, and clean up what they create.
//!
//! Call [`run_all`] for one test that runs every case in turn, or
//! [`conformance_tests!`](crate::conformance_tests) to generate one `#[tokio::test]` per
//! case, so that a run shows every broken promise at once.
//!
//! ```no_run
//! # async fn demo() {
//! use std::sync::Arc;
//! use machine_core::conformance::{self, Clients, Fixture};
//! use machine_core::sim::{SimCloud, SimConfig, SimProvider};
//!
//! let cloud = SimCloud::new();
//! let sim = |owner: &str| {
//!     let config = SimConfig::default().with_owner(owner);
//!     Arc::new(SimProvider::new(cloud.clone(), config).unwrap())
//! };
//! let clients = Clients::new(sim("me"), sim("me"), sim("someone-else"));
//! let fixture = Fixture::new("sim:///m-none", |name| machine_core::MachineSpec::new(name.clone()));
//! conformance::run_all(&clients, &fixture).await;
//! # }
//! ```
//!
//! The suite is unstable: a case may be added in any release, as the contract is written
//! down further. A provider that fails a new case had a bug the suite did not see before.

mod bad_input;
mod crash;
mod faults;
mod fixture;
mod promises;
mod replicas;

pub use bad_input::{BadInput, CASE_TIME, MAX_MESSAGE, check_bad_inputs, cpu_time};
pub use crash::{create_survives_a_crash_at_any_point, delete_survives_a_crash_at_any_point};
pub use faults::{BackendFault, FaultHook, backend_faults_come_back_with_their_kind};
pub use fixture::{Clients, Fixture, FreshProvider};
pub use promises::{
    bootstrap_finished_withdraws_user_data, delete_is_seen, names_are_exact, power_has_effect,
    running_machines_say_how_to_reach_them, the_spec_is_honoured,
};
pub use replicas::replicas_creating_one_name_make_one_machine;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::capabilities::{Capabilities, PowerOp};
use crate::composer::Composer;
use crate::error::{ErrorKind, Result};
use crate::machine::{Labels, Machine, Phase, ProviderId};
use crate::name::MachineName;
use crate::provisioner::MachineProvisioner;
use crate::spec::MachineSpec;
use crate::steps::{Step, StepLayer};
use crate::user_data::{self, UserData, UserDataFormat};

/// The user-data format the suite sends: cloud-config where the provider takes it,
/// else the first format it declares.
fn sample_format(caps: &Capabilities) -> Option<UserDataFormat> {
    let formats = &caps.user_data.as_ref()?.formats;
    formats
        .iter()
        .copied()
        .find(|f| *f == UserDataFormat::CloudConfig)
        .or_else(|| formats.first().copied())
}

/// A small document of `format` that a provider declaring the format must accept.
fn sample_user_data(format: UserDataFormat, marker: &str) -> UserData {
    let text = match format {
        UserDataFormat::CloudConfig => {
            format!("#cloud-config\n# conformance {marker}\nruncmd:\n  - [echo, \"a: b # c\"]\n")
        }
        UserDataFormat::ShellScript => format!("#!/bin/sh\n# conformance {marker}\necho ok\n"),
        UserDataFormat::CloudBoothook => {
            format!("#cloud-boothook\n#!/bin/sh\n# conformance {marker}\n")
        }
        UserDataFormat::Jinja2 => format!("## template: jinja\n#cloud-config\n# {marker}\n"),
        UserDataFormat::Ignition => format!(
            "{{\"ignition\":{{\"version\":\"3.4.0\"}},\"storage\":{{\"files\":[{{\"path\":\"/etc/{marker}\"}}]}}}}"
        ),
        UserDataFormat::PowerShell => format!("<powershell>\n# {marker}\n</powershell>\n"),
        UserDataFormat::Mime | UserDataFormat::Raw => format!("conformance {marker}\n"),
    };
    UserData::new(format, text)
}

/// Create, get, find, list and delete one machine, checking each answer; after the
/// delete, `get` says not found or `Deleted`, and `find`/`list` no longer return it.
pub async fn create_get_find_list_delete(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let spec = fx.spec("crud");
    let none = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    assert!(
        none.is_none(),
        "{p}: find({}) returned a machine before create",
        spec.name
    );

    let m = p
        .create(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    assert_eq!(m.name, spec.name, "{p}: created machine has another name");
    assert!(
        !m.provider_id.scheme().is_empty(),
        "{p}: provider ID has no scheme"
    );
    assert_ne!(m.phase, Phase::Deleted, "{p}: a new machine is Deleted");

    let got = p
        .get(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: get failed: {e}"));
    assert_eq!(got.name, spec.name, "{p}: get returned another machine");
    assert_eq!(got.provider_id, m.provider_id);

    let found = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    assert_eq!(
        found.map(|f| f.provider_id),
        Some(m.provider_id.clone()),
        "{p}: find by name does not return the created machine"
    );

    let listed = p
        .list(&fx.run_selector())
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    assert!(
        listed.iter().any(|l| l.provider_id == m.provider_id),
        "{p}: list by the run's label misses the created machine"
    );
    for l in &listed {
        assert_eq!(
            l.labels.get("conformance-run"),
            Some(&fx.prefix),
            "{p}: list returned a machine without the selected label"
        );
    }

    p.delete(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: delete failed: {e}"));
    fx.wait_gone(p, &m.provider_id).await;
    match p.get(&m.provider_id).await {
        Ok(g) => assert_eq!(
            g.phase,
            Phase::Deleted,
            "{p}: get after delete reports a gone machine in phase {}",
            g.phase
        ),
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{p}: get after delete: {e}"),
    }
    let after = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    assert!(after.is_none(), "{p}: find still returns a deleted machine");
    let listed = p
        .list(&fx.run_selector())
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    assert!(
        listed.iter().all(|l| l.provider_id != m.provider_id),
        "{p}: list still returns a deleted machine"
    );
}

/// The spec's labels come back whole from `create`, `get`, `find` and `list`.
pub async fn labels_round_trip(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let spec = fx
        .spec("labels")
        .with_label("tier", "web")
        .with_label("team", "a.b-c_d");
    let m = p
        .create(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    let got = p
        .get(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: get failed: {e}"));
    let found = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"))
        .unwrap_or_else(|| panic!("{p}: find misses {}", spec.name));
    let listed = p
        .list(&fx.case_selector("labels"))
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    for (what, labels) in [
        ("create", &m.labels),
        ("get", &got.labels),
        ("find", &found.labels),
    ]
    .into_iter()
    .chain(listed.iter().map(|l| ("list", &l.labels)))
    {
        for (k, v) in &spec.labels {
            assert_eq!(
                labels.get(k),
                Some(v),
                "{p}: labels do not round-trip: {what} lost label {k}={v}"
            );
        }
    }
    fx.cleanup(p, &m).await;
}

/// List selects by every label of the selector.
pub async fn list_selects_by_labels(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let a = fx.spec("list-a").with_label("tier", "web");
    let b = fx.spec("list-b").with_label("tier", "db");
    let ma = p
        .create(&a, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    let mb = p
        .create(&b, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    let mut selector = fx.run_selector();
    selector.insert("tier".into(), "web".into());
    let listed = p
        .list(&selector)
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    let ids: Vec<_> = listed.iter().map(|m| &m.provider_id).collect();
    assert!(
        ids.contains(&&ma.provider_id),
        "{p}: list misses a machine with the selected labels"
    );
    assert!(
        !ids.contains(&&mb.provider_id),
        "{p}: list returns a machine without the selected labels"
    );
    fx.cleanup(p, &ma).await;
    fx.cleanup(p, &mb).await;
}

/// List returns machines in name order, whatever order they were created in.
pub async fn list_is_in_name_order(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let (_, second) = fx.create(p, "order-b").await;
    let (_, first) = fx.create(p, "order-a").await;
    let listed = p
        .list(&fx.run_selector())
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    let names: Vec<_> = listed.iter().map(|m| m.name.as_str().to_owned()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "{p}: list is not in name order");
    fx.cleanup(p, &first).await;
    fx.cleanup(p, &second).await;
}

/// A second create with the same name returns the first machine and makes no other.
pub async fn create_twice_gives_one_machine(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let spec = fx.spec("twice");
    let first = p
        .create(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    let second = p
        .create(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("{p}: second create failed: {e}"));
    assert_eq!(
        first.provider_id, second.provider_id,
        "{p}: a second create made a second machine"
    );
    let listed = p
        .list(&fx.case_selector("twice"))
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    assert_eq!(
        listed.len(),
        1,
        "{p}: {} machines named {} exist",
        listed.len(),
        spec.name
    );
    fx.cleanup(p, &first).await;
}

/// Two clients of one owner creating one name at the same moment end with one machine
/// that is not being deleted, and both are told its ID.
pub async fn concurrent_creates_make_one_machine(c: &Clients, fx: &Fixture) {
    let (p, r) = (c.provider.as_ref(), c.replica.as_ref());
    let spec = fx.spec("race");
    let (a, b) = tokio::join!(p.create(&spec, None), r.create(&spec, None));
    let a = a.unwrap_or_else(|e| panic!("{p}: create failed: {e}"));
    let b = b.unwrap_or_else(|e| panic!("{r}: concurrent create failed: {e}"));
    let listed = p
        .list(&fx.case_selector("race"))
        .await
        .unwrap_or_else(|e| panic!("{p}: list failed: {e}"));
    // A duplicate the provider is already deleting (it settled the race itself) does
    // not count; one left standing does.
    let count = listed
        .iter()
        .filter(|m| !matches!(m.phase, Phase::Deleting | Phase::Deleted))
        .count();
    for m in &listed {
        fx.cleanup(p, m).await;
    }
    assert_eq!(
        count, 1,
        "{p}: two concurrent creates of one name made {count} machines"
    );
    assert_eq!(
        a.provider_id, b.provider_id,
        "{p}: two concurrent creates of one name were told different machines"
    );
}

/// Deleting twice, and deleting what is gone, succeed.
pub async fn delete_twice_succeeds(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let (_, m) = fx.create(p, "delete-twice").await;
    p.delete(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: delete failed: {e}"));
    p.delete(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: second delete failed: {e}"));
    fx.wait_gone(p, &m.provider_id).await;
    p.delete(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: delete of a gone machine failed: {e}"));
}

/// Telling a provider twice that a running machine's bootstrap finished succeeds both
/// times and leaves the machine running and found by its name: the composer may say it
/// again after a restart or a retry.
pub async fn bootstrap_finished_is_idempotent(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let (spec, m) = fx.create(p, "finished").await;
    let running = fx
        .wait_for(p, &m.provider_id, "running", Phase::is_running)
        .await;
    for time in ["first", "second"] {
        p.bootstrap_finished(&running)
            .await
            .unwrap_or_else(|e| panic!("{p}: bootstrap_finished failed the {time} time: {e}"));
    }
    let after = fx.get(p, &m.provider_id).await;
    assert!(
        after.phase.is_running(),
        "{p}: bootstrap_finished stopped the machine: {}",
        after.phase
    );
    let found = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    assert_eq!(
        found.map(|f| f.provider_id),
        Some(m.provider_id.clone()),
        "{p}: the machine is not found by its name after bootstrap_finished"
    );
    fx.cleanup(p, &m).await;
}

/// An unknown ID is not-found for get, and deleting it succeeds.
pub async fn unknown_id_is_not_found(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let e = p
        .get(&fx.unknown_id)
        .await
        .expect_err("get of an unknown id succeeded");
    assert_eq!(
        e.kind(),
        ErrorKind::NotFound,
        "{p}: get of an unknown id: {e}"
    );
    p.delete(&fx.unknown_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: delete of an unknown id failed: {e}"));
}

/// A new client instance (a restarted process) finds the machine an old one made and
/// adopts it on create instead of making another.
pub async fn new_client_adopts(c: &Clients, fx: &Fixture) {
    let (old, new) = (c.provider.as_ref(), c.replica.as_ref());
    let (spec, m) = fx.create(old, "adopt").await;
    let found = new
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{new}: find failed: {e}"));
    assert_eq!(
        found.map(|f| f.provider_id),
        Some(m.provider_id.clone()),
        "{new}: a new client does not find the old client's machine"
    );
    let again = new
        .create(&spec, None)
        .await
        .unwrap_or_else(|e| panic!("{new}: create failed: {e}"));
    assert_eq!(
        again.provider_id, m.provider_id,
        "{new}: a new client made a second machine instead of adopting"
    );
    fx.cleanup(new, &m).await;
}

/// Two owners on one backend never see each other's machines: another owner's `find`
/// and `list` do not return them, its `get` says not found, and its `delete` leaves
/// them alone (succeeding quietly or failing with a conflict).
pub async fn owners_never_see_each_other(c: &Clients, fx: &Fixture) {
    let (p, other) = (c.provider.as_ref(), c.other_owner.as_ref());
    let (spec, m) = fx.create(p, "owner").await;
    let found = other
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{other}: find failed: {e}"));
    assert!(
        found.is_none(),
        "{other}: find returns another owner's machine {}",
        m.provider_id
    );
    let listed = other
        .list(&fx.run_selector())
        .await
        .unwrap_or_else(|e| panic!("{other}: list failed: {e}"));
    assert!(
        listed.iter().all(|l| l.provider_id != m.provider_id),
        "{other}: list returns another owner's machine {}",
        m.provider_id
    );
    match other.get(&m.provider_id).await {
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Ok(_) => panic!(
            "{other}: get returns another owner's machine {}",
            m.provider_id
        ),
        Err(e) => panic!("{other}: get of another owner's machine: {e}"),
    }
    // Either answer keeps the promise: a quiet success, or a conflict that says whose it
    // is. What matters is that the machine stays.
    if let Err(e) = other.delete(&m.provider_id).await {
        assert_eq!(
            e.kind(),
            ErrorKind::Conflict,
            "{other}: delete of another owner's machine: {e}"
        );
    }
    let still = p
        .get(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: get failed: {e}"));
    assert!(
        !matches!(still.phase, Phase::Deleting | Phase::Deleted),
        "{other}: delete removed another owner's machine {}",
        m.provider_id
    );
    fx.cleanup(p, &m).await;
}

/// A new machine runs (phase Provisioned or later) within the fixture's boot timeout,
/// and its phase moves forward, never back.
pub async fn machines_reach_running(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let (_, m) = fx.create(p, "boot").await;
    let deadline = tokio::time::Instant::now() + fx.boot_timeout;
    let mut last = m.phase;
    loop {
        let got = match p.get(&m.provider_id).await {
            Ok(got) => got,
            Err(e) if e.is_retryable() => {
                tokio::time::sleep(fx.poll).await;
                continue;
            }
            Err(e) => panic!("{p}: get failed while the machine boots: {e}"),
        };
        assert_ne!(
            got.phase,
            Phase::Failed,
            "{p}: the machine failed to boot: {:?}",
            got.failure
        );
        assert!(
            rank(got.phase) >= rank(last),
            "{p}: phase went back from {last} to {}",
            got.phase
        );
        last = got.phase;
        if got.phase.is_running() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{p}: machine never reached running within {:?}: still {}",
            fx.boot_timeout,
            got.phase
        );
        tokio::time::sleep(fx.poll).await;
    }
    fx.cleanup(p, &m).await;
}

fn rank(phase: Phase) -> u8 {
    match phase {
        Phase::Pending => 0,
        Phase::Provisioning => 1,
        _ => 2,
    }
}

/// Power operations the capabilities declare work as their names say: after a stop, get
/// reports the machine [`Phase::Stopped`] (not Provisioning, not Failed) within the boot
/// timeout; after a start, and after a reboot, it runs again within the boot timeout.
/// A provider declaring no power operation passes without a machine.
pub async fn declared_power_operations_work(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let power = p.capabilities().power;
    if !(power.stop || power.reboot) {
        return;
    }
    let (_, m) = fx.create(p, "power").await;
    let id = &m.provider_id;
    fx.wait_for(p, id, "running", Phase::is_running).await;
    if power.stop {
        p.power(id, PowerOp::Stop)
            .await
            .unwrap_or_else(|e| panic!("{p}: power Stop, which it declares, failed: {e}"));
        let stopped = fx
            .wait_for(p, id, "Stopped after a stop", |ph| ph == Phase::Stopped)
            .await;
        assert!(!stopped.phase.is_running(), "{p}: a stopped machine runs");
        if power.start {
            p.power(id, PowerOp::Start)
                .await
                .unwrap_or_else(|e| panic!("{p}: power Start, which it declares, failed: {e}"));
            fx.wait_for(p, id, "running after a start", Phase::is_running)
                .await;
        }
    }
    if power.reboot && fx.get(p, id).await.phase.is_running() {
        p.power(id, PowerOp::Reboot)
            .await
            .unwrap_or_else(|e| panic!("{p}: power Reboot, which it declares, failed: {e}"));
        fx.wait_for(p, id, "running after a reboot", Phase::is_running)
            .await;
    }
    fx.cleanup(p, &m).await;
}

/// Power operations the capabilities deny are refused with an error that is not
/// worth retrying; console output is returned only where declared.
pub async fn undeclared_operations_are_refused(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let caps = p.capabilities().clone();
    let (_, m) = fx.create(p, "ops").await;
    for op in [PowerOp::Start, PowerOp::Stop, PowerOp::Reboot] {
        if caps.power.supports(op) {
            continue;
        }
        match p.power(&m.provider_id, op).await {
            Ok(()) => panic!("{p}: power {op:?} succeeded though capabilities deny it"),
            Err(e) => assert!(
                !e.is_retryable(),
                "{p}: an unsupported power {op:?} is a retryable error: {e}"
            ),
        }
    }
    if !caps.console_output {
        match p.console_output(&m.provider_id).await {
            Ok(Some(_)) => {
                panic!("{p}: console output returned though capabilities deny it")
            }
            Ok(None) => {}
            Err(e) => assert!(
                !e.is_retryable(),
                "{p}: undeclared console output is a retryable error: {e}"
            ),
        }
    }
    fx.cleanup(p, &m).await;
}

/// User data in a format the provider declares reads back the same, where the
/// provider can show it; a provider that takes no user data refuses it before making
/// a machine.
pub async fn user_data_round_trips(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let Some(format) = sample_format(p.capabilities()) else {
        let spec = fx.spec("no-userdata");
        let ud = UserData::new(UserDataFormat::ShellScript, "#!/bin/sh\necho no\n");
        let e = p
            .create(&spec, Some(&ud))
            .await
            .expect_err("a provider without user data accepted user data");
        assert_eq!(
            e.kind(),
            ErrorKind::InvalidSpec,
            "{p}: user data refused: {e}"
        );
        assert_not_created(p, &spec.name, "a machine was made for refused user data").await;
        return;
    };
    let ud = sample_user_data(format, &fx.prefix);
    let m = p
        .create(&fx.spec("userdata"), Some(&ud))
        .await
        .unwrap_or_else(|e| panic!("{p}: create with {format:?} user data failed: {e}"));
    let back = p
        .user_data(&m.provider_id)
        .await
        .unwrap_or_else(|e| panic!("{p}: user_data failed: {e}"));
    if let Some(back) = back {
        assert_eq!(
            back.decoded().unwrap_or_else(|e| panic!("{p}: {e}")),
            ud.bytes,
            "{p}: user data does not round-trip"
        );
    }
    fx.cleanup(p, &m).await;
}

/// User data over the declared limit is refused with an invalid-spec error on
/// `userData` before any API call, by the composer; and by the provider itself when
/// handed such data directly.
pub async fn oversized_user_data_is_refused_before_any_call(c: &Clients, fx: &Fixture) {
    let p = c.provider.clone();
    let Some(delivery) = p.capabilities().user_data.clone() else {
        return;
    };
    let Some(format) = sample_format(p.capabilities()) else {
        return;
    };
    let counting = Arc::new(Counting {
        inner: p.clone(),
        calls: AtomicU64::new(0),
    });
    // Random alphanumerics barely compress, so gzip cannot save it.
    let noise: String = (0..delivery.max_bytes * 2)
        .map(|_| fastrand::alphanumeric())
        .collect();
    let layer = StepLayer::new("noise", vec![Step::write_file("/etc/noise", noise.clone())])
        .expect("valid layer");
    let composer = Composer::builder(counting.clone())
        .coupled(Arc::new(layer))
        .build()
        .expect("composer");
    let spec = fx.spec("oversized");
    let e = composer
        .provision(&spec, &CancellationToken::new())
        .await
        .expect_err("oversized user data was accepted");
    assert_eq!(
        e.kind(),
        ErrorKind::InvalidSpec,
        "{p}: oversized user data: {e}"
    );
    assert_eq!(
        e.field(),
        Some("userData"),
        "{p}: oversized user data error names no field: {e}"
    );
    assert_eq!(
        counting.calls.load(Ordering::SeqCst),
        0,
        "{p}: API calls were made for user data that cannot fit"
    );

    let mut direct = sample_user_data(format, &noise);
    direct.format = format;
    let e = p
        .create(&spec, Some(&direct))
        .await
        .expect_err("provider accepted user data over its limit");
    assert_eq!(
        e.kind(),
        ErrorKind::InvalidSpec,
        "{p}: oversized user data: {e}"
    );
    assert_not_created(
        p.as_ref(),
        &spec.name,
        "a machine was created with refused user data",
    )
    .await;
}

/// User data the provider does not declare (any at all when it declares no delivery, a
/// format outside its list otherwise) is refused as an invalid spec on `userData`, and
/// no machine is made.
pub async fn undeclared_user_data_is_refused(c: &Clients, fx: &Fixture) {
    let p = c.provider.as_ref();
    let undeclared = match &p.capabilities().user_data {
        None => Some(UserDataFormat::CloudConfig),
        Some(d) => UserDataFormat::ALL
            .into_iter()
            .find(|f| !d.formats.contains(f)),
    };
    let Some(format) = undeclared else {
        return;
    };
    let spec = fx.spec("undeclared");
    let created = p
        .create(&spec, Some(&sample_user_data(format, "undeclared")))
        .await;
    let e = match created {
        Ok(m) => {
            fx.cleanup(p, &m).await;
            panic!("{p}: user data of undeclared format {format:?} was accepted");
        }
        Err(e) => e,
    };
    assert!(
        e.kind() == ErrorKind::InvalidSpec && e.field() == Some(user_data::USER_DATA_FIELD),
        "{p}: user data of undeclared format {format:?} was not refused as an invalid spec on userData: {e}"
    );
    assert_not_created(
        p,
        &spec.name,
        "a machine was created with undeclared user data",
    )
    .await;
}

/// A provision cancelled just after the create call leaves a machine that deprovision
/// finds and deletes.
pub async fn cancelled_provision_is_found_by_deprovision(c: &Clients, fx: &Fixture) {
    let p = c.provider.clone();
    let cancel = CancellationToken::new();
    let wrapper = Arc::new(CancelAfterCreate {
        inner: p.clone(),
        cancel: cancel.clone(),
    });
    let composer = Composer::builder(wrapper).build().expect("composer");
    let spec = fx.spec("cancel");
    let e = composer
        .provision(&spec, &cancel)
        .await
        .expect_err("a cancelled provision succeeded");
    assert_eq!(
        e.kind(),
        ErrorKind::Cancelled,
        "{p}: cancelled provision: {e}"
    );
    let found = p
        .find(&spec.name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    let m = found.unwrap_or_else(|| {
        panic!("{p}: the machine created before cancellation cannot be found by name")
    });
    let composer = Composer::builder(p.clone()).build().expect("composer");
    composer
        .deprovision(&spec.name, &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("{p}: deprovision after cancellation failed: {e}"));
    fx.wait_gone(p.as_ref(), &m.provider_id).await;
    assert!(
        p.find(&spec.name)
            .await
            .unwrap_or_else(|e| panic!("{p}: find failed: {e}"))
            .is_none()
    );
}

/// Runs every case in turn, stopping at the first broken promise. For one test per
/// case, use [`conformance_tests!`](crate::conformance_tests).
pub async fn run_all(c: &Clients, fx: &Fixture) {
    unknown_id_is_not_found(c, fx).await;
    create_get_find_list_delete(c, fx).await;
    labels_round_trip(c, fx).await;
    list_selects_by_labels(c, fx).await;
    list_is_in_name_order(c, fx).await;
    create_twice_gives_one_machine(c, fx).await;
    concurrent_creates_make_one_machine(c, fx).await;
    delete_twice_succeeds(c, fx).await;
    new_client_adopts(c, fx).await;
    owners_never_see_each_other(c, fx).await;
    machines_reach_running(c, fx).await;
    bootstrap_finished_is_idempotent(c, fx).await;
    declared_power_operations_work(c, fx).await;
    undeclared_operations_are_refused(c, fx).await;
    user_data_round_trips(c, fx).await;
    oversized_user_data_is_refused_before_any_call(c, fx).await;
    undeclared_user_data_is_refused(c, fx).await;
    cancelled_provision_is_found_by_deprovision(c, fx).await;
    running_machines_say_how_to_reach_them(c, fx).await;
    the_spec_is_honoured(c, fx).await;
    names_are_exact(c, fx).await;
    delete_is_seen(c, fx).await;
    power_has_effect(c, fx).await;
    bootstrap_finished_withdraws_user_data(c, fx).await;
    backend_faults_come_back_with_their_kind(c, fx).await;
    create_survives_a_crash_at_any_point(c, fx).await;
    delete_survives_a_crash_at_any_point(c, fx).await;
    replicas_creating_one_name_make_one_machine(c, fx).await;
}

/// Generates one `#[tokio::test]` per conformance case, in a module named
/// `conformance_cases`. `$setup` is an async function returning `(Clients, Fixture, G)`,
/// where `G` is anything the backend needs kept alive for the test (a simulator
/// process, a temporary directory; `()` when nothing). The calling crate needs tokio
/// with its `macros` and `rt-multi-thread` features as a dev-dependency: each test runs
/// on a multi-threaded runtime of two workers, as the replica case needs.
///
/// ```no_run
/// use std::sync::Arc;
/// use machine_core::conformance::{Clients, Fixture};
/// use machine_core::sim::{SimCloud, SimConfig, SimProvider};
/// use machine_core::MachineSpec;
///
/// async fn setup() -> (Clients, Fixture, ()) {
///     let cloud = SimCloud::new();
///     let sim = |owner: &str| {
///         let config = SimConfig::default().with_owner(owner);
///         Arc::new(SimProvider::new(cloud.clone(), config).unwrap())
///     };
///     let clients = Clients::new(sim("me"), sim("me"), sim("them"));
///     let fixture = Fixture::new("sim:///m-none", |name| MachineSpec::new(name.clone()));
///     (clients, fixture, ())
/// }
///
/// machine_core::conformance_tests!(setup);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($setup:ident) => {
        $crate::conformance_tests!(@cases $setup;
            unknown_id_is_not_found,
            create_get_find_list_delete,
            labels_round_trip,
            list_selects_by_labels,
            list_is_in_name_order,
            create_twice_gives_one_machine,
            concurrent_creates_make_one_machine,
            delete_twice_succeeds,
            new_client_adopts,
            owners_never_see_each_other,
            machines_reach_running,
            bootstrap_finished_is_idempotent,
            declared_power_operations_work,
            undeclared_operations_are_refused,
            user_data_round_trips,
            oversized_user_data_is_refused_before_any_call,
            undeclared_user_data_is_refused,
            cancelled_provision_is_found_by_deprovision,
            running_machines_say_how_to_reach_them,
            the_spec_is_honoured,
            names_are_exact,
            delete_is_seen,
            power_has_effect,
            bootstrap_finished_withdraws_user_data,
            backend_faults_come_back_with_their_kind,
            create_survives_a_crash_at_any_point,
            delete_survives_a_crash_at_any_point,
            replicas_creating_one_name_make_one_machine,
        );
    };
    (@cases $setup:ident; $($case:ident),+ $(,)?) => {
        mod conformance_cases {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (clients, fixture, _keep) = super::$setup().await;
                    $crate::conformance::$case(&clients, &fixture).await;
                }
            )+
        }
    };
}

/// Panics naming `broken` when `p` finds a machine named `name`: a refused create must
/// make nothing.
async fn assert_not_created(p: &dyn MachineProvisioner, name: &MachineName, broken: &str) {
    let found = p
        .find(name)
        .await
        .unwrap_or_else(|e| panic!("{p}: find failed: {e}"));
    assert!(found.is_none(), "{p}: {broken}");
}

/// Counts calls to the provider (capabilities excluded).
struct Counting {
    inner: Arc<dyn MachineProvisioner>,
    calls: AtomicU64,
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

impl Counting {
    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl MachineProvisioner for Counting {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        self.tick();
        self.inner.create(spec, user_data).await
    }
    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        self.tick();
        self.inner.get(id).await
    }
    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        self.tick();
        self.inner.find(name).await
    }
    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        self.tick();
        self.inner.list(selector).await
    }
    async fn delete(&self, id: &ProviderId) -> Result<()> {
        self.tick();
        self.inner.delete(id).await
    }
    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        self.tick();
        self.inner.user_data(id).await
    }
    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        self.tick();
        self.inner.power(id, op).await
    }
    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        self.tick();
        self.inner.console_output(id).await
    }

    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        self.tick();
        self.inner.bootstrap_finished(machine).await
    }
}

/// Cancels a token as soon as a create call returns, then yields, so that the
/// provision that made the call sees the cancellation before it can go on.
struct CancelAfterCreate {
    inner: Arc<dyn MachineProvisioner>,
    cancel: CancellationToken,
}

impl fmt::Display for CancelAfterCreate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CancelAfterCreate({})", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl MachineProvisioner for CancelAfterCreate {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn create(&self, spec: &MachineSpec, user_data: Option<&UserData>) -> Result<Machine> {
        let r = self.inner.create(spec, user_data).await;
        self.cancel.cancel();
        tokio::task::yield_now().await;
        r
    }
    async fn get(&self, id: &ProviderId) -> Result<Machine> {
        self.inner.get(id).await
    }
    async fn find(&self, name: &MachineName) -> Result<Option<Machine>> {
        self.inner.find(name).await
    }
    async fn list(&self, selector: &Labels) -> Result<Vec<Machine>> {
        self.inner.list(selector).await
    }
    async fn delete(&self, id: &ProviderId) -> Result<()> {
        self.inner.delete(id).await
    }
    async fn user_data(&self, id: &ProviderId) -> Result<Option<UserData>> {
        self.inner.user_data(id).await
    }
    async fn power(&self, id: &ProviderId, op: PowerOp) -> Result<()> {
        self.inner.power(id, op).await
    }
    async fn console_output(&self, id: &ProviderId) -> Result<Option<String>> {
        self.inner.console_output(id).await
    }

    async fn bootstrap_finished(&self, machine: &Machine) -> Result<()> {
        self.inner.bootstrap_finished(machine).await
    }
}
