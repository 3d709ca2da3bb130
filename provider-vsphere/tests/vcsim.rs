//! What vcsim shows of the provider beyond the conformance suite: guestinfo user data
//! and its scrub, a guest IP appearing later, adoption after a crash, racing
//! controllers, bad input named by field, certificate pinning, and an expired session.

mod common;

use std::sync::Arc;

use machine_core::{
    AddressKind, ContentEncoding, ErrorKind, MachineProvisioner, UserData, UserDataFormat,
};
use provider_vsphere::{CertFingerprint, VsphereProvider};

use common::Vcsim;
use common::admin::Admin;

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
    // Scrubbing again is a no-op, and the machine is unharmed.
    p.bootstrap_finished(&m).await.expect("second scrub");
    assert!(p.get(&m.provider_id).await.expect("get").phase.is_running());
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
    assert!(m.address(AddressKind::InternalIP) != Some("10.11.12.13"));
    // What VMware Tools does once the guest has booted.
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
    admin
        .set_extra(&vm, "SET.guest.ipAddress", "10.11.12.13")
        .await;
    let got = p.get(&m.provider_id).await.expect("get");
    assert_eq!(got.address(AddressKind::InternalIP), Some("10.11.12.13"));
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
        .create(&common::spec_named("half-1").with_size("2x128"), None)
        .await
        .expect("create");
    assert!(
        m.phase.is_running(),
        "the left clone was not started: {}",
        m.phase
    );
    assert_eq!(
        admin.count_named("half-1").await,
        1,
        "a second clone was made"
    );
    let vm = admin.vm_by_uuid(m.provider_id.resource_id()).await;
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
