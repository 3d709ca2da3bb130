//! What a machine on moto's EC2 looks like: addresses, volumes and their tags, user
//! data (gzip too), power operations, console output; an unknown AMI with moto's AMI
//! validation on; and unknown credentials with moto's IAM checks on.

mod common;

use machine_core::decorators::Retrying;
use machine_core::{
    AddressKind, ContentEncoding, ErrorKind, MachineProvisioner, Phase, PowerOp, RetryPolicy,
    UserData, UserDataFormat,
    user_data::{GZIP_BEST_LEVEL, gzip},
};
use serde_json::json;

use common::Moto;
use common::proxy::{FaultProxy, Faults};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_has_addresses_tagged_volumes_user_data_and_power() {
    let moto = Moto::start();
    let owner = common::owner("features");
    let p = common::provider(&moto.endpoint, &owner).await;
    let script = "#cloud-config\nruncmd:\n".to_owned() + &"  - echo hello\n".repeat(500);
    let ud = UserData {
        format: UserDataFormat::CloudConfig,
        encoding: ContentEncoding::Gzip,
        bytes: gzip(script.as_bytes(), GZIP_BEST_LEVEL),
    };
    let mut spec = common::spec("feat-1")
        .with_label("team", "web")
        .with_provider(json!({
            "rootVolume": {"sizeGiB": 30, "type": "gp3"},
            "keyName": "ops",
            "tags": {"CostCenter": "42"},
            "sshUser": "admin"
        }));
    spec.ssh = None;
    let m = p.create(&spec, Some(&ud)).await.unwrap();
    assert!(
        m.provider_id.as_str().starts_with("aws:///us-east-1"),
        "{}",
        m.provider_id
    );
    let iid = m.provider_id.resource_id().to_owned();
    assert!(iid.starts_with("i-"));

    let got = p.get(&m.provider_id).await.unwrap();
    assert_eq!(got.phase, Phase::Provisioned);
    assert!(
        got.address(AddressKind::InternalIP).is_some(),
        "{:?}",
        got.addresses
    );
    assert!(
        got.address(AddressKind::InternalDNS).is_some(),
        "{:?}",
        got.addresses
    );
    assert_eq!(got.access.ssh.as_ref().unwrap().user, "admin");
    assert_eq!(got.labels["team"], "web");
    // moto's canned console has no cloud-init key block: no keys, and no error.
    assert!(got.access.host_keys.is_empty());
    let console = p.console_output(&m.provider_id).await.unwrap().unwrap();
    assert!(console.contains("Linux version"), "{console}");

    // User data comes back as given, gzip recognised.
    let back = p.user_data(&m.provider_id).await.unwrap().unwrap();
    assert_eq!(back.encoding, ContentEncoding::Gzip);
    assert_eq!(back.format, UserDataFormat::CloudConfig);
    assert_eq!(back.decoded().unwrap(), script.as_bytes());

    // The instance and its root volume carry the tags; the volume has the asked size.
    let sdk = common::sdk(&moto.endpoint).await;
    let vols = sdk
        .describe_volumes()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("attachment.instance-id")
                .values(&iid)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let vol = vols.volumes().first().expect("a root volume");
    assert_eq!(vol.size(), Some(30));
    let tag = |k: &str| {
        vol.tags()
            .iter()
            .find(|t| t.key() == Some(k))
            .and_then(|t| t.value())
            .map(str::to_owned)
    };
    assert_eq!(tag("Name").as_deref(), Some("feat-1"));
    assert_eq!(
        tag("machine-provisioning/owner").as_deref(),
        Some(owner.as_str())
    );
    assert_eq!(tag("CostCenter").as_deref(), Some("42"));

    // Stop and start.
    p.power(&m.provider_id, PowerOp::Stop).await.unwrap();
    let stopped = p.get(&m.provider_id).await.unwrap();
    assert!(!stopped.phase.is_running(), "{}", stopped.phase);
    assert!(!stopped.condition("InstanceRunning").unwrap().status);
    p.power(&m.provider_id, PowerOp::Start).await.unwrap();
    p.power(&m.provider_id, PowerOp::Reboot).await.unwrap();
    assert!(p.get(&m.provider_id).await.unwrap().phase.is_running());

    p.delete(&m.provider_id).await.unwrap();
    assert_eq!(p.get(&m.provider_id).await.unwrap().phase, Phase::Deleted);
    p.delete(&m.provider_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_ami_is_an_invalid_spec_naming_the_image_without_retry() {
    let moto = Moto::start_with(&[("MOTO_ENABLE_AMI_VALIDATION", "true")]);
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 9).await;
    let p = Retrying::new(
        common::provider_via_proxy(&proxy.endpoint, &common::owner("ami")).await,
        RetryPolicy::default(),
    );
    let spec = common::spec("ami-1").with_image("ami-0123456789abcdef0");
    let e = p.create(&spec, None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{e}");
    assert_eq!(e.field(), Some("image"), "{e}");
    assert!(e.to_string().contains("InvalidAMIID"), "{e}");
    assert_eq!(proxy.seen("RunInstances"), 1, "an invalid spec was retried");
    // A known AMI still launches on the same server.
    p.create(&common::spec("ami-2"), None).await.unwrap();

    // With a root volume the image is looked up first, with the same answer.
    let spec = spec.with_provider(json!({"rootVolume": {"sizeGiB": 10}}));
    let e = p.create(&spec, None).await.unwrap_err();
    assert_eq!(e.field(), Some("image"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_credentials_are_unauthorized() {
    let moto = Moto::start_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "0")]);
    let p = Retrying::new(
        common::provider(&moto.endpoint, &common::owner("auth")).await,
        RetryPolicy::default(),
    );
    let e = p.create(&common::spec("auth-1"), None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(!e.is_retryable());
}

/// Host keys come from the console only when asked for: `get` of a running machine
/// with discovery on reads it (once, then not before the recheck interval); `find`,
/// `create` and `delete` never do, nor `get` of a machine being deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_read_only_by_get_of_a_running_machine() {
    let moto = Moto::start();
    let proxy = FaultProxy::start(moto.addr, Faults::default(), 15).await;
    let p = common::provider_via_proxy(&proxy.endpoint, &common::owner("console")).await;
    let spec = common::spec("console-1");
    let m = p.create(&spec, None).await.unwrap();
    p.find(&spec.name).await.unwrap().unwrap();
    assert_eq!(proxy.seen("GetConsoleOutput"), 0, "create or find read it");
    let mut polls = 0;
    while !p.get(&m.provider_id).await.unwrap().phase.is_running() {
        polls += 1;
        assert!(polls < 50, "never ran");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        proxy.seen("GetConsoleOutput"),
        1,
        "get of a running machine"
    );
    p.get(&m.provider_id).await.unwrap();
    assert_eq!(proxy.seen("GetConsoleOutput"), 1, "read again within 15 s");
    p.delete(&m.provider_id).await.unwrap();
    let gone = p.get(&m.provider_id).await.unwrap();
    assert!(matches!(gone.phase, Phase::Deleting | Phase::Deleted));
    assert_eq!(
        proxy.seen("GetConsoleOutput"),
        1,
        "read for a machine being deleted"
    );
}
