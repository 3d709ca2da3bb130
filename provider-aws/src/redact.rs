//! Keeping request and response bodies out of the AWS SDK's TRACE log.
//!
//! At TRACE, aws-smithy-runtime logs every request it sends (`transmitting request`)
//! with its body's Debug, which for an in-memory body is the bytes themselves: the
//! RunInstances form with the user data, which holds password hashes, host private keys
//! and secret files. It logs response bodies too (`read HTTP response body`) unless the
//! operation marks its output sensitive: DescribeInstanceAttribute answers with the
//! user data. [`RedactBodies`], on every EC2 call of this crate:
//! - marks the output sensitive, so the SDK logs `** REDACTED **` for response bodies
//!   (unless the process sets `LOG_SENSITIVE_BODIES=true`, the SDK's own deliberate
//!   opt-in);
//! - moves the request body into a streaming body over the same bytes just before it is
//!   sent (after signing), whose Debug is `BoxBody`. It stays retryable: each retry
//!   rebuilds it from the same bytes, which are shared, not copied.
//!
//! The SDK also logs each deserialized answer's Debug at TRACE (`output_or_error`), which
//! no interceptor can reach before it is logged; the one answer holding user data
//! (DescribeInstanceAttribute `userData`) is therefore awaited with no tracing
//! subscriber (`Ec2::user_data` in client.rs). `crate::redact` is private: it is the
//! provider's own client that applies it to every call.

use aws_sdk_ec2::config::interceptors::{
    BeforeSerializationInterceptorContextRef, BeforeTransmitInterceptorContextMut,
};
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::orchestrator::SensitiveOutput;
use aws_smithy_types::body::SdkBody;

/// The SDK interceptor described in the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RedactBodies;

impl Intercept for RedactBodies {
    fn name(&self) -> &'static str {
        "RedactBodies"
    }

    fn read_before_execution(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state().store_put(SensitiveOutput);
        Ok(())
    }

    fn modify_before_transmit(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let body = context.request_mut().body_mut();
        if let Some(bytes) = body.bytes().map(bytes::Bytes::copy_from_slice) {
            *body = SdkBody::retryable(move || {
                SdkBody::from_body_1_x(http_body_util::Full::new(bytes.clone()))
            });
        }
        Ok(())
    }
}
