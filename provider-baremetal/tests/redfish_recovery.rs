//! What a crash or a BMC that does not do what it said leaves, and how the next call
//! carries on from it: a controller killed (kill -9, a real process) between the claim
//! and the power-on; a power-on the BMC accepted and never applied; a seed whose media
//! server went with its process.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hyper::Method;
use machine_core::{MachineName, MachineProvisioner, MachineSpec, Phase, UserData, UserDataFormat};

use common::flaky::{Answer, Flaky, Rule};
use common::{Sushy, seed_of, wait_phase};

fn spec(name: &str, server: &str) -> MachineSpec {
    MachineSpec::new(MachineName::new(name).unwrap())
        .with_provider(serde_json::json!({"server": server}))
}

fn user_data() -> UserData {
    UserData::new(
        UserDataFormat::CloudConfig,
        "#cloud-config\nruncmd: [[touch, /srv/seeded]]\n",
    )
}

/// Set in the child process of the kill -9 test: its pool YAML.
const CHILD_POOL: &str = "REDFISH_RECOVERY_CHILD_POOL";

/// The claim files in `dir`, by server name.
fn claim_files(dir: &std::path::Path) -> Vec<(String, serde_json::Value)> {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let server = name.strip_suffix(".json")?.to_owned();
            let body = std::fs::read(dir.join(&name)).unwrap();
            Some((server, serde_json::from_slice(&body).unwrap()))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// A controller process killed (SIGKILL) while the BMC holds its InsertMedia: the
/// server is claimed, not seeded, not powered on, and its create lease is left as a
/// dead process leaves it. The next create of the name, in another process, waits for
/// the lease to go stale, then seeds the same server and powers it on: the machine
/// runs, with the seed of its user data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_between_claim_and_power_on_is_finished_by_the_next_create() {
    if let Ok(yaml) = std::env::var(CHILD_POOL) {
        // The child: a create that the parent kills while the BMC holds its insert.
        let p = common::provider_of(&yaml).await;
        let r = p.create(&spec("crashed", "s1"), Some(&user_data())).await;
        eprintln!("the create returned before the kill: {r:?}");
        std::process::exit(3);
    }
    let sushy = Sushy::start(2);
    let proxy = Flaky::forwarding(&sushy.endpoint).await;
    proxy.push(Rule::on(Method::POST, "VirtualMedia.InsertMedia", Answer::Hold).times(1));
    let claims = tempfile::tempdir().unwrap();
    let yaml = common::pool_yaml_at(&sushy, &proxy.endpoint, claims.path(), "team");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "a_kill_9_between_claim_and_power_on_is_finished_by_the_next_create",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_POOL, &yaml)
        .stdin(Stdio::null())
        .spawn()
        .expect("the child controller");
    let deadline = Instant::now() + Duration::from_secs(60);
    while proxy.seen(&Method::POST, "VirtualMedia.InsertMedia", false) == 0 {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child controller exited ({status}) before its InsertMedia");
        }
        assert!(
            Instant::now() < deadline,
            "the child never inserted the seed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().expect("kill -9");
    child.wait().unwrap();

    // What the kill left: a claim whose create stopped before the power-on.
    let left = claim_files(claims.path());
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].0, "s1");
    assert_eq!(left[0].1["creating"], true, "{left:?}");
    assert_eq!(proxy.seen(&Method::POST, "ComputerSystem.Reset", false), 0);

    let p = common::provider_of(&yaml).await;
    let m = p
        .create(&spec("crashed", "s1"), Some(&user_data()))
        .await
        .expect("the next create finishes the claim");
    // The machine of the crashed create's claim: its ID names that claim.
    assert_eq!(
        m.provider_id.as_str(),
        format!(
            "redfish://{}/{}/{}",
            proxy.endpoint.trim_start_matches("http://"),
            sushy.systems[1].id,
            left[0].1["id"].as_str().unwrap()
        )
    );
    assert_eq!(
        claim_files(claims.path()).len(),
        1,
        "a second server was claimed"
    );
    wait_phase(
        p.as_ref(),
        &m.provider_id,
        Phase::Provisioned,
        &[Phase::Provisioning],
        Duration::from_secs(60),
    )
    .await;
    let held = sushy.downloaded("seed.iso");
    assert!(
        held == vec![seed_of(&m, &user_data().bytes)],
        "the BMC does not hold the machine's seed alone ({} images)",
        held.len()
    );
    assert_eq!(proxy.seen(&Method::POST, "ComputerSystem.Reset", true), 1);
    p.delete(&m.provider_id).await.expect("delete");
    assert!(claim_files(claims.path()).is_empty());
}

/// A BMC that answers 204 to a power-on and never applies it: the machine is asked
/// again once the pool's grace (15 s) has passed, and runs when the second is applied;
/// where none ever is, it is Failed (PowerOnIgnored) after the second grace, never
/// Provisioning for good. A power-on answered with a 500 (sushy's "database is
/// locked" under load) is no failed create: the machine is made, and the power-on asked
/// again in the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ignored_power_on_is_asked_again_then_reported() {
    let sushy = Sushy::start(3);
    let proxy = Flaky::forwarding(&sushy.endpoint).await;
    let reset = |i: usize| format!("{}/Actions/ComputerSystem.Reset", sushy.systems[i].id);
    proxy.push(Rule::on(Method::POST, &reset(0), Answer::Swallow).times(1));
    proxy.push(Rule::on(Method::POST, &reset(1), Answer::Swallow));
    let locked = common::flaky::redfish_error("GeneralError", "database is locked");
    proxy.push(
        Rule::on(
            Method::POST,
            &reset(2),
            Answer::Status(500, Vec::new(), locked),
        )
        .times(1),
    );
    let claims = tempfile::tempdir().unwrap();
    let p = common::provider_of(&common::pool_yaml_at(
        &sushy,
        &proxy.endpoint,
        claims.path(),
        "team",
    ))
    .await;
    let once = p.create(&spec("once", "s0"), None).await.expect("create");
    let never = p.create(&spec("never", "s1"), None).await.expect("create");
    let lost = p
        .create(&spec("lost", "s2"), None)
        .await
        .expect("a lost power-on answer is no failed create");
    assert_eq!(lost.phase, Phase::Provisioning);
    let passing = [Phase::Provisioning];
    let (ran, failed, ran_too) = tokio::join!(
        wait_phase(
            p.as_ref(),
            &once.provider_id,
            Phase::Provisioned,
            &passing,
            Duration::from_secs(60)
        ),
        wait_phase(
            p.as_ref(),
            &never.provider_id,
            Phase::Failed,
            &passing,
            Duration::from_secs(60)
        ),
        wait_phase(
            p.as_ref(),
            &lost.provider_id,
            Phase::Provisioned,
            &passing,
            Duration::from_secs(60)
        ),
    );
    assert_eq!(ran_too.name, lost.name);
    assert_eq!(
        proxy.seen(&Method::POST, &reset(2), true),
        1,
        "asked again after the 500"
    );
    assert_eq!(ran.name, once.name);
    let failure = failed.failure.expect("a failure");
    assert_eq!(failure.reason, "PowerOnIgnored", "{failure:?}");
    assert_eq!(
        proxy.seen(&Method::POST, &reset(0), false),
        2,
        "{:?}",
        proxy.log()
    );
    assert_eq!(proxy.seen(&Method::POST, &reset(0), true), 1);
    assert_eq!(
        proxy.seen(&Method::POST, &reset(1), false),
        2,
        "asked twice, then reported"
    );
    // A Failed machine is deleted like any other.
    for m in [&once, &never, &lost] {
        p.delete(&m.provider_id).await.expect("delete");
    }
}

/// The media server lives in the process that published the seed: once it is gone,
/// the URL the BMC's CD holds answers nothing, and a BMC reading the ISO while booting
/// would fail. An adopting create in a new process publishes the seed again and gives
/// the CD the new URL; once the bootstrap finished, the seed is withdrawn for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopting_create_publishes_the_seed_again_until_the_bootstrap_finished() {
    let sushy = Sushy::start(1);
    let claims = tempfile::tempdir().unwrap();
    let yaml = common::pool_yaml(&sushy, claims.path(), "team");
    let bmc = common::raw_client(&sushy);
    let cd_url = || async {
        let system = bmc.system(&sushy.systems[0].id).await.unwrap();
        let cd = bmc.virtual_cd(&system).await.unwrap();
        assert_eq!(cd.inserted, Some(true));
        cd.image.unwrap()
    };
    let fetch = |url: String| async move {
        match reqwest::get(&url).await {
            Ok(r) if r.status().is_success() => Some(r.bytes().await.unwrap().to_vec()),
            _ => None,
        }
    };
    let s = spec("web", "s0");

    let first = common::provider_of(&yaml).await;
    assert!(first.capabilities().withdraws_user_data);
    let m = first.create(&s, Some(&user_data())).await.expect("create");
    // Published again, the seed is the same: the same instance-id, so cloud-init does
    // not take a reboot during the bootstrap for a new instance.
    let want = seed_of(&m, &user_data().bytes);
    let old = cd_url().await;
    assert!(
        fetch(old.clone()).await == Some(want.clone()),
        "the seed is served"
    );
    assert_eq!(
        first
            .user_data(&m.provider_id)
            .await
            .unwrap()
            .map(|u| u.bytes),
        Some(user_data().bytes)
    );
    drop(first);
    assert!(
        fetch(old.clone()).await.is_none(),
        "the first process's seed went with it"
    );

    let second = common::provider_of(&yaml).await;
    let again = second.create(&s, Some(&user_data())).await.expect("adopt");
    assert_eq!(again.provider_id, m.provider_id);
    let new = cd_url().await;
    assert_ne!(new, old);
    assert!(
        fetch(new.clone()).await == Some(want.clone()),
        "the seed is served again"
    );
    // sushy drops an ejected image's file: what it holds now is the new download.
    let held = sushy.downloaded("seed.iso");
    assert!(
        held.len() == 1 && held[0] == want,
        "sushy holds {} images",
        held.len()
    );
    // A create adopting a machine whose seed is served leaves it alone.
    let third = common::provider_of(&yaml).await;
    third.create(&s, Some(&user_data())).await.expect("adopt");
    assert_eq!(cd_url().await, new);

    let running = wait_phase(
        second.as_ref(),
        &m.provider_id,
        Phase::Provisioned,
        &[Phase::Provisioning],
        Duration::from_secs(30),
    )
    .await;
    second.bootstrap_finished(&running).await.unwrap();
    assert!(fetch(new.clone()).await.is_none(), "withdrawn");
    assert_eq!(second.user_data(&m.provider_id).await.unwrap(), None);
    drop((second, third));
    // After the bootstrap finished, an adopting create publishes nothing.
    let fourth = common::provider_of(&yaml).await;
    fourth.create(&s, Some(&user_data())).await.expect("adopt");
    assert_eq!(cd_url().await, new);
    assert!(!fourth.media_server().serves(m.provider_id.as_str()));
    fourth.delete(&m.provider_id).await.expect("delete");
}
