//! A BMC that answers 503 for a while, then recovers: transient errors bare, success
//! through the retrying decorator.

mod common;

use std::sync::Arc;

use machine_core::decorators::Retrying;
use machine_core::{ErrorKind, MachineName, MachineProvisioner, MachineSpec, RetryPolicy};
use provider_baremetal::redfish::{RedfishPoolConfig, RedfishProvider};
use provider_http::HttpSettings;

use common::Sushy;
use common::flaky::{Fault, Flaky};
use machine_core::SecretString;
use provider_baremetal::redfish::{BmcCredentials, RedfishClient};
use provider_http::HttpClient;

async fn provider_at(sushy: &Sushy, endpoint: &str, dir: &std::path::Path) -> RedfishProvider {
    let yaml = common::pool_yaml_at(sushy, endpoint, dir, "team");
    RedfishProvider::new(
        RedfishPoolConfig::from_yaml(&yaml).unwrap(),
        &HttpSettings::default(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bmc_answering_503_then_recovering() {
    let sushy = Sushy::start(1);
    let spec = MachineSpec::new(MachineName::new("m").unwrap());

    // Bare: the 503 is a transient error, and the failed create left no claim.
    let flaky = Flaky::start(&sushy.endpoint, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let bare = provider_at(&sushy, &flaky.endpoint, dir.path()).await;
    let e = bare.create(&spec, None).await.expect_err("503");
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(e.to_string().contains("temporarily unavailable"), "{e}");
    assert!(bare.find(&spec.name).await.unwrap().is_none());

    // Retried: three 503s, then the BMC answers and the machine is made.
    let flaky = Flaky::start(&sushy.endpoint, 3).await;
    let retried = Retrying::new(
        Arc::new(provider_at(&sushy, &flaky.endpoint, dir.path()).await),
        RetryPolicy::default(),
    );
    let m = retried
        .create(&spec, None)
        .await
        .expect("create after the BMC recovered");
    assert!(flaky.requests() > 3);
    retried.delete(&m.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn html_or_truncated_answers_are_transient_errors_quoting_them() {
    let sushy = Sushy::start(1);
    let id = &sushy.systems[0].id;
    for (fault, quoted) in [
        (Fault::Html, "Gateway login"),
        (Fault::Truncated, "PowerSta"),
    ] {
        let flaky = Flaky::start_with(&sushy.endpoint, 1, fault).await;
        let c = RedfishClient::new(
            HttpClient::new(&HttpSettings::default()).unwrap(),
            flaky.endpoint.parse().unwrap(),
            BmcCredentials::new("admin", SecretString::from("pw")),
        );
        let e = c.system(id).await.expect_err("not Redfish JSON");
        assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
        assert!(
            e.to_string().contains("not the Redfish JSON expected"),
            "{e}"
        );
        assert!(e.to_string().contains(quoted), "{e}");
        // The next answer is sushy's own.
        assert_eq!(&c.system(id).await.expect("recovered").id, id);
    }
}
