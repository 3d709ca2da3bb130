//! Basic auth and TLS against sushy-tools: a wrong password is unauthorized and never
//! shown; a pinned fingerprint or the CA file is trusted, a wrong pin and the system
//! roots are refused.

mod common;

use machine_core::{ErrorKind, MachineName, MachineProvisioner, MachineSpec, SecretString};
use provider_baremetal::redfish::{
    BmcCredentials, RedfishClient, RedfishPoolConfig, RedfishProvider,
};
use provider_http::{HttpClient, HttpSettings, TlsConfig};

use common::sushy::{Options, Sushy};

fn client(sushy: &Sushy, tls: TlsConfig, password: &str) -> RedfishClient {
    RedfishClient::new(
        HttpClient::new(&HttpSettings::default().with_tls(tls)).expect("http client"),
        sushy.endpoint.parse().unwrap(),
        BmcCredentials::new("admin", SecretString::from(password.to_owned())),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_wrong_password_is_unauthorized_and_not_shown() {
    let sushy = Sushy::start_with(
        1,
        &Options {
            auth: Some(("admin".into(), "right-pw-7c1".into())),
            tls: false,
        },
    );
    let ok = client(&sushy, TlsConfig::default(), "right-pw-7c1");
    assert_eq!(ok.systems().await.expect("right password").len(), 1);
    let e = client(&sushy, TlsConfig::default(), "wrong-pw-3a9")
        .systems()
        .await
        .expect_err("wrong password");
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(!format!("{e} {e:?}").contains("wrong-pw-3a9"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_pinned_or_ca_trusted_wrong_pin_and_unknown_ca_refused() {
    let sushy = Sushy::start_with(
        1,
        &Options {
            auth: None,
            tls: true,
        },
    );
    let right: provider_http::CertFingerprint = sushy
        .fingerprint
        .as_deref()
        .unwrap()
        .parse()
        .expect("openssl's fingerprint");
    let pinned = client(&sushy, TlsConfig::default().with_pinned_sha256(right), "pw");
    assert_eq!(pinned.systems().await.expect("pinned").len(), 1);
    let ca = client(
        &sushy,
        TlsConfig::default().with_ca_file(sushy.cert_pem.clone().unwrap()),
        "pw",
    );
    assert_eq!(ca.systems().await.expect("CA file").len(), 1);

    let wrong: provider_http::CertFingerprint = "00".repeat(32).parse().unwrap();
    let e = client(&sushy, TlsConfig::default().with_pinned_sha256(wrong), "pw")
        .systems()
        .await
        .expect_err("wrong pin");
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    assert!(e.to_string().contains("TLS"), "{e}");
    let e = client(&sushy, TlsConfig::default(), "pw")
        .systems()
        .await
        .expect_err("self-signed against the system roots");
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");

    // The same through a pool YAML: a wrong fingerprint refuses the create.
    let claims = tempfile::tempdir().unwrap();
    let yaml = format!(
        "claimDir: {}\nservers:\n  - name: s0\n    bmc: {}\n    systemId: {}\n    \
         fingerprint: \"{}\"\n    credentials: {{username: admin, password: pw}}\n",
        claims.path().display(),
        sushy.endpoint,
        sushy.systems[0].id,
        "ab:".repeat(31) + "ab"
    );
    let p = RedfishProvider::new(
        RedfishPoolConfig::from_yaml(&yaml).unwrap(),
        &HttpSettings::default(),
    )
    .await
    .unwrap();
    let e = p
        .create(&MachineSpec::new(MachineName::new("m").unwrap()), None)
        .await
        .expect_err("wrong pin in the pool");
    assert_eq!(e.kind(), ErrorKind::Permanent, "{e}");
    assert!(p.list(&Default::default()).await.unwrap().is_empty());
}
