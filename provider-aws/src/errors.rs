//! EC2's errors in machine-core's terms: every SDK error becomes a
//! [`machine_core::Error`] whose [`ErrorKind`] decides whether it is retried.
//!
//! | EC2 says | kind |
//! |---|---|
//! | `RequestLimitExceeded`, `Throttling`, `ThrottlingException`, `RequestThrottled`, `SlowDown` | throttled |
//! | `InternalError`, `ServiceUnavailable`, `Unavailable`, any 5xx, timeouts, resets and other connection failures, unreadable answers (a body cut short, or a success status the SDK could not read) | transient |
//! | `InsufficientInstanceCapacity`, `InsufficientHostCapacity`, `InsufficientReservedInstanceCapacity`, `InsufficientAddressCapacity`, `InsufficientCapacity` (any `Insufficient*Capacity*`), `InsufficientFreeAddressesInSubnet`, `UnfulfillableCapacity` | insufficient capacity: the zone, type or subnet has no room now; not retried unchanged, so a caller can choose another type or zone |
//! | `InvalidAMIID.*` | invalid spec on `image` |
//! | `InvalidInstanceType*`, `Unsupported` about an instance type | invalid spec on `size` |
//! | `InvalidSubnetID.*`, `InvalidGroup*` / `InvalidSecurityGroupID.*`, `InvalidKeyPair.*`, `InvalidParameterValue` about the instance profile, `InvalidBlockDeviceMapping`, `InvalidUserData.*` | invalid spec on the matching `provider.*` field or `userData` |
//! | other `InvalidParameter*`, `MissingParameter`, `InvalidRequest` | invalid spec on the field the message names, else `provider` |
//! | credentials not found or refused by their provider (before any request) | unauthorized |
//! | `AuthFailure`, `UnauthorizedOperation`, `InvalidClientTokenId`, `SignatureDoesNotMatch`, `OptInRequired`, `Blocked`, expired tokens, HTTP 401/403 | unauthorized |
//! | `InstanceLimitExceeded`, `VcpuLimitExceeded`, `MaxSpotInstanceCountExceeded`, `VolumeLimitExceeded`, `*LimitExceeded` | quota exceeded |
//! | `InvalidInstanceID.NotFound` / `.Malformed` | not found (transient right after create: see [`crate::AwsConfig`]'s consistency window) |
//! | `IdempotentParameterMismatch`, `IncorrectInstanceState`, `IncorrectState` | conflict |
//! | anything else | permanent |

use std::time::Duration;

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use machine_core::{Error, ErrorKind};

/// What the SDK reported, reduced to what classification needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Reported {
    /// The EC2 error code (`InvalidAMIID.NotFound`), when the service answered with one.
    pub code: Option<String>,
    /// The service's message.
    pub message: Option<String>,
    /// The HTTP status, when there was an answer.
    pub status: Option<u16>,
    /// A `Retry-After` header, in seconds.
    pub retry_after: Option<Duration>,
    /// No usable answer: a connection failure, a timeout, an unreadable body.
    pub no_answer: Option<String>,
}

/// Converts an SDK error from operation `op` (`RunInstances`) into a library error,
/// keeping the SDK error as the source. `target` (the region and endpoint) is named in
/// errors that got no answer, so that a name that does not resolve says which.
pub(crate) fn from_sdk<E>(op: &str, target: &str, err: SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    if let Some(e) = credentials_failure(op, &err) {
        return e.with_source(err);
    }
    let mut reported = report(&err);
    if let Some(why) = &mut reported.no_answer {
        let dns = why.contains("dns error") || why.contains("failed to lookup address");
        *why = if dns {
            format!("{why} (the endpoint's host name does not resolve: {target})")
        } else {
            format!("{why} ({target})")
        };
    }
    classify(op, &reported).with_source(err)
}

/// Credentials that cannot be found or loaded fail before the request is sent, inside
/// the SDK's dispatch: without this they would look like a connection failure and be
/// retried until a deadline. Only a credential provider that timed out is transient.
fn credentials_failure(op: &str, err: &(dyn std::error::Error + 'static)) -> Option<Error> {
    let mut next = err.source();
    while let Some(e) = next {
        if let Some(c) = e.downcast_ref::<CredentialsError>() {
            if matches!(c, CredentialsError::ProviderTimedOut(_)) {
                return None;
            }
            return Some(Error::new(
                ErrorKind::Unauthorized,
                format!("{op}: no usable AWS credentials: {}", source_chain(c)),
            ));
        }
        // The SDK's error when no credential provider is configured at all; its type
        // is private, its message is not.
        if e.to_string().contains("there was no identity resolver") {
            return Some(Error::new(
                ErrorKind::Unauthorized,
                format!("{op}: no AWS credentials configured: {}", source_chain(e)),
            ));
        }
        next = e.source();
    }
    None
}

fn report<E>(err: &SdkError<E, HttpResponse>) -> Reported
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let raw = err.raw_response();
    let status = raw.map(|r| r.status().as_u16());
    let retry_after = raw
        .and_then(|r| r.headers().get("retry-after"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let no_answer = match err {
        SdkError::TimeoutError(_) => Some("the request timed out".to_owned()),
        SdkError::DispatchFailure(d) => Some(match d.as_connector_error() {
            Some(c) if c.is_timeout() => "the connection timed out".to_owned(),
            Some(c) if c.is_io() => {
                format!("the connection failed: {}", source_chain(c))
            }
            Some(c) => format!("the request could not be sent: {}", source_chain(c)),
            None => "the request could not be sent".to_owned(),
        }),
        SdkError::ResponseError(_) => Some(format!(
            "the answer could not be read: {}",
            std::error::Error::source(err).map_or_else(String::new, source_chain)
        )),
        _ => None,
    };
    Reported {
        code: err.code().map(str::to_owned),
        message: err.message().map(str::to_owned),
        status,
        retry_after,
        no_answer,
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// Decides the kind (and, for invalid specs, the field) of an EC2 error.
pub(crate) fn classify(op: &str, r: &Reported) -> Error {
    let code = r.code.as_deref().unwrap_or("");
    let message = r.message.as_deref().unwrap_or("");
    let text = match (&r.code, &r.message, &r.no_answer) {
        (_, _, Some(why)) => format!("{op}: {why}"),
        (Some(c), Some(m), _) => format!("{op}: {c}: {m}"),
        (Some(c), None, _) => format!("{op}: {c}"),
        (None, _, _) => format!(
            "{op}: HTTP {} without an EC2 error code",
            r.status.map_or_else(|| "?".to_owned(), |s| s.to_string())
        ),
    };
    if r.no_answer.is_some() {
        return Error::transient(text);
    }
    let invalid = |field: &str| Error::invalid_spec(field, text.clone());
    match code {
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "RequestThrottled"
        | "RequestThrottledException"
        | "SlowDown"
        | "TooManyRequestsException" => Error::throttled(text, r.retry_after),
        // EC2's capacity codes (its error code list): the place has no room for what
        // was asked, which the same request will meet again for minutes.
        c if c.starts_with("Insufficient") && c.contains("Capacity") => {
            Error::insufficient_capacity(text)
        }
        "InsufficientFreeAddressesInSubnet" | "UnfulfillableCapacity" => {
            Error::insufficient_capacity(text)
        }
        "InternalError"
        | "InternalFailure"
        | "ServiceUnavailable"
        | "Unavailable"
        | "RequestTimeout"
        | "RequestTimeoutException" => Error::transient(text),
        c if c.starts_with("InvalidAMIID.") => invalid("image"),
        c if c.starts_with("InvalidInstanceType") => invalid("size"),
        c if c.starts_with("InvalidSubnetID.") || c == "InvalidSubnet" => {
            invalid("provider.subnetId")
        }
        c if c.starts_with("InvalidGroup") || c.starts_with("InvalidSecurityGroupID.") => {
            invalid("provider.securityGroupIds")
        }
        c if c.starts_with("InvalidKeyPair.") => invalid("provider.keyName"),
        c if c.starts_with("InvalidUserData.") => invalid("userData"),
        "InvalidBlockDeviceMapping" => invalid("provider.rootVolume"),
        "InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed" | "InvalidInstanceID" => {
            Error::not_found(text)
        }
        // EC2 refuses a request signed more than 5 minutes from its own time; the
        // message says nothing of clocks, the error does.
        "RequestExpired" | "RequestTimeTooSkewed" | "InvalidSignatureException"
            if code != "InvalidSignatureException" || message.contains("expired") =>
        {
            Error::new(
                ErrorKind::Unauthorized,
                format!(
                    "{text}; the request's signing time is too far from EC2's: check this machine's clock (EC2 allows 5 minutes; timedatectl or chronyc tracking)"
                ),
            )
        }
        "SignatureDoesNotMatch" => Error::new(
            ErrorKind::Unauthorized,
            format!(
                "{text}; the secret access key does not match the key id, or this machine's clock is far off"
            ),
        ),
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidSignatureException"
        | "InvalidClientTokenId"
        | "OptInRequired"
        | "Blocked"
        | "ExpiredToken"
        | "AccessDenied"
        | "AccessDeniedException"
        | "MissingAuthenticationToken"
        | "PendingVerification" => Error::new(ErrorKind::Unauthorized, text),
        "IdempotentParameterMismatch" | "IncorrectInstanceState" | "IncorrectState" => {
            Error::new(ErrorKind::Conflict, text)
        }
        c if c.ends_with("LimitExceeded") || c == "MaxSpotInstanceCountExceeded" => {
            Error::new(ErrorKind::QuotaExceeded, text)
        }
        c if c.starts_with("InvalidParameter")
            || c == "MissingParameter"
            || c == "InvalidRequest"
            || c == "Unsupported" =>
        {
            invalid(field_named_in(message))
        }
        _ => match r.status {
            Some(s) if s >= 500 => Error::transient(text),
            // A success (or a redirect) the SDK reported as an error: it could not read
            // the answer (a body cut short, an XML document it could not parse). The
            // request may have taken effect; what it said is unknown: ask again.
            Some(s) if s < 400 && code.is_empty() => Error::transient(format!(
                "{op}: the answer (HTTP {s}) could not be read: {}",
                r.message.as_deref().unwrap_or("no EC2 error code in it")
            )),
            Some(401 | 403) => Error::new(ErrorKind::Unauthorized, text),
            Some(429) => Error::throttled(text, r.retry_after),
            _ => Error::permanent(text),
        },
    }
}

/// The spec field an `InvalidParameter*` message is about, guessed from the parameter
/// names EC2 puts in its messages; `provider` when none is recognised.
fn field_named_in(message: &str) -> &'static str {
    let m = message.to_ascii_lowercase();
    const FIELDS: [(&str, &str); 10] = [
        ("iaminstanceprofile", "provider.instanceProfile"),
        ("instance profile", "provider.instanceProfile"),
        ("instancetype", "size"),
        ("instance type", "size"),
        ("imageid", "image"),
        ("subnet", "provider.subnetId"),
        ("security group", "provider.securityGroupIds"),
        ("keyname", "provider.keyName"),
        ("blockdevice", "provider.rootVolume"),
        ("userdata", "userData"),
    ];
    FIELDS
        .iter()
        .find(|(needle, _)| m.contains(needle))
        .map_or("provider", |(_, field)| field)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: &str, status: u16) -> Reported {
        Reported {
            code: Some(code.to_owned()),
            message: Some(format!("{code} happened")),
            status: Some(status),
            ..Reported::default()
        }
    }

    #[test]
    fn codes_map_to_the_kinds_the_issue_lists() {
        let cases: [(&str, u16, ErrorKind); 24] = [
            ("RequestLimitExceeded", 503, ErrorKind::Throttled),
            ("Throttling", 400, ErrorKind::Throttled),
            (
                "InsufficientInstanceCapacity",
                500,
                ErrorKind::InsufficientCapacity,
            ),
            (
                "InsufficientHostCapacity",
                400,
                ErrorKind::InsufficientCapacity,
            ),
            (
                "InsufficientReservedInstanceCapacity",
                500,
                ErrorKind::InsufficientCapacity,
            ),
            (
                "InsufficientAddressCapacity",
                500,
                ErrorKind::InsufficientCapacity,
            ),
            ("InsufficientCapacity", 500, ErrorKind::InsufficientCapacity),
            (
                "InsufficientFreeAddressesInSubnet",
                400,
                ErrorKind::InsufficientCapacity,
            ),
            (
                "UnfulfillableCapacity",
                500,
                ErrorKind::InsufficientCapacity,
            ),
            ("InternalError", 500, ErrorKind::Transient),
            ("SomethingNew", 502, ErrorKind::Transient),
            ("InvalidAMIID.NotFound", 400, ErrorKind::InvalidSpec),
            ("InvalidAMIID.Malformed", 400, ErrorKind::InvalidSpec),
            ("InvalidParameterValue", 400, ErrorKind::InvalidSpec),
            ("InvalidInstanceType", 400, ErrorKind::InvalidSpec),
            ("AuthFailure", 401, ErrorKind::Unauthorized),
            ("UnauthorizedOperation", 403, ErrorKind::Unauthorized),
            ("InstanceLimitExceeded", 400, ErrorKind::QuotaExceeded),
            ("VcpuLimitExceeded", 400, ErrorKind::QuotaExceeded),
            (
                "MaxSpotInstanceCountExceeded",
                400,
                ErrorKind::QuotaExceeded,
            ),
            ("InvalidInstanceID.NotFound", 400, ErrorKind::NotFound),
            ("IdempotentParameterMismatch", 400, ErrorKind::Conflict),
            ("IncorrectInstanceState", 400, ErrorKind::Conflict),
            ("DryRunOperation", 412, ErrorKind::Permanent),
        ];
        for (code, status, kind) in cases {
            let e = classify("RunInstances", &answer(code, status));
            assert_eq!(e.kind(), kind, "{code}: {e}");
            assert!(e.to_string().contains(code), "{e}");
        }
        // Capacity is not retried unchanged (one RunInstances, not one a second).
        let e = classify("RunInstances", &answer("InsufficientInstanceCapacity", 500));
        assert!(!e.is_retryable(), "{e}");
    }

    #[test]
    fn invalid_specs_name_the_field() {
        for (code, message, field) in [
            (
                "InvalidAMIID.NotFound",
                "The image id '[ami-1]' does not exist",
                "image",
            ),
            (
                "InvalidInstanceType",
                "The instance type 'x.y' does not exist",
                "size",
            ),
            ("InvalidSubnetID.NotFound", "no subnet", "provider.subnetId"),
            (
                "InvalidGroup.NotFound",
                "no group",
                "provider.securityGroupIds",
            ),
            ("InvalidKeyPair.NotFound", "no key", "provider.keyName"),
            ("InvalidUserData.Malformed", "bad", "userData"),
            (
                "InvalidParameterValue",
                "Value (x) for parameter iamInstanceProfile.name is invalid",
                "provider.instanceProfile",
            ),
            ("InvalidParameterCombination", "something odd", "provider"),
        ] {
            let r = Reported {
                code: Some(code.into()),
                message: Some(message.into()),
                status: Some(400),
                ..Reported::default()
            };
            let e = classify("RunInstances", &r);
            assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{code}");
            assert_eq!(e.field(), Some(field), "{code}: {e}");
        }
    }

    #[test]
    fn no_answer_is_transient_and_retry_after_is_kept() {
        let e = classify(
            "DescribeInstances",
            &Reported {
                no_answer: Some("the connection failed: reset".into()),
                ..Reported::default()
            },
        );
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert!(e.to_string().contains("reset"), "{e}");
        let e = classify(
            "RunInstances",
            &Reported {
                retry_after: Some(Duration::from_secs(3)),
                ..answer("RequestLimitExceeded", 503)
            },
        );
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        let e = classify(
            "RunInstances",
            &Reported {
                status: Some(500),
                ..Reported::default()
            },
        );
        assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    }

    #[test]
    fn an_answer_the_sdk_could_not_read_is_transient() {
        // A success whose XML the SDK could not parse comes back as an error without
        // a code: the request may have taken effect, the answer is unknown.
        let e = classify(
            "DescribeInstances",
            &Reported {
                status: Some(200),
                message: Some("failed to parse".into()),
                ..Reported::default()
            },
        );
        assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
        assert!(e.to_string().contains("could not be read"), "{e}");
        // An error status without a code is still judged by its status.
        for (status, kind) in [
            (400, ErrorKind::Permanent),
            (403, ErrorKind::Unauthorized),
            (429, ErrorKind::Throttled),
            (502, ErrorKind::Transient),
        ] {
            let e = classify(
                "RunInstances",
                &Reported {
                    status: Some(status),
                    ..Reported::default()
                },
            );
            assert_eq!(e.kind(), kind, "{status}: {e}");
        }
    }

    #[test]
    fn clock_skew_and_unresolvable_endpoints_say_what_to_look_at() {
        let skew = |code: &str, message: &str| {
            classify(
                "RunInstances",
                &Reported {
                    code: Some(code.into()),
                    message: Some(message.into()),
                    status: Some(400),
                    ..Reported::default()
                },
            )
        };
        for (code, message) in [
            ("RequestExpired", "Request has expired."),
            (
                "InvalidSignatureException",
                "Signature expired: 20261205T010203Z is now earlier than ...",
            ),
        ] {
            let e = skew(code, message);
            assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
            assert!(e.to_string().contains("check this machine's clock"), "{e}");
        }
        let e = skew(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match",
        );
        assert!(e.to_string().contains("secret access key"), "{e}");
        assert!(e.to_string().contains("clock"), "{e}");
    }
}
