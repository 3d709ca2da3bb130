//! How to reach EC2 and what to launch by default: [`AwsConfig`], built with
//! [`AwsConfigBuilder`] or read from the environment with [`AwsConfig::from_env`].

use std::fmt;
use std::time::Duration;

use machine_core::{Error, Result, SecretString};

use crate::settings::{self, Ec2Settings};

/// Where the provider's AWS credentials come from.
#[derive(Clone, Default)]
pub enum CredentialSource {
    /// The SDK's standard chain: environment variables, the shared config and
    /// credentials files (profiles, SSO, credential processes, role assumption), web
    /// identity, ECS and EC2 instance metadata (IMDS), in that order.
    #[default]
    DefaultChain,
    /// Fixed keys, as for simulators such as moto or short-lived session keys.
    Static {
        /// The access key id (not secret: it appears in every request).
        access_key_id: String,
        /// The secret access key.
        secret_access_key: SecretString,
        /// The session token of temporary credentials.
        session_token: Option<SecretString>,
    },
}

impl fmt::Debug for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialSource::DefaultChain => f.write_str("DefaultChain"),
            CredentialSource::Static {
                access_key_id,
                session_token,
                ..
            } => f
                .debug_struct("Static")
                .field("access_key_id", access_key_id)
                .field("secret_access_key", &"[REDACTED]")
                .field(
                    "session_token",
                    &session_token.as_ref().map(|_| "[REDACTED]"),
                )
                .finish(),
        }
    }
}

/// The configuration of an [`crate::AwsProvider`]. Build it with [`AwsConfig::builder`]
/// or [`AwsConfig::from_env`]; [`AwsConfigBuilder::build`] checks every field before any
/// call is made.
#[derive(Debug, Clone)]
pub struct AwsConfig {
    pub(crate) region: String,
    pub(crate) endpoint_url: Option<String>,
    pub(crate) credentials: CredentialSource,
    pub(crate) owner: String,
    pub(crate) image: Option<String>,
    pub(crate) instance_type: String,
    pub(crate) defaults: Ec2Settings,
    pub(crate) sdk_max_attempts: u32,
    pub(crate) connect_timeout: Duration,
    pub(crate) attempt_timeout: Duration,
    pub(crate) consistency_window: Duration,
    pub(crate) host_key_discovery: bool,
}

/// The instance type used when neither the spec's `size` nor the config names one.
pub const DEFAULT_INSTANCE_TYPE: &str = "t3.micro";

impl AwsConfig {
    /// An empty builder; only the region is required.
    pub fn builder() -> AwsConfigBuilder {
        AwsConfigBuilder::default()
    }

    /// A builder filled from the process environment:
    ///
    /// | variable | sets |
    /// |---|---|
    /// | `AWS_REGION`, else `AWS_DEFAULT_REGION` | the region (required) |
    /// | `AWS_ENDPOINT_URL_EC2`, else `AWS_ENDPOINT_URL` | the endpoint override |
    /// | `PROVIDER_AWS_OWNER` | the owner tag |
    /// | `PROVIDER_AWS_IMAGE` | the default image |
    /// | `PROVIDER_AWS_INSTANCE_TYPE` | the default instance type |
    /// | `PROVIDER_AWS_SUBNET_ID` | the default subnet |
    /// | `PROVIDER_AWS_SECURITY_GROUP_IDS` | default security groups, comma-separated |
    /// | `PROVIDER_AWS_KEY_NAME` | the default key pair |
    /// | `PROVIDER_AWS_INSTANCE_PROFILE` | the default instance profile |
    /// | `PROVIDER_AWS_SSH_USER` | the default SSH user |
    ///
    /// Credentials come from the standard chain, which reads `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE` and the rest itself.
    /// Nothing is checked until [`AwsConfigBuilder::build`].
    pub fn from_env() -> AwsConfigBuilder {
        AwsConfigBuilder::from_lookup(|k| std::env::var(k).ok())
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The endpoint override, if any.
    pub fn endpoint_url(&self) -> Option<&str> {
        self.endpoint_url.as_deref()
    }

    /// The owner every machine of this provider is tagged with and found by.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The defaults applied to every machine's settings.
    pub fn defaults(&self) -> &Ec2Settings {
        &self.defaults
    }
}

/// Builds an [`AwsConfig`]. Setters take values as given; [`AwsConfigBuilder::build`]
/// validates them and names the field of the first bad one.
#[derive(Debug, Clone)]
pub struct AwsConfigBuilder {
    region: Option<String>,
    endpoint_url: Option<String>,
    credentials: CredentialSource,
    owner: String,
    image: Option<String>,
    instance_type: Option<String>,
    defaults: Ec2Settings,
    sdk_max_attempts: u32,
    connect_timeout: Duration,
    attempt_timeout: Duration,
    consistency_window: Duration,
    host_key_discovery: bool,
}

impl Default for AwsConfigBuilder {
    fn default() -> Self {
        AwsConfigBuilder {
            region: None,
            endpoint_url: None,
            credentials: CredentialSource::DefaultChain,
            owner: "machine-provisioning".to_owned(),
            image: None,
            instance_type: None,
            defaults: Ec2Settings::default(),
            sdk_max_attempts: 1,
            connect_timeout: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(30),
            consistency_window: Duration::from_secs(60),
            host_key_discovery: true,
        }
    }
}

impl AwsConfigBuilder {
    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        let mut b = AwsConfigBuilder {
            region: get("AWS_REGION").or_else(|| get("AWS_DEFAULT_REGION")),
            endpoint_url: get("AWS_ENDPOINT_URL_EC2").or_else(|| get("AWS_ENDPOINT_URL")),
            image: get("PROVIDER_AWS_IMAGE"),
            instance_type: get("PROVIDER_AWS_INSTANCE_TYPE"),
            ..AwsConfigBuilder::default()
        };
        if let Some(owner) = get("PROVIDER_AWS_OWNER") {
            b.owner = owner;
        }
        b.defaults.subnet_id = get("PROVIDER_AWS_SUBNET_ID");
        b.defaults.security_group_ids = get("PROVIDER_AWS_SECURITY_GROUP_IDS").map(|v| {
            v.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        });
        b.defaults.key_name = get("PROVIDER_AWS_KEY_NAME");
        b.defaults.instance_profile = get("PROVIDER_AWS_INSTANCE_PROFILE");
        b.defaults.ssh_user = get("PROVIDER_AWS_SSH_USER");
        b
    }

    /// The AWS region (`us-east-1`). Required: it decides the endpoint and the signature.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Sends requests to `url` instead of EC2's regional endpoint (moto, LocalStack,
    /// a VPC endpoint). TLS is verified for `https` URLs as for EC2 itself.
    pub fn endpoint_url(mut self, url: impl Into<String>) -> Self {
        self.endpoint_url = Some(url.into());
        self
    }

    /// Uses fixed credentials instead of the standard chain.
    pub fn static_credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: SecretString,
    ) -> Self {
        self.credentials = CredentialSource::Static {
            access_key_id: access_key_id.into(),
            secret_access_key,
            session_token: None,
        };
        self
    }

    /// Sets where credentials come from.
    pub fn credentials(mut self, source: CredentialSource) -> Self {
        self.credentials = source;
        self
    }

    /// The owner (a team, a cluster, a controller) whose machines this provider creates
    /// and finds: stored in the `machine-provisioning/owner` tag. Two providers with the
    /// same owner in one account and region see the same machines; with different
    /// owners they never touch each other's. Default `machine-provisioning`.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// The image used when a spec names none.
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.image = Some(image.into());
        self
    }

    /// The instance type used when a spec's `size` is empty; default [`DEFAULT_INSTANCE_TYPE`].
    pub fn instance_type(mut self, instance_type: impl Into<String>) -> Self {
        self.instance_type = Some(instance_type.into());
        self
    }

    /// Default per-machine settings (subnet, security groups, key pair, instance profile,
    /// root volume, SSH user, extra tags); a spec's `provider` settings override them.
    pub fn defaults(mut self, defaults: Ec2Settings) -> Self {
        self.defaults = defaults;
        self
    }

    /// How many attempts the SDK itself makes per API call; default 1, which leaves
    /// every retry to [`machine_core::decorators::Retrying`] (see the crate docs on
    /// retries). Raise it only when no retrying decorator wraps the provider.
    pub fn sdk_max_attempts(mut self, attempts: u32) -> Self {
        self.sdk_max_attempts = attempts;
        self
    }

    /// How long to wait for a TCP (and TLS) connection; default 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one HTTP attempt may take, from sending to the whole answer; default 30 s.
    /// A slower answer is a transient error.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// For how long after this provider created an instance an
    /// `InvalidInstanceID.NotFound` about it is reported as transient (EC2 is eventually
    /// consistent: a new id may be unknown to the next call). Later it means not found.
    /// Default 60 s.
    pub fn consistency_window(mut self, window: Duration) -> Self {
        self.consistency_window = window;
        self
    }

    /// Whether `get` reads SSH host keys from running machines' console output (one
    /// GetConsoleOutput call per machine until keys are found, at most every 15 s).
    /// Default true.
    pub fn host_key_discovery(mut self, enabled: bool) -> Self {
        self.host_key_discovery = enabled;
        self
    }

    /// Checks every field and builds the config. Errors are invalid-spec errors naming
    /// the field: `region`, `endpointUrl`, `owner`, `image`, `instanceType`,
    /// `credentials.accessKeyId`, `sdkMaxAttempts`, a timeout, or a default setting
    /// (`defaults.subnetId`).
    pub fn build(self) -> Result<AwsConfig> {
        let region = self.region.ok_or_else(|| {
            Error::invalid_spec(
                "region",
                "is required: set it on the builder or in AWS_REGION",
            )
        })?;
        check_region(&region)?;
        if let Some(url) = &self.endpoint_url {
            check_endpoint(url)?;
        }
        if let CredentialSource::Static { access_key_id, .. } = &self.credentials
            && (access_key_id.is_empty() || access_key_id.chars().any(char::is_whitespace))
        {
            return Err(Error::invalid_spec(
                "credentials.accessKeyId",
                "must be non-empty without spaces",
            ));
        }
        settings::check_tag("owner", "machine-provisioning/owner", &self.owner)?;
        if self.owner.is_empty() {
            return Err(Error::invalid_spec("owner", "must not be empty"));
        }
        if let Some(image) = &self.image {
            settings::check_image(image)?;
        }
        let instance_type = self
            .instance_type
            .unwrap_or_else(|| DEFAULT_INSTANCE_TYPE.to_owned());
        settings::check_instance_type(&instance_type)
            .map_err(|e| Error::invalid_spec("instanceType", e.message().to_owned()))?;
        self.defaults.validate().map_err(|e| e.within("defaults"))?;
        if !(1..=10).contains(&self.sdk_max_attempts) {
            return Err(Error::invalid_spec(
                "sdkMaxAttempts",
                format!("{} is outside 1-10", self.sdk_max_attempts),
            ));
        }
        for (field, value) in [
            ("connectTimeout", self.connect_timeout),
            ("attemptTimeout", self.attempt_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::invalid_spec(field, "must be greater than zero"));
            }
        }
        Ok(AwsConfig {
            region,
            endpoint_url: self.endpoint_url,
            credentials: self.credentials,
            owner: self.owner,
            image: self.image,
            instance_type,
            defaults: self.defaults,
            sdk_max_attempts: self.sdk_max_attempts,
            connect_timeout: self.connect_timeout,
            attempt_timeout: self.attempt_timeout,
            consistency_window: self.consistency_window,
            host_key_discovery: self.host_key_discovery,
        })
    }
}

/// Checks a region name's form (`us-east-1`, `ap-southeast-2`, `us-gov-west-1`).
pub(crate) fn check_region(region: &str) -> Result<()> {
    let parts: Vec<&str> = region.split('-').collect();
    let ok = parts.len() >= 3
        && parts[..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase()))
        && parts[parts.len() - 1].chars().all(|c| c.is_ascii_digit())
        && !parts[parts.len() - 1].is_empty();
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_spec(
            "region",
            format!("{region:?} is not an AWS region like us-east-1"),
        ))
    }
}

fn check_endpoint(url: &str) -> Result<()> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    let host = rest.map(|r| r.split(['/', '?']).next().unwrap_or(""));
    match host {
        Some(h) if !h.is_empty() && !h.chars().any(char::is_whitespace) => Ok(()),
        _ => Err(Error::invalid_spec(
            "endpointUrl",
            format!("{url:?} is not an http:// or https:// URL"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use machine_core::ErrorKind;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> AwsConfigBuilder {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        AwsConfigBuilder::from_lookup(move |k| map.get(k).cloned())
    }

    #[test]
    fn missing_region_is_refused_by_name() {
        let e = AwsConfig::builder().build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some("region"));
        let e = env(&[]).build().unwrap_err();
        assert_eq!(e.field(), Some("region"));
        for bad in ["", "useast1", "us-east", "US-EAST-1", "us-east-1a"] {
            let e = AwsConfig::builder().region(bad).build().unwrap_err();
            assert_eq!(e.field(), Some("region"), "{bad:?}");
        }
    }

    #[test]
    fn environment_fills_the_builder() {
        let c = env(&[
            ("AWS_DEFAULT_REGION", "eu-west-1"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
            ("PROVIDER_AWS_OWNER", "team-a"),
            (
                "PROVIDER_AWS_SECURITY_GROUP_IDS",
                "sg-12345678, sg-0123456789abcdef0",
            ),
            ("PROVIDER_AWS_INSTANCE_TYPE", "m7g.large"),
        ])
        .build()
        .unwrap();
        assert_eq!(c.region(), "eu-west-1");
        assert_eq!(c.endpoint_url(), Some("http://127.0.0.1:5000"));
        assert_eq!(c.owner(), "team-a");
        assert_eq!(c.instance_type, "m7g.large");
        assert_eq!(
            c.defaults().security_group_ids.as_deref(),
            Some(&["sg-12345678".to_owned(), "sg-0123456789abcdef0".to_owned()][..])
        );
        let c = env(&[
            ("AWS_REGION", "us-east-2"),
            ("AWS_DEFAULT_REGION", "eu-west-1"),
        ])
        .build()
        .unwrap();
        assert_eq!(c.region(), "us-east-2");
        assert_eq!(c.owner(), "machine-provisioning");
    }

    #[test]
    fn bad_fields_are_named() {
        let base = || AwsConfig::builder().region("us-east-1");
        let cases = [
            (base().endpoint_url("127.0.0.1:5000"), "endpointUrl"),
            (base().owner(""), "owner"),
            (base().owner("o".repeat(300)), "owner"),
            (base().image(""), "image"),
            (base().instance_type("large"), "instanceType"),
            (base().sdk_max_attempts(0), "sdkMaxAttempts"),
            (base().attempt_timeout(Duration::ZERO), "attemptTimeout"),
            (
                base().static_credentials("", SecretString::from("x")),
                "credentials.accessKeyId",
            ),
            (
                base().defaults(Ec2Settings {
                    subnet_id: Some("subnet-1".into()),
                    ..Ec2Settings::default()
                }),
                "defaults.subnetId",
            ),
        ];
        for (builder, field) in cases {
            let e = builder.build().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidSpec);
            assert_eq!(e.field(), Some(field), "{e}");
        }
    }

    #[test]
    fn debug_never_shows_the_secret_key() {
        let c = AwsConfig::builder()
            .region("us-east-1")
            .credentials(CredentialSource::Static {
                access_key_id: "AKIDEXAMPLE".into(),
                secret_access_key: SecretString::from("wJalrXUtnFEMI"),
                session_token: Some(SecretString::from("FwoGZXIvYXdzE")),
            })
            .build()
            .unwrap();
        let dbg = format!("{c:?}");
        assert!(dbg.contains("AKIDEXAMPLE"), "{dbg}");
        assert!(
            !dbg.contains("wJalrXUtnFEMI") && !dbg.contains("FwoGZXIvYXdzE"),
            "{dbg}"
        );
    }
}
