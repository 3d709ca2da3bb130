//! RedfishProvider against sushy-tools: claims, seeds, power, release, races.

mod common;

use std::time::{Duration, Instant};

use machine_core::{
    ErrorKind, MachineName, MachineProvisioner, MachineSpec, Phase, PowerOp, UserData,
    UserDataFormat,
};
use provider_baremetal::redfish::seed_iso::Seed;
use provider_baremetal::redfish::{BmcCredentials, RedfishClient};
use provider_http::{HttpClient, HttpSettings};

use common::Sushy;

fn spec(name: &str) -> MachineSpec {
    MachineSpec::new(MachineName::new(name).unwrap())
}

fn raw_client(sushy: &Sushy) -> RedfishClient {
    RedfishClient::new(
        HttpClient::new(&HttpSettings::default()).unwrap(),
        sushy.endpoint.parse().unwrap(),
        BmcCredentials::new("admin", machine_core::SecretString::from("pw")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_seeds_boots_and_delete_releases() {
    let sushy = Sushy::start(2);
    let claims = tempfile::tempdir().unwrap();
    let p = common::provider(&sushy, claims.path(), "team").await;
    let ud = UserData::new(
        UserDataFormat::CloudConfig,
        "#cloud-config\nhostname: web-1\n",
    );
    let m = p
        .create(
            &spec("web-1").with_provider(serde_json::json!({"selector": {"idx": "1"}})),
            Some(&ud),
        )
        .await
        .expect("create");
    let system = &sushy.systems[1];
    // The ID names the server and the claim.
    let claim = claim_id(claims.path(), "s1");
    assert_eq!(
        m.provider_id.as_str(),
        format!("redfish://{}/{}/{claim}", sushy.addr, system.id)
    );
    // The seed sushy downloaded is the ISO of this user data, its instance-id the
    // machine's name and claim.
    let want = Seed {
        user_data: ud.bytes.as_slice(),
        meta_data: format!("instance-id: web-1-{claim}\nlocal-hostname: web-1\n").as_bytes(),
        network_config: None,
    }
    .to_iso()
    .unwrap();
    assert_eq!(sushy.downloaded("seed.iso"), vec![want]);
    let c = raw_client(&sushy);
    let s = c.system(&system.id).await.unwrap();
    assert_eq!(s.boot.boot_source_override_target.as_deref(), Some("Cd"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = p.get(&m.provider_id).await.expect("get");
        if now.phase == Phase::Provisioned {
            break;
        }
        assert_eq!(now.phase, Phase::Provisioning);
        assert!(Instant::now() < deadline, "not running after 20 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Ready: the seed is no longer needed; its URL stops answering.
    assert!(p.media_server().serves(m.provider_id.as_str()));
    p.bootstrap_finished(&m).await.unwrap();
    assert!(!p.media_server().serves(m.provider_id.as_str()));
    // A restarted controller adopts it.
    let again = common::provider(&sushy, claims.path(), "team").await;
    let found = again.find(&m.name).await.unwrap().expect("adopted");
    assert_eq!(found.provider_id, m.provider_id);

    again.delete(&m.provider_id).await.expect("delete");
    let e = p.get(&m.provider_id).await.expect_err("gone");
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let s = c.system(&system.id).await.unwrap();
    assert_eq!(
        s.power_state,
        Some(provider_baremetal::redfish::PowerState::Off)
    );
    let cd = c.virtual_cd(&s).await.unwrap();
    assert_ne!(cd.inserted, Some(true), "the seed was ejected");

    // The name made again on the same server is another machine: another ID, another
    // instance-id (cloud-init runs its user data again over the disk's old state).
    let pinned = spec("web-1").with_provider(serde_json::json!({"server": "s1"}));
    let m2 = p.create(&pinned, Some(&ud)).await.expect("create again");
    let claim2 = claim_id(claims.path(), "s1");
    assert_ne!(claim2, claim);
    assert_eq!(
        m2.provider_id.as_str(),
        format!("redfish://{}/{}/{claim2}", sushy.addr, system.id)
    );
    assert_eq!(
        sushy.downloaded("seed.iso"),
        vec![common::seed_of(&m2, &ud.bytes)]
    );
    // A late, retried delete of the old machine's ID (by any controller) leaves the
    // new machine alone; every call on the old ID says it is gone.
    again.delete(&m.provider_id).await.expect("a late delete");
    p.delete(&m.provider_id).await.expect("a late delete");
    assert_eq!(
        claim_id(claims.path(), "s1"),
        claim2,
        "the new claim was released"
    );
    assert_eq!(
        p.get(&m.provider_id).await.expect_err("gone").kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        p.power(&m.provider_id, PowerOp::Stop)
            .await
            .expect_err("gone")
            .kind(),
        ErrorKind::NotFound
    );
    let now = p
        .get(&m2.provider_id)
        .await
        .expect("the new machine stands");
    assert!(
        matches!(now.phase, Phase::Provisioning | Phase::Provisioned),
        "{}",
        now.phase
    );
    assert_eq!(
        again.find(&m2.name).await.unwrap().map(|f| f.provider_id),
        Some(m2.provider_id.clone())
    );
    p.delete(&m2.provider_id).await.expect("delete");
    assert!(p.list(&Default::default()).await.unwrap().is_empty());
}

/// The claim id in server `server`'s claim file.
fn claim_id(dir: &std::path::Path, server: &str) -> String {
    let body = std::fs::read(dir.join(format!("{server}.json"))).expect("the claim file");
    let claim: serde_json::Value = serde_json::from_slice(&body).unwrap();
    claim["id"].as_str().unwrap().to_owned()
}

/// A claim written before provider IDs named claims (no `version`): its machine keeps
/// the ID it was given, `redfish://<bmc>/<system>`, for every call; an ID naming a
/// claim id does not name it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_an_earlier_version_keeps_its_id() {
    let sushy = Sushy::start(1);
    let claims = tempfile::tempdir().unwrap();
    std::fs::write(
        claims.path().join("s0.json"),
        r#"{"owner":"team","name":"old","labels":{"idx":"0"},"powered":false,"id":"0123456789abcdef","creating":false}"#,
    )
    .unwrap();
    let p = common::provider(&sushy, claims.path(), "team").await;
    let legacy = format!("redfish://{}/{}", sushy.addr, sushy.systems[0].id);
    let found = p
        .find(&MachineName::new("old").unwrap())
        .await
        .unwrap()
        .expect("the old machine");
    assert_eq!(found.provider_id.as_str(), legacy);
    assert_eq!(found.phase, Phase::Stopped);
    let listed = p.list(&Default::default()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].provider_id, found.provider_id);
    let with_claim = machine_core::ProviderId::new(format!("{legacy}/0123456789abcdef")).unwrap();
    assert_eq!(
        p.get(&with_claim).await.expect_err("not its ID").kind(),
        ErrorKind::NotFound
    );
    p.delete(&with_claim).await.expect("nothing to delete");
    assert_eq!(p.get(&found.provider_id).await.unwrap().name, found.name);
    p.delete(&found.provider_id).await.expect("delete");
    assert!(p.list(&Default::default()).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_never_claim_one_server() {
    let sushy = Sushy::start(3);
    let claims = tempfile::tempdir().unwrap();
    let a = common::provider(&sushy, claims.path(), "team").await;
    let b = common::provider(&sushy, claims.path(), "team").await;
    // Different names, both pinned to server s0: exactly one gets it.
    let pinned = |n: &str| spec(n).with_provider(serde_json::json!({"server": "s0"}));
    // Separate tasks on the two worker threads: the creates really run at once.
    let (sa, sb) = (pinned("a-1"), pinned("b-1"));
    let (pa, pb) = (a.clone(), b.clone());
    let ta = tokio::spawn(async move { pa.create(&sa, None).await });
    let tb = tokio::spawn(async move { pb.create(&sb, None).await });
    let (ra, rb) = (ta.await.unwrap(), tb.await.unwrap());
    let won = [ra.is_ok(), rb.is_ok()];
    assert_eq!(won.iter().filter(|w| **w).count(), 1, "{ra:?} {rb:?}");
    let lost = ra.err().or(rb.err()).unwrap();
    assert_eq!(lost.kind(), ErrorKind::InsufficientCapacity, "{lost}");

    // Many creates racing over the pool: every server at most once.
    let names: Vec<String> = (0..6).map(|i| format!("m-{i}")).collect();
    let tasks: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let p = if i % 2 == 0 { a.clone() } else { b.clone() };
            let spec = spec(n);
            tokio::spawn(async move { p.create(&spec, None).await })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let made: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    // The servers (an ID is the server's and the claim's).
    let mut ids: Vec<_> = made
        .iter()
        .map(|m| m.provider_id.as_str().rsplit_once('/').unwrap().0)
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), made.len(), "a server was given to two machines");
    assert_eq!(made.len(), 2, "two servers were free: {results:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_ops_and_refused_boot_targets() {
    let sushy = Sushy::start(1);
    let claims = tempfile::tempdir().unwrap();
    let p = common::provider(&sushy, claims.path(), "team").await;
    let e = p
        .create(
            &spec("x").with_provider(serde_json::json!({"boot": "Floppy"})),
            None,
        )
        .await
        .expect_err("Floppy is not an allowed boot target");
    assert_eq!(e.field(), Some("provider.boot"), "{e}");
    assert!(
        p.list(&Default::default()).await.unwrap().is_empty(),
        "claim released"
    );

    let m = p.create(&spec("x"), None).await.expect("create");
    p.power(&m.provider_id, PowerOp::Stop).await.expect("stop");
    assert_eq!(p.get(&m.provider_id).await.unwrap().phase, Phase::Stopped);
    p.power(&m.provider_id, PowerOp::Start)
        .await
        .expect("start");
    assert!(matches!(
        p.get(&m.provider_id).await.unwrap().phase,
        Phase::Provisioning | Phase::Provisioned
    ));
    p.delete(&m.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_right_after_create_leaves_the_server_off() {
    let sushy = Sushy::start(1);
    let claims = tempfile::tempdir().unwrap();
    let p = common::provider(&sushy, claims.path(), "team").await;
    let m = p.create(&spec("quick"), None).await.expect("create");
    // The power-on is still pending at sushy (1-11 s): delete must not release the
    // server before it lands, or it lands afterwards on a free server.
    p.delete(&m.provider_id).await.expect("delete");
    tokio::time::sleep(Duration::from_secs(12)).await;
    let s = raw_client(&sushy)
        .system(&sushy.systems[0].id)
        .await
        .unwrap();
    assert_eq!(
        s.power_state,
        Some(provider_baremetal::redfish::PowerState::Off),
        "a released server was powered on by a reset still pending at delete"
    );
}
