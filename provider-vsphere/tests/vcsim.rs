//! What vcsim shows of the provider beyond the conformance suite: guestinfo user data
//! and its scrub (read on the raw property), a guest IP appearing later, adoption after
//! a crash, racing controllers, bad input named by field, certificate pinning, an
//! expired session, hardware and size read from the VM, inventory paths looked up once,
//! and vCenter's refusals (through a proxy) leaving no VM.

mod common;

use std::sync::Arc;

use machine_core::{
    AddressKind, ContentEncoding, ErrorKind, Labels, MachineProvisioner, Phase, PowerOp, UserData,
    UserDataFormat,
};
use provider_vsphere::{CertFingerprint, VsphereProvider};

use common::Vcsim;
use common::admin::Admin;
use common::proxy::{Answer, FaultProxy};

fn cloud_config(marker: &str) -> UserData {
    let text = format!(
        "#cloud-config\n# {marker}\nwrite_files:\n{}",
        "  - {path: /etc/motd, content: hello}\n".repeat(40)
    );
    UserData::new(UserDataFormat::CloudConfig, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_data_round_trips_through_guestinfo_and_is_scrubbed() {
    let vcsim = Vcsim::start();
    let p = common::provider(&vcsim, &common::owner("guestinfo"));
    let admin = Admin::login(&vcsim).await;
    let ud = cloud_config("round-trip");
    let m = p
        .create(&common::spec_named("gi-1"), Some(&ud))
        .await
        .expect("create");

    let back = p
        .user_data(&m.provider_id)
        .await
        .expect("user_data")
        .expect("some");
    // Stored compressed, as cloud-init's VMware datasource reads gzip+base64.
    assert_eq!(back.encoding, ContentEncoding::Gzip);
    assert_eq!(back.decoded().unwrap(), ud.bytes);
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    let raw = admin.extra_config(&vm).await;
    for key in [
        "guestinfo.userdata",
        "guestinfo.userdata.encoding",
        "guestinfo.metadata",
        "guestinfo.metadata.encoding",
        "gzip+base64",
    ] {
        assert!(raw.contains(key), "extraConfig lacks {key}");
    }

    p.bootstrap_finished(&m).await.expect("scrub");
    assert!(
        p.user_data(&m.provider_id)
            .await
            .expect("user_data")
            .is_none(),
        "user data still readable after the scrub"
    );
    // Gone from the raw property too, not only shadowed by a later empty entry: what
    // anyone who may read the VM sees.
    let raw = admin.extra_config(&vm).await;
    assert!(
        !raw.contains("<key>guestinfo.userdata</key>")
            && !raw.contains("<key>guestinfo.userdata.encoding</key>"),
        "the user data is still in the VM's extraConfig: {raw}"
    );
    assert!(raw.contains("<key>guestinfo.metadata</key>"), "{raw}");
    // Scrubbing again is a no-op, and the machine is unharmed.
    p.bootstrap_finished(&m).await.expect("second scrub");
    assert!(admin.powered_on(&vm).await);
    p.delete(&m.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrub_the_server_does_not_take_is_an_error() {
    // Debian's vcsim 0.24.2 as it is: an extraConfig key set again is appended, so the
    // user data stays in the raw property however often it is set to "".
    let vcsim = Vcsim::start_appending();
    let p = common::provider(&vcsim, &common::owner("kept"));
    let admin = Admin::login(&vcsim).await;
    let m = p
        .create(&common::spec_named("kept-1"), Some(&cloud_config("kept")))
        .await
        .expect("create");
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    let before = admin.extra_config(&vm).await;
    let value = before
        .split("<key>guestinfo.userdata</key>")
        .nth(1)
        .and_then(|r| r.split('>').nth(1))
        .and_then(|r| r.split('<').next())
        .expect("the user data's value")
        .to_owned();
    assert!(value.len() > 20, "{value}");
    for attempt in ["first", "second"] {
        let e = p
            .bootstrap_finished(&m)
            .await
            .expect_err("a scrub that left the user data in extraConfig succeeded");
        assert_eq!(e.kind(), ErrorKind::Permanent, "{attempt}: {e}");
        assert!(e.to_string().contains("guestinfo.userdata"), "{e}");
        assert!(
            !e.to_string().contains(&value),
            "the error shows the user data: {e}"
        );
    }
    // The raw property does hold it: the error told the truth.
    assert!(admin.extra_config(&vm).await.contains(&value));
    p.delete(&m.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_ip_reported_later_becomes_an_address() {
    let vcsim = Vcsim::start();
    let p = common::provider(&vcsim, &common::owner("ip"));
    let admin = Admin::login(&vcsim).await;
    let m = p
        .create(&common::spec_named("ip-1"), None)
        .await
        .expect("create");
    // Powered on, but nothing could reach it yet: still booting, no SSH endpoint.
    assert!(m.addresses.is_empty(), "{:?}", m.addresses);
    assert_eq!(m.phase, Phase::Provisioning);
    assert!(m.access.ssh.is_none());
    // What VMware Tools does once the guest has booted.
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    admin
        .set_extra(&vm, "SET.guest.ipAddress", "10.11.12.13")
        .await;
    let got = p.get(&m.provider_id).await.expect("get");
    assert_eq!(got.address(AddressKind::InternalIP), Some("10.11.12.13"));
    assert_eq!(got.phase, Phase::Provisioned);
    let ssh = got
        .access
        .ssh
        .expect("an SSH endpoint once it has an address");
    assert_eq!(
        (ssh.host.as_str(), ssh.port, ssh.user.as_str()),
        ("10.11.12.13", 22, common::SSH_USER)
    );
    p.delete(&m.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_adopts_what_a_crashed_one_made() {
    let vcsim = Vcsim::start();
    let owner = common::owner("adopt");
    let admin = Admin::login(&vcsim).await;
    let first = common::provider(&vcsim, &owner);
    let made = first
        .create(&common::spec_named("adopt-1"), None)
        .await
        .expect("create");
    drop(first); // no logout: the process died
    let second = common::provider(&vcsim, &owner);
    let again = second
        .create(&common::spec_named("adopt-1"), None)
        .await
        .expect("create");
    assert_eq!(again.provider_id, made.provider_id);
    assert_eq!(admin.count_named("adopt-1").await, 1);
    second.delete(&made.provider_id).await.expect("delete");
    assert_eq!(admin.count_named("adopt-1").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_left_before_power_on_is_finished_not_duplicated() {
    let vcsim = Vcsim::start();
    let owner = common::owner("halfway");
    let admin = Admin::login(&vcsim).await;
    // What a create that died right after CloneVM_Task leaves: a tagged, powered-off
    // clone that was never started.
    admin.clone_tagged("DC0_H0_VM1", "half-1", &owner).await;
    let p = common::provider(&vcsim, &owner);
    let m = p
        .create(&common::spec_named("half-1"), None)
        .await
        .expect("create");
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    assert!(
        admin.powered_on(&vm).await,
        "the left clone was not started: {}",
        m.phase
    );
    assert_eq!(
        admin.count_named("half-1").await,
        1,
        "a second clone was made"
    );
    assert!(
        admin
            .property(&vm, "config.hardware.numCPU")
            .await
            .contains(">2</val>")
    );
    // Stopped on purpose, it stays stopped through another create.
    p.power(&m.provider_id, machine_core::PowerOp::Stop)
        .await
        .expect("stop");
    let again = p
        .create(&common::spec_named("half-1"), None)
        .await
        .expect("create");
    assert_eq!(again.phase, machine_core::Phase::Stopped);
    p.delete(&m.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_made_since_the_mirror_was_read_is_adopted_not_duplicated() {
    let vcsim = Vcsim::start();
    let owner = common::owner("behind");
    let admin = Admin::login(&vcsim).await;
    let p = common::provider(&vcsim, &owner);
    // The mirror is read (and then left idle: nothing waits, so nothing updates it).
    let first = p
        .create(&common::spec_named("behind-1"), None)
        .await
        .expect("create");
    // Another process's create dies after its clone: the mirror does not know the VM,
    // and the create below does not ask before it clones.
    admin.clone_tagged("DC0_H0_VM1", "behind-2", &owner).await;
    let theirs = admin.vm_by_name("behind-2").await;
    let m = p
        .create(&common::spec_named("behind-2"), None)
        .await
        .expect("create");
    assert_eq!(
        admin.count_named("behind-2").await,
        1,
        "a second VM of the name was left"
    );
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    assert!(
        admin.powered_on(&vm).await,
        "the other process's clone was not started: {}",
        m.phase
    );
    assert_eq!(vm, theirs, "the machine is not the other process's clone");
    for id in [&first.provider_id, &m.provider_id] {
        p.delete(id).await.expect("delete");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_controllers_creating_one_name_at_once_leave_one_vm() {
    let vcsim = Vcsim::start();
    let owner = common::owner("race");
    let admin = Admin::login(&vcsim).await;
    let providers: Vec<Arc<VsphereProvider>> = (0..4)
        .map(|_| Arc::new(common::provider(&vcsim, &owner)))
        .collect();
    let spec = common::spec_named("race-1");
    let tasks: Vec<_> = providers
        .iter()
        .map(|p| {
            let (p, spec) = (p.clone(), spec.clone());
            tokio::spawn(async move { p.create(&spec, None).await })
        })
        .collect();
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().expect("create").provider_id);
    }
    ids.dedup();
    assert_eq!(
        ids.len(),
        1,
        "controllers were told different machines: {ids:?}"
    );
    assert_eq!(
        admin.count_named("race-1").await,
        1,
        "duplicates left standing"
    );
    providers[0].delete(&ids[0]).await.expect("delete");
    assert_eq!(admin.count_named("race-1").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inventory_paths_are_invalid_specs_naming_the_field() {
    let vcsim = Vcsim::start();
    let p = common::provider(&vcsim, &common::owner("bad"));
    let admin = Admin::login(&vcsim).await;
    let cases = [
        (
            common::spec_named("bad-1").with_image("DC0/vm/no-such-template"),
            "image",
        ),
        (
            common::spec_named("bad-2")
                .with_provider(serde_json::json!({"resourcePool": "DC0/host/nope/Resources"})),
            "provider.resourcePool",
        ),
        (
            common::spec_named("bad-3").with_provider(serde_json::json!({
                "resourcePool": common::POOL, "folder": "DC0/vm/missing"
            })),
            "provider.folder",
        ),
        (
            common::spec_named("bad-4").with_provider(serde_json::json!({
                "resourcePool": common::POOL, "datastore": "DC0/datastore/nope"
            })),
            "provider.datastore",
        ),
        (
            // A VM path where a resource pool belongs.
            common::spec_named("bad-5")
                .with_provider(serde_json::json!({"resourcePool": common::TEMPLATE})),
            "provider.resourcePool",
        ),
    ];
    for (spec, field) in cases {
        let e = p.create(&spec, None).await.expect_err("bad spec accepted");
        assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{field}: {e}");
        assert!(!e.is_retryable());
        assert_eq!(e.field(), Some(field), "{e}");
        assert_eq!(
            admin.count_named(spec.name.as_str()).await,
            0,
            "{field}: a VM was made"
        );
    }
    let lost = VsphereProvider::new(
        common::config(&vcsim, "x")
            .datacenter("NoSuchDC")
            .build()
            .unwrap(),
    )
    .unwrap();
    let e = lost.find(&"x".parse().unwrap()).await.unwrap_err();
    assert_eq!(
        (e.kind(), e.field()),
        (ErrorKind::InvalidSpec, Some("datacenter"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_pin_or_no_trust_is_refused_before_any_login() {
    let vcsim = Vcsim::start();
    let wrong: CertFingerprint = "00".repeat(32).parse().unwrap();
    let pinned = VsphereProvider::new(
        common::config(&vcsim, "pin")
            .pinned_sha256(wrong)
            .build()
            .unwrap(),
    )
    .unwrap();
    let e = pinned.find(&"x".parse().unwrap()).await.unwrap_err();
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains("not trusted"), "{e}");
    assert!(
        e.to_string().contains(&vcsim.fingerprint.to_string()),
        "{e}"
    );
    // The default (system roots) does not trust a self-signed vCenter either.
    let default = VsphereProvider::new(
        provider_vsphere::VsphereConfig::builder()
            .url(&vcsim.url)
            .username("u")
            .password("p".into())
            .datacenter("DC0")
            .build()
            .unwrap(),
    )
    .unwrap();
    let e = default.find(&"x".parse().unwrap()).await.unwrap_err();
    assert!(e.to_string().contains("not trusted"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_renewed_once() {
    let vcsim = Vcsim::start();
    let p = common::provider(&vcsim, &common::owner("session"));
    let admin = Admin::login(&vcsim).await;
    let m = p
        .create(&common::spec_named("sess-1"), None)
        .await
        .expect("create");
    assert!(
        admin.terminate_other_sessions().await >= 1,
        "no provider session to end"
    );
    // The next call meets NotAuthenticated, logs in again and succeeds.
    let got = p
        .get(&m.provider_id)
        .await
        .expect("get after the session ended");
    assert_eq!(got.provider_id, m.provider_id);
    p.delete(&m.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_memory_disk_and_network_come_from_the_spec() {
    let vcsim = Vcsim::start();
    let p = common::provider(&vcsim, &common::owner("hw"));
    let admin = Admin::login(&vcsim).await;
    let spec = common::spec_named("hw-1")
        .with_size("3x2048")
        .with_provider(serde_json::json!({
            "resourcePool": common::POOL,
            "diskGiB": 40,
            "network": "DC0/network/VM Network",
        }));
    let m = p.create(&spec, None).await.expect("create");
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    assert!(
        admin
            .property(&vm, "config.hardware.numCPU")
            .await
            .contains(">3</val>")
    );
    assert!(
        admin
            .property(&vm, "config.hardware.memoryMB")
            .await
            .contains(">2048</val>")
    );
    let devices = admin.property(&vm, "config.hardware.device").await;
    assert!(
        devices.contains(&format!(
            "<capacityInKB>{}</capacityInKB>",
            40 * 1024 * 1024
        )),
        "disk not grown: {devices}"
    );
    assert!(
        devices.contains("<deviceName>VM Network</deviceName>"),
        "{devices}"
    );
    // The size is what the VM has, read from its hardware: after an administrator's
    // edit it says so, in the spec's notation.
    assert_eq!(m.size.as_deref(), Some("3x2048"));
    admin.set_cpus(&vm, 4).await;
    let got = p.get(&m.provider_id).await.expect("get");
    assert_eq!(got.size.as_deref(), Some("4x2048"));
    let listed = p.list(&Labels::new()).await.expect("list");
    assert_eq!(listed[0].size.as_deref(), Some("4x2048"));
    p.delete(&m.provider_id).await.expect("delete");

    // A network that does not exist: an invalid spec naming the field, checked before
    // the clone, so no VM is left behind. (A disk smaller than the template's is
    // refused too; vcsim's template disk is 1 MiB, so a unit test covers it.)
    let lost = common::spec_named("hw-2").with_provider(serde_json::json!({
        "resourcePool": common::POOL, "network": "DC0/network/nope"
    }));
    let e = p
        .create(&lost, None)
        .await
        .expect_err("missing network accepted");
    assert_eq!(e.field(), Some("provider.network"), "{e}");
    assert_eq!(admin.count_named("hw-2").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_with_empty_values_are_kept_in_one_extra_config_value() {
    let vcsim = Vcsim::start();
    let p = common::provider(&vcsim, &common::owner("labels"));
    let admin = Admin::login(&vcsim).await;
    let spec = common::spec_named("labels-1")
        .with_label("empty", "")
        .with_label("Mixed.Case/Key", "MiXeD-Value_1.x");
    let m = p.create(&spec, None).await.expect("create");
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    // One key holding every label as JSON: never an empty value, which vCenter would
    // take as removing the key.
    let raw = admin.extra_config(&vm).await;
    let stored = raw
        .split("<key>machineprovisioning.labels</key>")
        .nth(1)
        .and_then(|r| r.split('>').nth(1))
        .and_then(|r| r.split('<').next())
        .expect("the labels key");
    assert!(
        stored.contains("&#34;empty&#34;:&#34;&#34;") || stored.contains("\"empty\":\"\""),
        "{stored}"
    );
    let got = p.get(&m.provider_id).await.expect("get");
    assert_eq!(got.labels, spec.labels);
    p.delete(&m.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_paths_and_vms_are_looked_up_once_and_again_when_gone() {
    let vcsim = Vcsim::start();
    let proxy = FaultProxy::start(&vcsim).await;
    let admin = Admin::login(&vcsim).await;
    let p = proxy.provider(common::config(&vcsim, &common::owner("paths")));
    admin.clone_template("DC0_H0_VM1", "tmpl-paths").await;
    let spec = |name: &str| common::spec_named(name).with_image("DC0/vm/tmpl-paths");

    let a = p.create(&spec("paths-1"), None).await.expect("create");
    // The datacenter's vm folder (the watched folder and the default folder), the
    // template and the pool.
    assert_eq!(proxy.calls("FindByInventoryPath"), 3);
    let b = p.create(&spec("paths-2"), None).await.expect("create");
    assert_eq!(
        proxy.calls("FindByInventoryPath"),
        3,
        "a second create looked its paths up again"
    );
    // The provider's collector is made once: a view of the folder's VMs read once,
    // then kept current by updates; no create lists the VMs of the folder.
    for (method, times) in [
        ("CreatePropertyCollector", 1),
        ("CreateContainerView", 1),
        ("CreateListView", 1),
        ("CreateFilter", 1),
        ("RetrievePropertiesEx", 0),
    ] {
        assert_eq!(proxy.calls(method), times, "{method}");
    }
    // A VM this provider made is known by its id: a get reads nothing but updates.
    let before = proxy.seen().len();
    p.get(&a.provider_id).await.expect("get");
    let during: Vec<String> = proxy.seen()[before..]
        .iter()
        .map(|(m, _)| m.clone())
        .collect();
    assert!(
        during
            .iter()
            .all(|m| m == "WaitForUpdatesEx" || m == "CancelWaitForUpdates"),
        "{during:?}"
    );
    p.delete(&a.provider_id).await.expect("delete");
    p.delete(&b.provider_id).await.expect("delete");

    // The template is replaced by another under the same path: the cached one is gone
    // (ManagedObjectNotFound), and the create looks the paths up again, once.
    let old = admin.vm_by_name("tmpl-paths").await;
    admin.destroy(&old).await;
    let new = admin.clone_template("DC0_H0_VM1", "tmpl-paths").await;
    assert_ne!(old, new);
    let c = p
        .create(&spec("paths-3"), None)
        .await
        .expect("create after the template was replaced");
    assert_eq!(proxy.calls("FindByInventoryPath"), 6);
    assert_eq!(proxy.calls("CloneVM_Task"), 4);
    p.delete(&c.provider_id).await.expect("delete");
    admin.destroy(&new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_on_refused_for_capacity_leaves_no_vm() {
    let vcsim = Vcsim::start();
    let proxy = FaultProxy::start(&vcsim).await;
    let admin = Admin::login(&vcsim).await;
    let p = proxy.provider(common::config(&vcsim, &common::owner("full")));
    // Admission control: the pool cannot hold the VM's memory, said by the power-on
    // task, after the clone was made.
    proxy.pick("PowerOnVM_Task", Answer::insufficient_memory());
    let e = p
        .create(&common::spec_named("full-1"), None)
        .await
        .expect_err("a refused power-on succeeded");
    assert_eq!(e.kind(), ErrorKind::InsufficientCapacity, "{e}");
    assert!(
        e.to_string().contains("InsufficientMemoryResourcesFault"),
        "{e}"
    );
    assert_eq!(proxy.answered(), 1);
    assert_eq!(
        admin.count_named("full-1").await,
        0,
        "the clone that could not start was left"
    );
    proxy.clear();
    let m = p
        .create(&common::spec_named("full-1"), None)
        .await
        .expect("create once the pool has room");
    p.delete(&m.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_refused_as_a_duplicate_name_adopts_the_vm_that_has_it() {
    let vcsim = Vcsim::start();
    let proxy = FaultProxy::start(&vcsim).await;
    let admin = Admin::login(&vcsim).await;
    let owner = common::owner("dup");
    let p = proxy.provider(common::config(&vcsim, &owner));
    // vCenter refuses a second VM of one name in a folder: the clone vcsim made stands
    // for a racing create's, and this create is told DuplicateName.
    proxy.pick(
        "CloneVM_Task",
        Answer::duplicate_name_after_forwarding("dup-1"),
    );
    let m = p
        .create(&common::spec_named("dup-1"), None)
        .await
        .expect("create told DuplicateName adopts the VM of that name");
    proxy.clear();
    assert_eq!(admin.count_named("dup-1").await, 1);
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    assert!(
        admin.powered_on(&vm).await,
        "the adopted clone was not started"
    );
    p.delete(&m.provider_id).await.expect("delete");

    // A VM of another owner with the name: a conflict, not an adoption.
    admin
        .clone_tagged("DC0_H0_VM1", "dup-2", "someone-else")
        .await;
    proxy.pick(
        "CloneVM_Task",
        Answer::Fault {
            kind: "DuplicateName".into(),
            detail: "<name>dup-2</name>".into(),
            message: "The name 'dup-2' already exists.".into(),
        },
    );
    let e = p
        .create(&common::spec_named("dup-2"), None)
        .await
        .expect_err("another owner's VM adopted");
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert_eq!(admin.count_named("dup-2").await, 1);
}

/// Waits (up to 5 s) until `check` holds.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_reboot_ask_the_guest_first_then_force() {
    let vcsim = Vcsim::start();
    let proxy = FaultProxy::start(&vcsim).await;
    let admin = Admin::login(&vcsim).await;
    let soft = std::time::Duration::from_millis(300);
    let p = proxy.provider(common::config(&vcsim, &common::owner("soft")).soft_stop_timeout(soft));
    assert!(p.capabilities().power.graceful, "the capability says so");
    let m = p
        .create(&common::spec_named("soft-1"), None)
        .await
        .expect("create");
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    let power = |state: &'static str| {
        let admin = &admin;
        let vm = vm.clone();
        async move {
            admin
                .property(&vm, "runtime.powerState")
                .await
                .contains(&format!(">{state}<"))
        }
    };

    // A guest that shuts down when asked: no hard power-off.
    p.power(&m.provider_id, PowerOp::Stop).await.expect("stop");
    assert!(power("poweredOff").await);
    assert_eq!(proxy.calls("ShutdownGuest"), 1);
    assert_eq!(proxy.calls("PowerOffVM_Task"), 0);
    assert_eq!(p.get(&m.provider_id).await.unwrap().phase, Phase::Stopped);
    p.power(&m.provider_id, PowerOp::Start)
        .await
        .expect("start");
    assert!(power("poweredOn").await);

    // A guest that takes the request and does nothing: powered off after the timeout.
    proxy.pick("ShutdownGuest", Answer::Ignored);
    let started = std::time::Instant::now();
    p.power(&m.provider_id, PowerOp::Stop).await.expect("stop");
    assert!(
        started.elapsed() >= soft,
        "forced before the guest's time was up"
    );
    assert!(power("poweredOff").await);
    assert_eq!(proxy.calls("PowerOffVM_Task"), 1);
    proxy.clear();
    p.power(&m.provider_id, PowerOp::Start)
        .await
        .expect("start");

    // vcsim 0.24.2 has no RebootGuest (MethodNotFound), as a guest without VMware
    // Tools cannot restart itself: reset at once.
    p.power(&m.provider_id, PowerOp::Reboot)
        .await
        .expect("reboot");
    assert_eq!(proxy.calls("RebootGuest"), 1);
    assert_eq!(proxy.calls("ResetVM_Task"), 1);
    // A guest that takes the restart and stays up: reset after the timeout.
    proxy.pick("RebootGuest", Answer::Ignored);
    let started = std::time::Instant::now();
    p.power(&m.provider_id, PowerOp::Reboot)
        .await
        .expect("reboot");
    assert!(
        started.elapsed() >= soft,
        "reset before the guest's time was up"
    );
    assert_eq!(proxy.calls("ResetVM_Task"), 2);
    proxy.clear();
    assert!(power("poweredOn").await);
    p.delete(&m.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_distributed_port_group_backs_the_network_card() {
    let vcsim = Vcsim::start();
    let p = common::provider(&vcsim, &common::owner("dvs"));
    let admin = Admin::login(&vcsim).await;
    let spec = common::spec_named("dvs-1").with_provider(serde_json::json!({
        "resourcePool": common::POOL,
        "network": "DC0/network/DC0_DVPG0",
    }));
    let m = p.create(&spec, None).await.expect("create");
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    let devices = admin.property(&vm, "config.hardware.device").await;
    assert!(
        devices.contains("VirtualEthernetCardDistributedVirtualPortBackingInfo"),
        "{devices}"
    );
    let key = admin
        .property_of(
            "DistributedVirtualPortgroup",
            "DC0/network/DC0_DVPG0",
            "key",
        )
        .await;
    assert!(
        devices.contains(&format!("<portgroupKey>{key}</portgroupKey>")),
        "port group {key}: {devices}"
    );
    p.delete(&m.provider_id).await.expect("delete");

    // The switch itself is no network a card can join: refused before any clone.
    let e = p
        .create(
            &common::spec_named("dvs-2").with_provider(serde_json::json!({
                "resourcePool": common::POOL,
                "network": "DC0/network/DVS0",
            })),
            None,
        )
        .await
        .expect_err("a switch accepted as a network");
    assert_eq!(e.field(), Some("provider.network"), "{e}");
    assert!(e.to_string().contains("port group"), "{e}");
    assert_eq!(admin.count_named("dvs-2").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_of_one_login_share_a_session_kept_alive_and_logged_out() {
    let vcsim = Vcsim::start();
    let proxy = FaultProxy::start(&vcsim).await;
    let keep_alive = std::time::Duration::from_millis(200);
    let config = |owner: &str| common::config(&vcsim, owner).keep_alive(keep_alive);
    let a = proxy.provider(config("share-a"));
    let b = proxy.provider(config("share-b"));
    let name = "nothing".parse().unwrap();
    assert!(a.find(&name).await.unwrap().is_none());
    assert!(b.find(&name).await.unwrap().is_none());
    assert_eq!(
        proxy.calls("Login"),
        1,
        "two providers, one login: one session"
    );
    // Another password is another session.
    let other = proxy.provider(config("share-c").password("other".into()));
    assert!(other.find(&name).await.unwrap().is_none());
    assert_eq!(proxy.calls("Login"), 2);
    drop(other);
    eventually("the other session's logout", || proxy.calls("Logout") == 1).await;

    // Idle: the session is kept alive, by CurrentTime.
    eventually("a keep-alive call", || proxy.calls("CurrentTime") >= 1).await;
    // Each provider has its own collector, destroyed with it; the last one out logs
    // the shared session out.
    drop(a);
    eventually("a's collector destroyed", || {
        proxy.calls("DestroyPropertyCollector") == 2
    })
    .await;
    assert_eq!(proxy.calls("Logout"), 1, "b still uses the session");
    assert!(b.find(&name).await.unwrap().is_none());
    drop(b);
    eventually("the shared session's logout", || proxy.calls("Logout") == 2).await;
    assert_eq!(proxy.calls("Login"), 2, "no login after the first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_updates_make_the_collector_again() {
    let vcsim = Vcsim::start();
    let proxy = FaultProxy::start(&vcsim).await;
    let admin = Admin::login(&vcsim).await;
    let owner = common::owner("lost");
    let p = proxy.provider(common::config(&vcsim, &owner));
    let made = p
        .create(&common::spec_named("lost-1"), None)
        .await
        .expect("create");
    // An update set vcsim sent is lost on the way: the mirror no longer knows what
    // changed (vcsim does not send it again), so the collector is made anew.
    proxy.pick(
        "WaitForUpdatesEx",
        Answer::ForwardThenFault {
            kind: "SystemError".into(),
            detail: "<reason>cut</reason>".into(),
            message: "the connection was cut".into(),
        },
    );
    // Meanwhile another process makes a machine of this owner.
    admin.clone_tagged("DC0_H0_VM1", "lost-2", &owner).await;
    let e = p
        .find(&"lost-2".parse().unwrap())
        .await
        .expect_err("an answer lost was taken as one given");
    assert!(e.is_retryable(), "{e}");
    proxy.clear();
    let found = p
        .find(&"lost-2".parse().unwrap())
        .await
        .expect("find")
        .expect("the machine made while updates were lost");
    assert_eq!(proxy.calls("CreatePropertyCollector"), 2);
    assert_eq!(
        p.find(&"lost-1".parse().unwrap())
            .await
            .unwrap()
            .map(|m| m.provider_id),
        Some(made.provider_id.clone())
    );
    p.delete(&made.provider_id).await.expect("delete");
    p.delete(&found.provider_id).await.expect("delete");
    assert_eq!(admin.count_named("lost-2").await, 0);
}
