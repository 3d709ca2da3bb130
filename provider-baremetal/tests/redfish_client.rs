//! The typed Redfish calls against sushy-tools' fake driver.

mod common;

use std::time::{Duration, Instant};

use machine_core::{ErrorKind, SecretString};
use provider_baremetal::redfish::{BmcCredentials, PowerState, RedfishClient};
use provider_http::{HttpClient, HttpSettings};

use common::Sushy;

fn client(sushy: &Sushy) -> RedfishClient {
    RedfishClient::new(
        HttpClient::new(&HttpSettings::default()).expect("http client"),
        sushy.endpoint.parse().expect("url"),
        BmcCredentials::new("admin", SecretString::from("s3cr3t-pw")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_reads_systems() {
    let sushy = Sushy::start(3);
    let c = client(&sushy);
    let mut paths = c.systems().await.expect("systems");
    paths.sort();
    let mut want: Vec<String> = sushy
        .systems
        .iter()
        .map(|s| format!("/redfish/v1/Systems/{}", s.id))
        .collect();
    want.sort();
    assert_eq!(paths, want);

    let s = c.system(&sushy.systems[1].id).await.expect("system");
    assert_eq!(s.id, sushy.systems[1].id);
    assert_eq!(s.name, "fake-1");
    assert_eq!(s.power_state, Some(PowerState::Off));
    for t in ["On", "ForceOff", "GracefulShutdown", "ForceRestart"] {
        assert!(
            s.reset_types().iter().any(|r| r == t),
            "{t} in {:?}",
            s.reset_types()
        );
    }
    assert!(s.boot.allowed_targets.iter().any(|t| t == "Cd"));
    let cd = c.virtual_cd(&s).await.expect("virtual cd");
    assert_eq!(cd.id, "Cd");
    assert_eq!(cd.inserted, Some(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_on_boot_override_and_errors() {
    let sushy = Sushy::start(1);
    let c = client(&sushy);
    let s = c.system(&sushy.systems[0].id).await.expect("system");

    c.set_boot_override(&s, "Cd", true)
        .await
        .expect("boot override");
    let s2 = c.system(&s.id).await.expect("system");
    assert_eq!(s2.boot.boot_source_override_target.as_deref(), Some("Cd"));

    c.reset(&s, "On").await.expect("reset On");
    // sushy applies a reset after 1-11 s.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = c.system(&s.id).await.expect("system").power_state;
        if now == Some(PowerState::On) {
            break;
        }
        assert!(Instant::now() < deadline, "still {now:?} after 20 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // An unsupported reset type: 501 with a Redfish body, permanent, message kept.
    let e = c.reset(&s, "Bogus").await.expect_err("Bogus reset");
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    assert!(e.to_string().contains("Bogus is not supported"), "{e}");

    let e = c
        .system("no-such-system")
        .await
        .expect_err("missing system");
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");

    // sushy's fake driver refuses AssetTag: a plain-text 400.
    let e = c
        .set_asset_tag(&s, "team/web-1")
        .await
        .expect_err("asset tag");
    assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    assert!(e.to_string().contains("PATCH only works"), "{e}");
    assert!(!e.to_string().contains("s3cr3t-pw"));
    assert!(!format!("{c:?}").contains("s3cr3t-pw"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bmc_that_does_not_answer_is_transient() {
    // A port nothing listens on: connection refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let c = RedfishClient::new(
        HttpClient::new(&HttpSettings::default()).expect("http client"),
        format!("http://127.0.0.1:{port}").parse().expect("url"),
        BmcCredentials::new("admin", SecretString::from("pw")),
    );
    let e = c.systems().await.expect_err("refused");
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
}
