//! How to reach EC2 and what to launch by default: [`AwsConfig`], built with
//! [`AwsConfigBuilder`], read from the environment with [`AwsConfig::from_env`] or from
//! a YAML document with [`AwsConfig::from_yaml`].

use std::fmt;
use std::time::Duration;

use machine_core::{
    Error, MAX_TIMEOUT, Result, SecretString, UrlSetting, at_document_line, check_duration,
    field_in_document, shown,
};
use serde::{Deserialize, Deserializer};

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

/// The configuration of an [`crate::AwsProvider`]. Build it with [`AwsConfig::builder`],
/// [`AwsConfig::from_env`] or [`AwsConfig::from_yaml`]; [`AwsConfigBuilder::build`]
/// checks every field before any call is made.
#[derive(Debug, Clone)]
pub struct AwsConfig {
    pub(crate) region: String,
    pub(crate) endpoint_url: Option<UrlSetting>,
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
    pub(crate) client_tokens: ClientTokens,
}

/// Whether the endpoint honours RunInstances' `ClientToken` (launches once per token).
///
/// With [`ClientTokens::Honoured`] two creators of one name in the same token epoch
/// share one instance through EC2 itself, so most creates skip the race settlement (a
/// wait and a name lookup after the launch; see `token.rs`). An endpoint that ignores
/// tokens (moto) launches once per request: every create must settle, so say
/// [`ClientTokens::Ignored`] for it, or concurrent creators of one name may each keep
/// an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ClientTokens {
    /// EC2's documented behaviour: one launch per token, kept at least 24 hours.
    #[default]
    Honoured,
    /// Every RunInstances launches (moto, some simulators).
    Ignored,
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

    /// A builder filled from a YAML document, for a config kept in a file. Keys are the
    /// builder's settings in camelCase, the names [`AwsConfigBuilder::build`]'s errors
    /// use; every key is optional (only `region` is required, and only by `build`), and
    /// what a document leaves out keeps the builder's default. The environment is not
    /// read.
    ///
    /// ```yaml
    /// region: eu-west-1
    /// endpointUrl: http://127.0.0.1:5000    # moto, LocalStack, a VPC endpoint
    /// owner: ci-cluster
    /// image: ami-0123456789abcdef0
    /// instanceType: t3.small
    /// defaults:                             # Ec2Settings, as under a spec's `provider:`
    ///   subnetId: subnet-0a1b2c3d4e5f60718
    ///   securityGroupIds: [sg-0123456789abcdef0]
    ///   keyName: ops
    ///   sshUser: admin
    ///   rootVolume: {sizeGiB: 20, type: gp3}
    ///   tags: {CostCenter: "42"}
    /// sdkMaxAttempts: 1
    /// connectTimeout: 5s                    # humantime durations: 500ms, 30s, 2m
    /// attemptTimeout: 30s
    /// consistencyWindow: 1m
    /// hostKeyDiscovery: true
    /// clientTokens: honoured                # `ignored` for moto: see ClientTokens
    /// credentials:                          # leave out for the standard chain
    ///   accessKeyId: AKIDEXAMPLE
    ///   secretAccessKey: wJalrXUtnFEMI      # kept as a SecretString
    ///   sessionToken: FwoGZXIvYXdzE         # optional
    /// ```
    ///
    /// It returns the builder, as [`AwsConfig::from_env`] does, so that a caller can
    /// override fields (a region from the command line, keys from a secret store) before
    /// [`AwsConfigBuilder::build`] checks them:
    ///
    /// ```
    /// use provider_aws::AwsConfig;
    ///
    /// let config = AwsConfig::from_yaml("region: eu-west-1\nowner: ci-cluster\n")?
    ///     .instance_type("m7g.large")
    ///     .build()?;
    /// assert_eq!(config.owner(), "ci-cluster");
    /// # Ok::<(), machine_core::Error>(())
    /// ```
    ///
    /// Unknown keys are refused, and so are values of the wrong type, such as a duration
    /// without a unit: the error is an invalid-spec error whose [`Error::field`] is the
    /// key's path (`defaults.rootVolume.sizeGiB`, `connectTimeout`) and whose message
    /// gives the line and column. Messages never show the lines around the mistake, and
    /// never a value under `credentials`, so that a secret does not end up in a log.
    /// Values are checked by [`AwsConfigBuilder::build`]; a bad value the document itself
    /// holds (`attemptTimeout: 18446744073709551615s`, `defaults.subnetId: x`) is refused
    /// here already, with its line.
    pub fn from_yaml(yaml: &str) -> Result<AwsConfigBuilder> {
        let file: AwsConfigFile = machine_core::from_yaml_redacting(yaml, is_secret_field)?;
        refuse_bad_values_written(file.apply(AwsConfigBuilder::default()), yaml)
    }

    /// [`AwsConfig::from_yaml`] for a JSON document: the same keys, the same checks, the
    /// same redaction of `credentials`.
    pub fn from_json(json: &str) -> Result<AwsConfigBuilder> {
        let file: AwsConfigFile = machine_core::from_json_redacting(json, is_secret_field)?;
        refuse_bad_values_written(file.apply(AwsConfigBuilder::default()), json)
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The endpoint override, if any.
    pub fn endpoint_url(&self) -> Option<&str> {
        self.endpoint_url.as_ref().map(UrlSetting::as_str)
    }

    /// The owner every machine of this provider is tagged with and found by.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The defaults applied to every machine's settings.
    pub fn defaults(&self) -> &Ec2Settings {
        &self.defaults
    }

    /// Where credentials come from (its Debug never shows a secret).
    pub fn credentials(&self) -> &CredentialSource {
        &self.credentials
    }

    /// The image used when a spec names none.
    pub fn image(&self) -> Option<&str> {
        self.image.as_deref()
    }

    /// The instance type used when a spec's `size` is empty.
    pub fn instance_type(&self) -> &str {
        &self.instance_type
    }

    /// How many attempts the SDK makes per API call.
    pub fn sdk_max_attempts(&self) -> u32 {
        self.sdk_max_attempts
    }

    /// How long to wait for a connection.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// How long one HTTP attempt may take.
    pub fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// For how long after a create `InvalidInstanceID.NotFound` is transient.
    pub fn consistency_window(&self) -> Duration {
        self.consistency_window
    }

    /// Whether `get` reads SSH host keys from the console.
    pub fn host_key_discovery(&self) -> bool {
        self.host_key_discovery
    }

    /// Whether the endpoint honours client tokens.
    pub fn client_tokens(&self) -> ClientTokens {
        self.client_tokens
    }
}

fn is_secret_field(field: &str) -> bool {
    field == "credentials" || field.starts_with("credentials.")
}

/// Builds once to find a bad value the document wrote; what it left out (the region, for
/// a caller to give) is still only required by the caller's own `build`.
fn refuse_bad_values_written(
    builder: AwsConfigBuilder,
    document: &str,
) -> Result<AwsConfigBuilder> {
    let mut trial = builder.clone();
    if trial.region.is_none() {
        // A stand-in, so that the trial reaches the fields after the region.
        trial.region = Some("us-east-1".to_owned());
    }
    match trial.build() {
        Err(e) if e.field().is_some_and(|f| field_in_document(document, f)) => {
            Err(at_document_line(e, document))
        }
        _ => Ok(builder),
    }
}

/// The YAML form of [`AwsConfigBuilder`]: every key optional, unknown keys refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AwsConfigFile {
    region: Option<String>,
    endpoint_url: Option<UrlSetting>,
    owner: Option<String>,
    image: Option<String>,
    instance_type: Option<String>,
    defaults: Option<Ec2Settings>,
    sdk_max_attempts: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    connect_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    attempt_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    consistency_window: Option<Duration>,
    host_key_discovery: Option<bool>,
    client_tokens: Option<ClientTokens>,
    credentials: Option<StaticCredentials>,
}

/// `credentials:` in YAML: static keys, the secret ones read straight into
/// [`SecretString`]s.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StaticCredentials {
    access_key_id: String,
    #[serde(deserialize_with = "secret")]
    secret_access_key: SecretString,
    #[serde(default, deserialize_with = "optional_secret")]
    session_token: Option<SecretString>,
}

fn secret<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<SecretString, D::Error> {
    String::deserialize(d).map(SecretString::from)
}

fn optional_secret<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<SecretString>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.map(SecretString::from))
}

impl AwsConfigFile {
    /// Sets on `b` what the document gives, leaving the rest as it was.
    fn apply(self, mut b: AwsConfigBuilder) -> AwsConfigBuilder {
        fn set<T>(field: &mut T, value: Option<T>) {
            if let Some(v) = value {
                *field = v;
            }
        }
        b.region = self.region.or(b.region);
        b.endpoint_url = self.endpoint_url.or(b.endpoint_url);
        set(&mut b.owner, self.owner);
        b.image = self.image.or(b.image);
        b.instance_type = self.instance_type.or(b.instance_type);
        set(&mut b.defaults, self.defaults);
        set(&mut b.sdk_max_attempts, self.sdk_max_attempts);
        set(&mut b.connect_timeout, self.connect_timeout);
        set(&mut b.attempt_timeout, self.attempt_timeout);
        set(&mut b.consistency_window, self.consistency_window);
        set(&mut b.host_key_discovery, self.host_key_discovery);
        set(&mut b.client_tokens, self.client_tokens);
        if let Some(c) = self.credentials {
            b.credentials = CredentialSource::Static {
                access_key_id: c.access_key_id,
                secret_access_key: c.secret_access_key,
                session_token: c.session_token,
            };
        }
        b
    }
}

/// Builds an [`AwsConfig`]. Setters take values as given; [`AwsConfigBuilder::build`]
/// validates them and names the field of the first bad one.
#[derive(Debug, Clone)]
pub struct AwsConfigBuilder {
    region: Option<String>,
    // Debug shows it without user information; build refuses user information.
    endpoint_url: Option<UrlSetting>,
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
    client_tokens: ClientTokens,
}

impl Default for AwsConfigBuilder {
    fn default() -> Self {
        AwsConfigBuilder {
            region: None,
            endpoint_url: None,
            credentials: CredentialSource::DefaultChain,
            owner: machine_core::DEFAULT_OWNER.to_owned(),
            image: None,
            instance_type: None,
            defaults: Ec2Settings::default(),
            sdk_max_attempts: 1,
            connect_timeout: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(30),
            consistency_window: Duration::from_secs(60),
            host_key_discovery: true,
            client_tokens: ClientTokens::Honoured,
        }
    }
}

impl AwsConfigBuilder {
    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        let mut b = AwsConfigBuilder {
            region: get("AWS_REGION").or_else(|| get("AWS_DEFAULT_REGION")),
            endpoint_url: get("AWS_ENDPOINT_URL_EC2")
                .or_else(|| get("AWS_ENDPOINT_URL"))
                .map(UrlSetting::from),
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
        self.endpoint_url = Some(UrlSetting::new(url));
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

    /// How long to wait for a TCP (and TLS) connection; default 5 s, at most
    /// [`MAX_TIMEOUT`] (one day).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one HTTP attempt may take, from sending to the whole answer; default 30 s,
    /// at most [`MAX_TIMEOUT`] (one day). A slower answer is a transient error.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// For how long after this provider created an instance an
    /// `InvalidInstanceID.NotFound` about it is reported as transient (EC2 is eventually
    /// consistent: a new id may be unknown to the next call). Later it means not found.
    /// Default 60 s; zero turns the window off; at most [`MAX_TIMEOUT`] (one day).
    pub fn consistency_window(mut self, window: Duration) -> Self {
        self.consistency_window = window;
        self
    }

    /// Whether `get` reads SSH host keys from running machines' console output (one
    /// GetConsoleOutput call per machine until keys are found, at most every 15 s).
    /// Default true. It is also what the provider declares as
    /// [`machine_core::Capabilities::host_key_discovery`], a promise that running
    /// machines come to report their keys: turn it off for images that do not print
    /// them to the console (cloud-init's `keys-to-console` does, in the usual cloud
    /// images; Windows and bare images do not) and for endpoints that run no guest
    /// (moto's console is one canned boot log), where keys would never come.
    pub fn host_key_discovery(mut self, enabled: bool) -> Self {
        self.host_key_discovery = enabled;
        self
    }

    /// Whether the endpoint honours RunInstances' `ClientToken` (YAML `clientTokens:
    /// honoured | ignored`). Default [`ClientTokens::Honoured`], as EC2 does; set
    /// [`ClientTokens::Ignored`] for moto and other endpoints that launch on every
    /// request, so that every create settles races itself.
    pub fn client_tokens(mut self, tokens: ClientTokens) -> Self {
        self.client_tokens = tokens;
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
            url.check("endpointUrl")?;
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
        // Bounded so that no deadline derived from them overflows the clock (the SDK
        // panicked on an attemptTimeout of 18446744073709551615s).
        check_duration("connectTimeout", self.connect_timeout, MAX_TIMEOUT)?;
        check_duration("attemptTimeout", self.attempt_timeout, MAX_TIMEOUT)?;
        if !self.consistency_window.is_zero() {
            check_duration("consistencyWindow", self.consistency_window, MAX_TIMEOUT)?;
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
            client_tokens: self.client_tokens,
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
            format!("{} is not an AWS region like us-east-1", shown(region)),
        ))
    }
}

fn check_endpoint(url: &UrlSetting) -> Result<()> {
    let text = url.as_str();
    let rest = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"));
    let host = rest.map(|r| r.split(['/', '?']).next().unwrap_or(""));
    match host {
        Some(h) if !h.is_empty() && !h.chars().any(char::is_whitespace) => Ok(()),
        _ => Err(Error::invalid_spec(
            "endpointUrl",
            format!(
                "{} is not an http:// or https:// URL",
                shown(&url.to_string())
            ),
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
    fn an_endpoint_with_credentials_is_refused_and_never_shown() {
        let b = AwsConfig::builder()
            .region("us-east-1")
            .endpoint_url("https://AKIA:s3cr3t@ec2.example.org");
        assert!(!format!("{b:?}").contains("s3cr3t"), "{b:?}");
        let e = b.build().unwrap_err();
        assert_eq!(e.field(), Some("endpointUrl"), "{e}");
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
        let e = AwsConfig::from_yaml("region: us-east-1\nendpointUrl: ftp://AKIA:s3cr3t@x\n")
            .unwrap_err();
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
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
            (base().attempt_timeout(Duration::MAX), "attemptTimeout"),
            (
                base().attempt_timeout(MAX_TIMEOUT + Duration::from_secs(1)),
                "attemptTimeout",
            ),
            (base().connect_timeout(Duration::MAX), "connectTimeout"),
            (
                base().consistency_window(Duration::MAX),
                "consistencyWindow",
            ),
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

    const FULL: &str = "\
region: eu-west-1
endpointUrl: http://127.0.0.1:5000
owner: team-a
image: ami-0123456789abcdef0
instanceType: m7g.large
defaults:
  subnetId: subnet-0a1b2c3d4e5f60718
  securityGroupIds: [sg-12345678, sg-0123456789abcdef0]
  keyName: ops
  instanceProfile: node-role
  availabilityZone: eu-west-1b
  rootVolume: {sizeGiB: 20, type: gp3, encrypted: true}
  sshUser: admin
  tags: {CostCenter: \"42\"}
sdkMaxAttempts: 3
connectTimeout: 2s
attemptTimeout: 1m 30s
consistencyWindow: 500ms
hostKeyDiscovery: false
clientTokens: ignored
credentials:
  accessKeyId: AKIDEXAMPLE
  secretAccessKey: wJalrXUtnFEMI
  sessionToken: FwoGZXIvYXdzE
";

    #[test]
    fn a_full_yaml_document_fills_every_field() {
        let c = AwsConfig::from_yaml(FULL).unwrap().build().unwrap();
        assert_eq!(c.region(), "eu-west-1");
        assert_eq!(c.endpoint_url(), Some("http://127.0.0.1:5000"));
        assert_eq!(c.owner(), "team-a");
        assert_eq!(c.image(), Some("ami-0123456789abcdef0"));
        assert_eq!(c.instance_type(), "m7g.large");
        assert_eq!(c.sdk_max_attempts(), 3);
        assert_eq!(c.connect_timeout(), Duration::from_secs(2));
        assert_eq!(c.attempt_timeout(), Duration::from_secs(90));
        assert_eq!(c.consistency_window(), Duration::from_millis(500));
        assert!(!c.host_key_discovery());
        assert_eq!(c.client_tokens(), ClientTokens::Ignored);
        let d = c.defaults();
        assert_eq!(d.subnet_id.as_deref(), Some("subnet-0a1b2c3d4e5f60718"));
        assert_eq!(
            d.security_group_ids.as_deref(),
            Some(&["sg-12345678".to_owned(), "sg-0123456789abcdef0".to_owned()][..])
        );
        assert_eq!(d.key_name.as_deref(), Some("ops"));
        assert_eq!(d.instance_profile.as_deref(), Some("node-role"));
        assert_eq!(d.availability_zone.as_deref(), Some("eu-west-1b"));
        assert_eq!(
            d.root_volume,
            Some(crate::RootVolume {
                size_gib: 20,
                volume_type: Some("gp3".into()),
                device_name: None,
                encrypted: Some(true),
            })
        );
        assert_eq!(d.ssh_user.as_deref(), Some("admin"));
        assert_eq!(d.tags["CostCenter"], "42");
        match c.credentials() {
            CredentialSource::Static {
                access_key_id,
                secret_access_key,
                session_token,
            } => {
                use machine_core::ExposeSecret;
                assert_eq!(access_key_id, "AKIDEXAMPLE");
                assert_eq!(secret_access_key.expose_secret(), "wJalrXUtnFEMI");
                assert_eq!(
                    session_token.as_ref().map(|t| t.expose_secret()),
                    Some("FwoGZXIvYXdzE")
                );
            }
            other => panic!("expected static credentials, got {other:?}"),
        }
    }

    #[test]
    fn yaml_leaves_out_what_it_does_not_say_and_the_builder_overrides_it() {
        let c = AwsConfig::from_yaml("region: us-east-2\n")
            .unwrap()
            .owner("from-code")
            .build()
            .unwrap();
        let d = AwsConfig::builder().region("us-east-2").build().unwrap();
        assert_eq!(c.owner(), "from-code");
        assert_eq!(c.instance_type(), DEFAULT_INSTANCE_TYPE);
        assert_eq!(c.image(), None);
        assert_eq!(c.endpoint_url(), None);
        assert!(matches!(c.credentials(), CredentialSource::DefaultChain));
        assert_eq!(c.defaults(), &Ec2Settings::default());
        assert_eq!(c.sdk_max_attempts(), d.sdk_max_attempts());
        assert_eq!(c.connect_timeout(), d.connect_timeout());
        assert_eq!(c.attempt_timeout(), d.attempt_timeout());
        assert_eq!(c.consistency_window(), d.consistency_window());
        assert_eq!(c.host_key_discovery(), d.host_key_discovery());
        assert_eq!(c.client_tokens(), ClientTokens::Honoured);
        // A region given in code wins over the document's.
        let c = AwsConfig::from_yaml("region: us-east-2\n")
            .unwrap()
            .region("eu-north-1")
            .build()
            .unwrap();
        assert_eq!(c.region(), "eu-north-1");
    }

    #[test]
    fn unknown_yaml_fields_are_named_with_their_line() {
        let e =
            AwsConfig::from_yaml("region: us-east-1\nowner: a\nregoin: eu-west-1\n").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some("regoin"), "{e}");
        assert!(e.message().contains("unknown field `regoin`"), "{e}");
        assert!(e.message().contains("line 3"), "{e}");
        let e = AwsConfig::from_yaml(
            "region: us-east-1\ndefaults:\n  keyName: ops\n  subnetID: subnet-12345678\n",
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("defaults.subnetID"), "{e}");
        assert!(e.message().contains("line 4"), "{e}");
        let e = AwsConfig::from_yaml("credentials:\n  accessKeyId: AKIDEXAMPLE\n  secretKey: x\n")
            .unwrap_err();
        assert_eq!(e.field(), Some("credentials.secretKey"), "{e}");
        assert!(e.message().contains("line 3"), "{e}");
        // A key given twice is named by the map holding it, with the second one's line.
        let e = AwsConfig::from_yaml("defaults:\n  keyName: a\n  keyName: b\n").unwrap_err();
        assert_eq!(e.field(), Some("defaults"), "{e}");
        assert!(
            e.message().contains("keyName") && e.message().contains("line 3"),
            "{e}"
        );
        let e = AwsConfig::from_yaml("region: us-east-1\nregion: eu-west-1\n").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), None, "{e}");
        assert!(
            e.message().contains("region") && e.message().contains("line 2"),
            "{e}"
        );
    }

    #[test]
    fn mistyped_yaml_values_name_the_field() {
        for (yaml, field, line) in [
            (
                "region: us-east-1\nconnectTimeout: 5 parsecs\n",
                "connectTimeout",
                2,
            ),
            ("attemptTimeout: 30\n", "attemptTimeout", 1),
            (
                "owner: a\n\nconsistencyWindow: soon\n",
                "consistencyWindow",
                3,
            ),
            ("sdkMaxAttempts: many\n", "sdkMaxAttempts", 1),
            ("hostKeyDiscovery: sometimes\n", "hostKeyDiscovery", 1),
            ("clientTokens: maybe\n", "clientTokens", 1),
            (
                "defaults:\n  rootVolume: {sizeGiB: big}\n",
                "defaults.rootVolume.sizeGiB",
                2,
            ),
            (
                "credentials:\n  accessKeyId: AKIDEXAMPLE\n",
                "credentials",
                2,
            ),
        ] {
            let e = AwsConfig::from_yaml(yaml).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{yaml:?}");
            assert_eq!(e.field(), Some(field), "{yaml:?}: {e}");
            assert!(
                e.message().contains(&format!("line {line}")),
                "{yaml:?}: {e}"
            );
        }
        // Well-formed but bad values the document wrote are refused as it is read, by
        // the same names as build gives them, with their line.
        let e = AwsConfig::from_yaml("region: us-east-1\ndefaults: {subnetId: subnet-1}\n")
            .unwrap_err();
        assert_eq!(e.field(), Some("defaults.subnetId"), "{e}");
        assert!(e.message().contains("line 2"), "{e}");
        let e = AwsConfig::from_yaml("region: us-east-1\nconnectTimeout: 0s\n").unwrap_err();
        assert_eq!(e.field(), Some("connectTimeout"), "{e}");
        assert!(e.message().contains("line 2"), "{e}");
        // The same value set in code is refused by build.
        let e = AwsConfig::from_yaml("region: us-east-1\n")
            .unwrap()
            .connect_timeout(Duration::ZERO)
            .build()
            .unwrap_err();
        assert_eq!(e.field(), Some("connectTimeout"), "{e}");
    }

    #[test]
    fn absurd_timeouts_in_a_document_are_refused_with_field_and_line() {
        for (doc, field, line) in [
            (
                "region: us-east-1\nattemptTimeout: 18446744073709551615s\n",
                "attemptTimeout",
                2,
            ),
            ("connectTimeout: 2days\n", "connectTimeout", 1),
            (
                "owner: a\nconsistencyWindow: 100years\n",
                "consistencyWindow",
                2,
            ),
            (
                "{\"region\": \"us-east-1\",\n \"attemptTimeout\": \"5000000000s\"}",
                "attemptTimeout",
                2,
            ),
        ] {
            let e = if doc.starts_with('{') {
                AwsConfig::from_json(doc).unwrap_err()
            } else {
                AwsConfig::from_yaml(doc).unwrap_err()
            };
            assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{doc:?}");
            assert_eq!(e.field(), Some(field), "{doc:?}: {e}");
            assert!(
                e.message().contains(&format!("line {line}")),
                "{doc:?}: {e}"
            );
        }
        // The limit itself, and a window of zero, are accepted.
        AwsConfig::from_yaml("region: us-east-1\nattemptTimeout: 1day\nconsistencyWindow: 0s\n")
            .unwrap()
            .build()
            .unwrap();
    }

    #[test]
    fn json_documents_read_like_yaml() {
        let c = AwsConfig::from_json("{\"region\": \"eu-west-1\", \"attemptTimeout\": \"45s\"}")
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(c.attempt_timeout(), Duration::from_secs(45));
        let e = AwsConfig::from_json(
            "{\"credentials\": {\"accessKeyId\": 1, \"secretAccessKey\": \"wJalrXUtnFEMI\"}}",
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("credentials.accessKeyId"), "{e}");
        assert!(!e.to_string().contains("wJalrXUtnFEMI"), "{e}");
    }

    #[test]
    fn yaml_without_a_region_fails_at_build_naming_it() {
        let b = AwsConfig::from_yaml("owner: team-a\nimage: ami-0123456789abcdef0\n").unwrap();
        let e = b.build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec);
        assert_eq!(e.field(), Some("region"), "{e}");
    }

    #[test]
    fn secrets_from_yaml_never_show() {
        let builder = AwsConfig::from_yaml(FULL).unwrap();
        let config = builder.clone().build().unwrap();
        for dbg in [format!("{builder:?}"), format!("{config:?}")] {
            assert!(dbg.contains("AKIDEXAMPLE"), "{dbg}");
            assert!(
                !dbg.contains("wJalrXUtnFEMI") && !dbg.contains("FwoGZXIvYXdzE"),
                "{dbg}"
            );
        }
        // Nor in errors: not as a neighbour of the mistake, nor as a misplaced value.
        for yaml in [
            "credentials:\n  accessKeyId: AKIDEXAMPLE\n  secretAccessKey: wJalrXUtnFEMI\n  sesionToken: FwoGZXIvYXdzE\n",
            "credentials:\n  secretAccessKey: wJalrXUtnFEMI\n  accessKeyId: [FwoGZXIvYXdzE]\n",
            "credentials: wJalrXUtnFEMI\n",
            "credentials:\n  accessKeyId: AKIDEXAMPLE\n  secretAccessKey: {FwoGZXIvYXdzE: wJalrXUtnFEMI}\n",
            "region: [wJalrXUtnFEMI\n",
        ] {
            let e = AwsConfig::from_yaml(yaml).unwrap_err();
            let shown = format!("{e} {e:?}");
            assert!(
                !shown.contains("wJalrXUtnFEMI") && !shown.contains("FwoGZXIvYXdzE"),
                "{shown}"
            );
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
