//! The wire half: EC2 calls through the official SDK, each one attempt (unless the
//! config says otherwise), with every error mapped by [`crate::errors`].

use aws_config::BehaviorVersion;
use aws_sdk_ec2::config::StalledStreamProtectionConfig;
use aws_sdk_ec2::config::retry::{ClientRateLimiter, RetryConfig, RetryPartition};
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{Credentials, Region};
use aws_sdk_ec2::types::{
    BlockDeviceMapping, EbsBlockDevice, Filter, IamInstanceProfileSpecification, Instance,
    InstanceAttributeName, InstanceType, Placement, ResourceType, Tag, TagSpecification,
    VolumeType,
};
use base64::Engine;
use machine_core::{Error, ExposeSecret, Result};

use crate::config::{AwsConfig, CredentialSource};
use crate::errors::from_sdk;
use crate::settings::{Ec2Settings, RootVolume};

/// An EC2 client for one region and endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Ec2 {
    sdk: aws_sdk_ec2::Client,
    /// Where requests go (`region us-east-1, endpoint https://...`), for errors that
    /// got no answer: a name that does not resolve says which.
    target: std::sync::Arc<str>,
    /// The rate limiters of the APIs that have their own (see [`Paced`]).
    paced: [RetryPartition; 5],
}

/// The APIs paced by a rate limiter of their own. EC2 keeps a token bucket per API,
/// and these have the smallest (RunInstances and StartInstances 5 requests and 2 a
/// second, TerminateInstances 100 and 5, the other mutating ones 50 and 5, against 100
/// and 20 for `Describe*`): were they paced with the lookups, a throttled launch would
/// slow every DescribeInstances of the fleet down to the launch rate.
#[derive(Debug, Clone, Copy)]
enum Paced {
    Run = 0,
    Terminate = 1,
    Start = 2,
    Stop = 3,
    Reboot = 4,
}

/// The SDK's shared configuration for `config` (region, credentials, one attempt per
/// call in adaptive mode, timeouts) with requests going to `endpoint` when given.
/// With the standard chain this reads the environment and the shared config files, but
/// makes no network call until the first request.
pub(crate) async fn load(config: &AwsConfig, endpoint: Option<&str>) -> aws_config::SdkConfig {
    // Adaptive mode is standard mode plus the SDK's client-side rate limiter: after
    // a throttling answer it paces every later request of this client (CUBIC, as
    // AWS's SDKs specify), so a fleet stops spending EC2's tokens on requests that
    // would be refused. It delays sends only; how often a call is retried is still
    // `sdk_max_attempts`, and the limiter learns from every answer even at 1.
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(config.region.clone()))
        .retry_config(RetryConfig::adaptive().with_max_attempts(config.sdk_max_attempts))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(config.connect_timeout)
                .operation_attempt_timeout(config.attempt_timeout)
                .build(),
        )
        // EC2's answers are small and every attempt has a timeout, which bounds a
        // stalled answer too; the SDK's throughput watch costs CPU on every call.
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled());
    if let Some(url) = endpoint {
        loader = loader.endpoint_url(url);
    }
    if let CredentialSource::Static {
        access_key_id,
        secret_access_key,
        session_token,
    } = &config.credentials
    {
        loader = loader.credentials_provider(Credentials::new(
            access_key_id,
            secret_access_key.expose_secret(),
            session_token.as_ref().map(|t| t.expose_secret().to_owned()),
            None,
            "provider-aws-static",
        ));
    }
    loader.load().await
}

/// Everything RunInstances needs for one machine.
#[derive(Debug)]
pub(crate) struct Launch<'a> {
    pub image: &'a str,
    pub instance_type: &'a str,
    pub settings: &'a Ec2Settings,
    /// The root device name, when a root volume is configured.
    pub root_device: Option<&'a str>,
    /// Raw user data bytes (compressed or not); base64 is applied here.
    pub user_data: Option<&'a [u8]>,
    pub tags: &'a [(String, String)],
    pub client_token: &'a str,
}

impl Ec2 {
    /// Builds the SDK client: region, endpoint, credentials, retries and timeouts as
    /// `config` says. With the standard chain this reads the environment and the shared
    /// config files, but makes no network call until the first request.
    pub(crate) async fn connect(config: &AwsConfig) -> Result<Self> {
        let sdk_config = load(config, config.endpoint_url.as_ref().map(|u| u.as_str())).await;
        let ec2_config = aws_sdk_ec2::config::Builder::from(&sdk_config)
            .interceptor(crate::redact::RedactBodies)
            .interceptor(WholeAnswers)
            .retry_partition(own_rate_limiter(&config.region, "describe"))
            .build();
        let paced = ["run", "terminate", "start", "stop", "reboot"]
            .map(|api| own_rate_limiter(&config.region, api));
        let endpoint = config.endpoint_url.as_ref().map_or_else(
            || format!("https://ec2.{}.amazonaws.com", config.region),
            |url| url.to_string(),
        );
        Ok(Ec2 {
            sdk: aws_sdk_ec2::Client::from_conf(ec2_config),
            target: format!("region {}, endpoint {endpoint}", config.region).into(),
            paced,
        })
    }

    /// The config override that paces `api` by its own rate limiter.
    fn paced(&self, api: Paced) -> aws_sdk_ec2::config::Builder {
        aws_sdk_ec2::config::Builder::default().retry_partition(self.paced[api as usize].clone())
    }

    /// RunInstances for exactly one instance; the instance as EC2 answered.
    pub(crate) async fn run_instance(&self, l: &Launch<'_>) -> Result<Instance> {
        let tags: Vec<Tag> = l
            .tags
            .iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        let spec_for = |rt: ResourceType| {
            TagSpecification::builder()
                .resource_type(rt)
                .set_tags(Some(tags.clone()))
                .build()
        };
        let s = l.settings;
        let mut req = self
            .sdk
            .run_instances()
            .image_id(l.image)
            .instance_type(InstanceType::from(l.instance_type))
            .min_count(1)
            .max_count(1)
            .client_token(l.client_token)
            .tag_specifications(spec_for(ResourceType::Instance))
            .tag_specifications(spec_for(ResourceType::Volume))
            .set_subnet_id(s.subnet_id.clone())
            .set_security_group_ids(s.security_group_ids.clone())
            .set_key_name(s.key_name.clone());
        if let Some(profile) = &s.instance_profile {
            let spec = if profile.starts_with("arn:") {
                IamInstanceProfileSpecification::builder().arn(profile)
            } else {
                IamInstanceProfileSpecification::builder().name(profile)
            };
            req = req.iam_instance_profile(spec.build());
        }
        if let Some(zone) = &s.availability_zone {
            req = req.placement(Placement::builder().availability_zone(zone).build());
        }
        if let (Some(root), Some(device)) = (&s.root_volume, l.root_device) {
            req = req.block_device_mappings(root_mapping(root, device));
        }
        if let Some(bytes) = l.user_data {
            req = req.user_data(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
        let out = req
            .customize()
            .config_override(self.paced(Paced::Run))
            .send()
            .await
            .map_err(|e| from_sdk("RunInstances", &self.target, e))?;
        out.instances()
            .first()
            .cloned()
            .ok_or_else(|| Error::permanent("RunInstances answered without an instance"))
    }

    /// DescribeInstances by ids and filters, following every `NextToken`.
    pub(crate) async fn describe(&self, ids: &[&str], filters: &[Filter]) -> Result<Vec<Instance>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .sdk
                .describe_instances()
                .set_instance_ids(
                    (!ids.is_empty()).then(|| ids.iter().map(|s| (*s).to_owned()).collect()),
                )
                .set_filters((!filters.is_empty()).then(|| filters.to_vec()))
                // EC2's largest page, so that a listing of a fleet takes few calls (it
                // refuses MaxResults together with instance ids).
                .set_max_results(ids.is_empty().then_some(1000))
                .set_next_token(token.take())
                .send()
                .await
                .map_err(|e| from_sdk("DescribeInstances", &self.target, e))?;
            for r in page.reservations() {
                out.extend(r.instances().iter().cloned());
            }
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_owned()),
                _ => return Ok(out),
            }
        }
    }

    /// TerminateInstances for one instance.
    pub(crate) async fn terminate(&self, id: &str) -> Result<()> {
        self.sdk
            .terminate_instances()
            .instance_ids(id)
            .customize()
            .config_override(self.paced(Paced::Terminate))
            .send()
            .await
            .map_err(|e| from_sdk("TerminateInstances", &self.target, e))?;
        Ok(())
    }

    /// TerminateInstances for several instances in one call.
    pub(crate) async fn terminate_all(&self, ids: &[&str]) -> Result<()> {
        self.sdk
            .terminate_instances()
            .set_instance_ids(Some(ids.iter().map(|s| (*s).to_owned()).collect()))
            .customize()
            .config_override(self.paced(Paced::Terminate))
            .send()
            .await
            .map_err(|e| from_sdk("TerminateInstances", &self.target, e))?;
        Ok(())
    }

    /// StartInstances for one instance.
    pub(crate) async fn start(&self, id: &str) -> Result<()> {
        self.sdk
            .start_instances()
            .instance_ids(id)
            .customize()
            .config_override(self.paced(Paced::Start))
            .send()
            .await
            .map_err(|e| from_sdk("StartInstances", &self.target, e))?;
        Ok(())
    }

    /// StopInstances for one instance.
    pub(crate) async fn stop(&self, id: &str) -> Result<()> {
        self.sdk
            .stop_instances()
            .instance_ids(id)
            .customize()
            .config_override(self.paced(Paced::Stop))
            .send()
            .await
            .map_err(|e| from_sdk("StopInstances", &self.target, e))?;
        Ok(())
    }

    /// RebootInstances for one instance.
    pub(crate) async fn reboot(&self, id: &str) -> Result<()> {
        self.sdk
            .reboot_instances()
            .instance_ids(id)
            .customize()
            .config_override(self.paced(Paced::Reboot))
            .send()
            .await
            .map_err(|e| from_sdk("RebootInstances", &self.target, e))?;
        Ok(())
    }

    /// The console output, decoded; `None` when EC2 has none yet.
    pub(crate) async fn console_output(&self, id: &str) -> Result<Option<String>> {
        let out = self
            .sdk
            .get_console_output()
            .instance_id(id)
            .send()
            .await
            .map_err(|e| from_sdk("GetConsoleOutput", &self.target, e))?;
        let Some(b64) = out.output().filter(|o| !o.is_empty()) else {
            return Ok(None);
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| {
                Error::permanent("GetConsoleOutput answered with invalid base64").with_source(e)
            })?;
        Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// The instance's user data bytes as EC2 keeps them; `None` when it has none.
    ///
    /// At TRACE the SDK logs every deserialized answer with its Debug, and this one is
    /// the user data (password hashes, private keys): the call runs with no tracing
    /// subscriber, so the SDK's own lines for it are dropped at every level (see
    /// src/redact.rs); its outcome is still logged by the caller.
    pub(crate) async fn user_data(&self, id: &str) -> Result<Option<Vec<u8>>> {
        use tracing::instrument::WithSubscriber;
        let out = self
            .sdk
            .describe_instance_attribute()
            .instance_id(id)
            .attribute(InstanceAttributeName::UserData)
            .send()
            .with_subscriber(tracing::subscriber::NoSubscriber::default())
            .await
            .map_err(|e| from_sdk("DescribeInstanceAttribute", &self.target, e))?;
        let Some(b64) = out
            .user_data()
            .and_then(|v| v.value())
            .filter(|v| !v.is_empty())
        else {
            return Ok(None);
        };
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map(Some)
            .map_err(|e| {
                Error::permanent("DescribeInstanceAttribute answered with invalid base64")
                    .with_source(e)
            })
    }

    /// The root device name of `image` (`/dev/xvda`), for a root volume mapping.
    pub(crate) async fn root_device_name(&self, image: &str) -> Result<String> {
        let out = self
            .sdk
            .describe_images()
            .image_ids(image)
            .send()
            .await
            .map_err(|e| from_sdk("DescribeImages", &self.target, e))?;
        out.images()
            .first()
            .and_then(|i| i.root_device_name())
            .map(str::to_owned)
            .ok_or_else(|| {
                Error::invalid_spec(
                    "image",
                    format!("image {image} was not found, or has no root device name"),
                )
            })
    }
}

/// Refuses an answer whose XML document is cut short, as unreadable.
///
/// The SDK's XML reader takes a document that ends early for one that ends there: a
/// DescribeInstances answer cut inside its reservation set reads as fewer instances (a
/// machine not found, and a create that launches a second), one cut inside an instance
/// as an instance without its tags, a user-data answer cut short as none. An answer
/// whose document does not close the element it opened is refused here, after the SDK
/// read it and before anyone uses it, as a response error that `errors` calls
/// transient: the request may have taken effect, so the caller asks again (a create
/// looks the name up before it launches again). Bodies that are not XML (empty, or a
/// gateway's text) are left to the status rules.
#[derive(Debug, Clone, Copy, Default)]
struct WholeAnswers;

impl aws_sdk_ec2::config::Intercept for WholeAnswers {
    fn name(&self) -> &'static str {
        "WholeAnswers"
    }

    fn read_after_deserialization(
        &self,
        context: &aws_sdk_ec2::config::interceptors::AfterDeserializationInterceptorContextRef<'_>,
        _runtime_components: &aws_sdk_ec2::config::RuntimeComponents,
        _cfg: &mut aws_sdk_ec2::config::ConfigBag,
    ) -> std::result::Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        match context.response().body().bytes() {
            Some(body) if !xml_is_whole(body) => Err(format!(
                "the answer's XML document is cut short ({} bytes, HTTP {})",
                body.len(),
                context.response().status().as_u16()
            )
            .into()),
            _ => Ok(()),
        }
    }
}

/// Whether `body`, if it is an XML document, ends by closing its root element. A body
/// that does not start with markup is not judged (`true`).
fn xml_is_whole(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body);
    let mut rest = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    if !rest.starts_with('<') {
        return true;
    }
    // Past the declaration, comments and a doctype to the root's start tag.
    while rest.starts_with("<?") || rest.starts_with("<!") {
        let end = if rest.starts_with("<!--") { "-->" } else { ">" };
        match rest.find(end) {
            Some(i) => rest = rest[i + end.len()..].trim_start(),
            None => return false,
        }
    }
    let Some(tag) = rest.strip_prefix('<') else {
        return false;
    };
    let name_len = tag
        .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
        .unwrap_or(tag.len());
    let name = &tag[..name_len];
    if name.is_empty() {
        return false;
    }
    let end = text.trim_end();
    // `<Root/>` closes itself; otherwise the document ends with `</Root>`.
    let self_closed = tag[name_len..]
        .split_once('>')
        .is_some_and(|(attrs, after)| attrs.ends_with('/') && after.trim().is_empty());
    self_closed
        || end
            .strip_suffix('>')
            .and_then(|e| e.strip_suffix(name))
            .is_some_and(|e| e.trim_end().ends_with("</"))
}

/// A retry partition with a rate limiter of this client's own. The SDK's default
/// partition is one per service and region for the whole process, so two providers of
/// different accounts in one region would slow each other down, while EC2 throttles
/// each account separately.
fn own_rate_limiter(region: &str, api: &str) -> RetryPartition {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    RetryPartition::custom(format!("provider-aws-{region}-{api}"))
        .client_rate_limiter(ClientRateLimiter::new(now))
        .build()
}

fn root_mapping(root: &RootVolume, device: &str) -> BlockDeviceMapping {
    let volume_type = VolumeType::from(root.volume_type.as_deref().unwrap_or("gp3"));
    BlockDeviceMapping::builder()
        .device_name(device)
        .ebs(
            EbsBlockDevice::builder()
                .volume_size(root.size_gib)
                .volume_type(volume_type)
                .delete_on_termination(true)
                .set_encrypted(root.encrypted)
                .build(),
        )
        .build()
}

/// A DescribeInstances filter.
pub(crate) fn filter(name: &str, values: &[&str]) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.iter().map(|v| (*v).to_owned()).collect()))
        .build()
}

#[cfg(test)]
mod tests {
    use super::xml_is_whole;

    #[test]
    fn only_documents_that_close_their_root_are_whole() {
        let answer = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>1</requestId><reservationSet><item><instanceId>i-1</instanceId></item></reservationSet></DescribeInstancesResponse>\n";
        assert!(xml_is_whole(answer.as_bytes()));
        for cut in [answer.len() / 2, answer.len() - 5, 60, 10] {
            assert!(!xml_is_whole(&answer.as_bytes()[..cut]), "cut at {cut}");
        }
        let error = "<?xml version=\"1.0\"?><Response><Errors><Error><Code>X</Code></Error></Errors><RequestID>r</RequestID></Response>";
        assert!(xml_is_whole(error.as_bytes()));
        assert!(!xml_is_whole(&error.as_bytes()[..error.len() - 1]));
        assert!(xml_is_whole(b"<!-- c --><Empty/>"));
        assert!(xml_is_whole(b"<Empty a=\"1\" />\n"));
        // Not XML: left to the status.
        assert!(xml_is_whole(b""));
        assert!(xml_is_whole(b"Service Unavailable"));
        // Markup that never reaches its root.
        assert!(!xml_is_whole(b"<?xml version=\"1.0\""));
        assert!(!xml_is_whole(b"<"));
    }
}
