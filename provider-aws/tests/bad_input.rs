//! Bad input is refused with the field named, before any request: the provider points
//! at a tripwire listener, which counts every connection the SDK opens.

mod common;

use std::collections::BTreeMap;

use machine_core::{
    ErrorKind, MachineProvisioner, MachineSpec, UserData, UserDataFormat,
    user_data::{GZIP_BEST_LEVEL, gzip},
};
use provider_aws::{AwsConfig, AwsProvider};
use serde_json::json;

use common::Tripwire;

async fn refused(spec: MachineSpec, user_data: Option<UserData>, field: &str) -> String {
    let wire = Tripwire::start().await;
    let p = common::provider(&wire.endpoint, &common::owner("bad")).await;
    let e = p.create(&spec, user_data.as_ref()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    assert_eq!(e.field(), Some(field), "{e}");
    assert!(!e.is_retryable());
    assert_eq!(
        wire.connections(),
        0,
        "a request was sent for bad input: {e}"
    );
    e.to_string()
}

#[tokio::test]
async fn missing_region_is_refused() {
    let e = AwsConfig::builder()
        .static_credentials("testing", machine_core::SecretString::from("testing"))
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec);
    assert_eq!(e.field(), Some("region"));
    assert!(e.to_string().contains("AWS_REGION"), "{e}");
}

#[tokio::test]
async fn empty_image_is_refused() {
    let msg = refused(common::spec("a").with_image(""), None, "image").await;
    assert!(msg.contains("empty"), "{msg}");
    // No image anywhere (spec or config) is refused too.
    let wire = Tripwire::start().await;
    let config = AwsConfig::builder()
        .region("us-east-1")
        .endpoint_url(&wire.endpoint)
        .static_credentials("testing", machine_core::SecretString::from("testing"))
        .build()
        .unwrap();
    let p = AwsProvider::new(config).await.unwrap();
    let e = p.create(&common::spec("a"), None).await.unwrap_err();
    assert_eq!(e.field(), Some("image"), "{e}");
    assert_eq!(wire.connections(), 0);
}

#[tokio::test]
async fn malformed_image_and_size_are_refused() {
    refused(common::spec("a").with_image("debian-12"), None, "image").await;
    refused(common::spec("a").with_size("large"), None, "size").await;
}

#[tokio::test]
async fn malformed_subnet_is_refused() {
    let spec = common::spec("a").with_provider(json!({"subnetId": "subnet-zz"}));
    let msg = refused(spec, None, "provider.subnetId").await;
    assert!(msg.contains("subnet-zz"), "{msg}");
}

#[tokio::test]
async fn malformed_security_group_is_refused() {
    let spec = common::spec("a")
        .with_provider(json!({"securityGroupIds": ["sg-0123456789abcdef0", "web"]}));
    refused(spec, None, "provider.securityGroupIds[1]").await;
}

#[tokio::test]
async fn unknown_provider_setting_is_refused() {
    let spec = common::spec("a").with_provider(json!({"rootVolume": {"sizeGib": 20}}));
    let msg = refused(spec, None, "provider.rootVolume.sizeGib").await;
    assert!(msg.contains("unknown field"), "{msg}");
}

#[tokio::test]
async fn too_many_tags_are_refused() {
    let tags: BTreeMap<String, String> = (0..48).map(|i| (format!("t{i}"), "v".into())).collect();
    let spec = common::spec("a").with_provider(json!({ "tags": tags }));
    let msg = refused(spec, None, "provider.tags").await;
    assert!(msg.contains("50 per resource"), "{msg}");
}

#[tokio::test]
async fn tag_key_over_128_is_refused() {
    let key = "k".repeat(129);
    let spec = common::spec("a").with_provider(json!({ "tags": { key.clone(): "v" } }));
    // The key in the field path is cut as machine_core::shown_key cuts it.
    refused(
        spec,
        None,
        &format!("provider.tags.{}", machine_core::shown_key(&key)),
    )
    .await;
}

#[tokio::test]
async fn tag_value_over_256_is_refused() {
    let spec = common::spec("a").with_provider(json!({ "tags": { "team": "v".repeat(257) } }));
    refused(spec, None, "provider.tags.team").await;
}

#[tokio::test]
async fn user_data_over_16_kib_is_refused_before_any_call() {
    let big = format!("#!/bin/sh\n# {}\n", "x".repeat(16 * 1024));
    let msg = refused(
        common::spec("a"),
        Some(UserData::new(UserDataFormat::ShellScript, big)),
        "userData",
    )
    .await;
    assert!(msg.contains("16384"), "{msg}");
    // Exactly at the limit passes the check (and so reaches the wire).
    let wire = Tripwire::start().await;
    let p = AwsProvider::new(
        common::config(&wire.endpoint, "edge")
            .attempt_timeout(std::time::Duration::from_millis(300))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let exact = UserData::new(UserDataFormat::Raw, vec![b'x'; 16 * 1024]);
    let e = p
        .create(&common::spec("a"), Some(&exact))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(wire.connections() > 0);
}

#[tokio::test]
async fn gzip_user_data_counts_its_compressed_size() {
    // 40 KiB of text that compresses far below 16 KiB is accepted by the check...
    let text = "#cloud-config\nruncmd:\n".to_owned() + &"  - echo hello world\n".repeat(2000);
    let ud = UserData {
        format: UserDataFormat::CloudConfig,
        encoding: machine_core::ContentEncoding::Gzip,
        bytes: gzip(text.as_bytes(), GZIP_BEST_LEVEL),
    };
    assert!(ud.bytes.len() < 16 * 1024);
    let wire = Tripwire::start().await;
    let p = AwsProvider::new(
        common::config(&wire.endpoint, "gz")
            .attempt_timeout(std::time::Duration::from_millis(300))
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let e = p.create(&common::spec("a"), Some(&ud)).await.unwrap_err();
    assert_ne!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    // ...while noise that gzip cannot shrink is refused, naming the gzip size.
    let noise: Vec<u8> = (0..40_000)
        .map(|_| fastrand::alphanumeric() as u8)
        .collect();
    let ud = UserData {
        format: UserDataFormat::ShellScript,
        encoding: machine_core::ContentEncoding::Gzip,
        bytes: gzip(&noise, GZIP_BEST_LEVEL),
    };
    let msg = refused(common::spec("a"), Some(ud), "userData").await;
    assert!(msg.contains("gzip"), "{msg}");
}

#[tokio::test]
async fn bad_labels_and_names_in_provider_ids_are_refused() {
    let mut spec = common::spec("a");
    spec.labels.insert("bad key".into(), "v".into());
    refused(spec, None, "labels.bad key").await;
    let wire = Tripwire::start().await;
    let p = common::provider(&wire.endpoint, "ids").await;
    for bad in ["sim:///m-1", "aws:///us-east-1a/vol-0123"] {
        let id = machine_core::ProviderId::new(bad).unwrap();
        let e = p.get(&id).await.unwrap_err();
        assert_eq!(e.field(), Some("providerID"), "{e}");
        let e = p.delete(&id).await.unwrap_err();
        assert_eq!(e.field(), Some("providerID"), "{e}");
    }
    assert_eq!(wire.connections(), 0);
}
