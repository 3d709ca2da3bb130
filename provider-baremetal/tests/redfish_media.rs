//! The media server against sushy-tools: InsertMedia downloads exactly the served seed.

mod common;

use machine_core::SecretString;
use provider_baremetal::redfish::media_server::MediaServer;
use provider_baremetal::redfish::seed_iso::Seed;
use provider_baremetal::redfish::{BmcCredentials, RedfishClient};
use provider_http::{HttpClient, HttpSettings};

use common::Sushy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_media_downloads_exactly_the_served_seed() {
    let sushy = Sushy::start(1);
    let media = MediaServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .expect("media server");
    let iso = Seed {
        user_data: b"#cloud-config\nhostname: web-1\n",
        meta_data: b"instance-id: web-1\n",
        network_config: None,
    }
    .to_iso()
    .expect("iso");
    let url = media
        .publish("redfish://bmc/1", iso.clone())
        .expect("publish");
    let other = media
        .publish("redfish://bmc/2", b"other".to_vec())
        .expect("publish");
    assert_ne!(url, other);

    let c = RedfishClient::new(
        HttpClient::new(&HttpSettings::default()).expect("http client"),
        sushy.endpoint.parse().unwrap(),
        BmcCredentials::new("admin", SecretString::from("pw")),
    );
    let system = c.system(&sushy.systems[0].id).await.expect("system");
    let cd = c.virtual_cd(&system).await.expect("cd");
    c.insert_media(&cd, &url).await.expect("insert");

    assert_eq!(media.downloads(&url), 1, "one download of the seed");
    assert_eq!(media.downloads(&other), 0);
    assert_eq!(sushy.downloaded("seed.iso"), vec![iso]);
    let now = c.media(&cd).await.expect("cd again");
    assert_eq!(now.image.as_deref(), Some(url.as_str()));
    assert_eq!(now.inserted, Some(true));

    // Removed: the URL answers 404, and a BMC asked for it refuses the insert.
    assert_eq!(media.remove("redfish://bmc/1"), 1);
    assert!(!media.serves("redfish://bmc/1"));
    c.eject_media(&cd).await.expect("eject");
    let e = c.insert_media(&cd, &url).await.expect_err("a removed URL");
    assert!(e.to_string().contains("404"), "{e}");
    let now = c.media(&cd).await.expect("cd again");
    assert_ne!(now.inserted, Some(true));
}
