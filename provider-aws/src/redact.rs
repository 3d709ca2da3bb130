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
//!   rebuilds it from the same bytes, which are shared, not copied. aws-smithy-runtime
//!   1.16 already hands the transmit step such a body (the canary test passes without
//!   this step); this keeps it so if a later SDK logs an in-memory body again.
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
        if let Some(opaque) = opaque(body) {
            *body = opaque;
        }
        Ok(())
    }
}

/// A retryable streaming body over an in-memory body's bytes; `None` for a body that
/// is not in memory (already opaque).
fn opaque(body: &SdkBody) -> Option<SdkBody> {
    let bytes = bytes::Bytes::copy_from_slice(body.bytes()?);
    Some(SdkBody::retryable(move || {
        SdkBody::from_body_1_x(http_body_util::Full::new(bytes.clone()))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn opaque_bodies_hide_their_bytes_and_stay_retryable() {
        use http_body_util::BodyExt;
        let body = SdkBody::from("Action=RunInstances&UserData=c2VjcmV0");
        assert!(format!("{body:?}").contains("UserData"));
        let hidden = opaque(&body).unwrap();
        assert!(!format!("{hidden:?}").contains("UserData"), "{hidden:?}");
        let retry = hidden.try_clone().expect("retryable");
        for b in [hidden, retry] {
            let bytes = b.collect().await.unwrap().to_bytes();
            assert_eq!(&bytes[..], b"Action=RunInstances&UserData=c2VjcmV0");
        }
        assert!(
            opaque(&SdkBody::from_body_1_x(
                http_body_util::Empty::<bytes::Bytes>::new()
            ))
            .is_none()
        );
    }
}
