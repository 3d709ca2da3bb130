//! provider-aws's rows of the bad-input corpus (the rest is examples/tests/bad_input_corpus.rs,
//! whose crate does not build the AWS SDK): configuration documents, the builder and a
//! spec's EC2 settings, each refused by field (and line, for documents), without a panic,
//! in bounded time. No request is made: nothing here reaches `AwsProvider::new`.

use machine_core::conformance::{BadInput, check_bad_inputs};
use machine_core::{MachineName, MachineSpec, SecretString};
use provider_aws::{AwsConfig, Ec2Settings};
use std::time::Duration;

enum Input {
    /// `AwsConfig::from_yaml` then `build`.
    Yaml(String),
    /// `AwsConfig::from_json` then `build`.
    Json(String),
    /// The builder with one setter applied, then `build`.
    Builder(fn(provider_aws::AwsConfigBuilder) -> provider_aws::AwsConfigBuilder),
    /// A spec's `provider:` settings.
    Settings(serde_json::Value),
}

type Case = BadInput<Input>;

fn row(name: &'static str, input: Input, field: &str, line: Option<u32>) -> Case {
    BadInput::new(name, input, field, line)
}

fn run(input: &Input) -> machine_core::Result<()> {
    let base = || {
        AwsConfig::builder()
            .region("us-east-1")
            .static_credentials("AKIDEXAMPLE", SecretString::from("testing"))
    };
    match input {
        Input::Yaml(y) => AwsConfig::from_yaml(y)?
            .region("us-east-1")
            .build()
            .map(drop),
        Input::Json(j) => AwsConfig::from_json(j)?
            .region("us-east-1")
            .build()
            .map(drop),
        Input::Builder(set) => set(base()).build().map(drop),
        Input::Settings(v) => {
            let spec = MachineSpec::new(MachineName::new("m")?).with_provider(v.clone());
            Ec2Settings::from_spec(&spec).map(drop)
        }
    }
}

fn cases() -> Vec<Case> {
    use Input::*;
    use serde_json::json;
    let s = |t: &str| t.to_owned();
    vec![
        row(
            "an attempt timeout of 2^64-1 seconds is refused",
            Yaml(s(
                "region: us-east-1\nattemptTimeout: 18446744073709551615s\n",
            )),
            "attemptTimeout",
            Some(2),
        ),
        row(
            "an attempt timeout over a day is refused",
            Yaml(s("attemptTimeout: 25h\n")),
            "attemptTimeout",
            Some(1),
        ),
        row(
            "an attempt timeout of zero is refused",
            Yaml(s("attemptTimeout: 0s\n")),
            "attemptTimeout",
            Some(1),
        ),
        row(
            "a connect timeout of a century is refused",
            Yaml(s("owner: a\nconnectTimeout: 100years\n")),
            "connectTimeout",
            Some(2),
        ),
        row(
            "a consistency window of 2^64-1 seconds is refused",
            Yaml(s("consistencyWindow: 18446744073709551615s\n")),
            "consistencyWindow",
            Some(1),
        ),
        row(
            "a timeout without a unit is refused",
            Yaml(s("connectTimeout: 5\n")),
            "connectTimeout",
            Some(1),
        ),
        row(
            "a misspelled key is refused",
            Yaml(s("region: us-east-1\nregoin: x\n")),
            "regoin",
            Some(2),
        ),
        row(
            "a bad region in a document is refused",
            Yaml(s("region: mars\n")),
            "region",
            Some(1),
        ),
        row(
            "an endpoint without a scheme is refused",
            Yaml(s("endpointUrl: 127.0.0.1:5000\n")),
            "endpointUrl",
            Some(1),
        ),
        row(
            "a bad default subnet is refused",
            Yaml(s("defaults:\n  subnetId: subnet-xyz\n")),
            "defaults.subnetId",
            Some(2),
        ),
        row(
            "a root volume of 0 GiB is refused",
            Yaml(s("defaults:\n  rootVolume: {sizeGiB: 0}\n")),
            "defaults.rootVolume.sizeGiB",
            Some(2),
        ),
        row(
            "sdk attempts of 11 are refused",
            Yaml(s("sdkMaxAttempts: 11\n")),
            "sdkMaxAttempts",
            Some(1),
        ),
        row(
            "credentials without a secret key are refused",
            Yaml(s("credentials:\n  accessKeyId: AKIDEXAMPLE\n")),
            "credentials",
            Some(2),
        ),
        row(
            "a 10 KB owner is refused and shown cut",
            Yaml(format!("owner: {}\n", "o".repeat(10_000))),
            "owner",
            Some(1),
        ),
        row(
            "a JSON attempt timeout of 2^64-1 seconds is refused",
            Json(s(
                "{\"region\": \"us-east-1\",\n \"attemptTimeout\": \"18446744073709551615s\"}",
            )),
            "attemptTimeout",
            Some(2),
        ),
        row(
            "a JSON document with an unknown key is refused",
            Json(s("{\"regoin\": \"x\"}")),
            "regoin",
            Some(1),
        ),
        row(
            "a builder attempt timeout of Duration::MAX is refused",
            Builder(|b| b.attempt_timeout(Duration::MAX)),
            "attemptTimeout",
            None,
        ),
        row(
            "a builder connect timeout of Duration::MAX is refused",
            Builder(|b| b.connect_timeout(Duration::MAX)),
            "connectTimeout",
            None,
        ),
        row(
            "a builder consistency window of Duration::MAX is refused",
            Builder(|b| b.consistency_window(Duration::MAX)),
            "consistencyWindow",
            None,
        ),
        row(
            "a builder connect timeout of zero is refused",
            Builder(|b| b.connect_timeout(Duration::ZERO)),
            "connectTimeout",
            None,
        ),
        row(
            "a builder with an empty owner is refused",
            Builder(|b| b.owner("")),
            "owner",
            None,
        ),
        row(
            "a builder with a bad instance type is refused",
            Builder(|b| b.instance_type("large")),
            "instanceType",
            None,
        ),
        row(
            "spec settings with a bad security group are refused",
            Settings(json!({"securityGroupIds": ["default"]})),
            "provider.securityGroupIds[0]",
            None,
        ),
        row(
            "spec settings with a 10 KB tag key are refused with the key cut",
            Settings(json!({"tags": {"k".repeat(10_000): "v"}})),
            &format!("provider.tags.{}…", "k".repeat(64)),
            None,
        ),
        row(
            "spec settings with an unknown field are refused",
            Settings(json!({"subnetID": "subnet-12345678"})),
            "provider.subnetID",
            None,
        ),
    ]
}

#[test]
fn every_bad_aws_input_is_refused_by_field_and_line_without_panic_in_bounded_time() {
    check_bad_inputs(&cases(), run);
}
