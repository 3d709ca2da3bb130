//! Redfish's errors in machine-core's terms: an HTTP status and a Redfish error body
//! (`{"error": {"code", "message", "@Message.ExtendedInfo": [...]}}`) become a
//! [`machine_core::Error`] whose [`ErrorKind`] decides whether it is retried.
//!
//! The kinds are [`provider_http::status_error`]'s, shared with the other HTTP providers;
//! this module adds what the BMC's body says to the message.
//!
//! | the BMC says | kind |
//! |---|---|
//! | 401, 403 | unauthorized |
//! | 404, 410 | not found |
//! | 409, 412 | conflict (another client changed the resource, or an ETag is stale) |
//! | 429, 503 with `Retry-After` | throttled |
//! | 501 | permanent (the BMC does not implement it) |
//! | 503, 502, 504, other 5xx; resets and timeouts ([`provider_http::HttpClient::send`]) | transient |
//! | 400, 422 | invalid spec |
//! | other 4xx | permanent |
//! | a success whose body is not the JSON expected (HTML, truncated) | transient |

use std::time::Duration;

use machine_core::Error;
use serde::Deserialize;

/// The longest excerpt of a body that is not a Redfish error kept in a message.
const EXCERPT: usize = 200;

/// The Redfish error body, reduced to what a message needs.
#[derive(Debug, Default, Deserialize)]
struct Body {
    #[serde(default)]
    error: ErrorObject,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorObject {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default, rename = "@Message.ExtendedInfo")]
    extended: Vec<ExtendedInfo>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ExtendedInfo {
    #[serde(default)]
    message_id: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    resolution: String,
}

/// What the BMC's error body says, in one line: the ExtendedInfo messages (or their ids)
/// where there are any, else the error's message and code, else an excerpt of the body.
pub(crate) fn describe_body(body: &[u8]) -> String {
    match serde_json::from_slice::<Body>(body) {
        Ok(b) if !b.error.code.is_empty() || !b.error.message.is_empty() => {
            let mut parts = Vec::new();
            if !b.error.message.is_empty() {
                parts.push(b.error.message.clone());
            }
            for info in &b.error.extended {
                let text = match (info.message.is_empty(), info.message_id.is_empty()) {
                    (false, _) => info.message.clone(),
                    (true, false) if info.message_id != b.error.code => info.message_id.clone(),
                    _ => continue,
                };
                if !parts.contains(&text) {
                    parts.push(text);
                }
                if !info.resolution.is_empty() {
                    parts.push(format!("resolution: {}", info.resolution));
                }
            }
            if !b.error.code.is_empty() {
                parts.push(format!("({})", b.error.code));
            }
            parts.join("; ")
        }
        _ => excerpt(body),
    }
}

/// The start of a body that is not a Redfish error, on one line.
pub(crate) fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.is_empty() {
        return "an empty body".to_owned();
    }
    match one_line.char_indices().nth(EXCERPT) {
        Some((cut, _)) => format!("{:?}...", &one_line[..cut]),
        None => format!("{one_line:?}"),
    }
}

/// The error for an answer with error `status` to `what` (`GET /redfish/v1/Systems/1`).
pub(crate) fn from_status(
    what: &str,
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
) -> Error {
    let status = reqwest::StatusCode::from_u16(status).unwrap_or(reqwest::StatusCode::BAD_GATEWAY);
    provider_http::status_error(
        status,
        retry_after,
        format!("{what}: {}", describe_body(body)),
    )
}

/// The error for a success whose body is not what `what` expects: a proxy's HTML page
/// or a truncated answer, which a later try may not repeat.
pub(crate) fn unreadable(what: &str, err: &serde_json::Error, body: &[u8]) -> Error {
    Error::transient(format!(
        "{what}: the BMC's answer is not the Redfish JSON expected ({err}): {}",
        excerpt(body)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use machine_core::ErrorKind;

    const SUSHY_501: &str = r#"{"error": {"code": "Base.1.0.GeneralError",
        "message": "Power state Bogus is not supported",
        "@Message.ExtendedInfo": [{"@odata.type": "/redfish/v1/$metadata#Message.1.0.0.Message",
        "MessageId": "Base.1.0.GeneralError"}]}}"#;

    const DMTF_409: &str = r#"{"error": {"code": "Base.1.8.GeneralError",
        "message": "A general error has occurred. See ExtendedInfo for more information.",
        "@Message.ExtendedInfo": [{"MessageId": "Base.1.8.ResourceInUse",
        "Message": "The change to the requested resource failed because the resource is in use or in transition.",
        "Resolution": "Remove the condition and resubmit the request if the operation failed."}]}}"#;

    #[test]
    fn statuses_map_to_the_kinds_the_issue_names() {
        let table: &[(u16, ErrorKind)] = &[
            (401, ErrorKind::Unauthorized),
            (403, ErrorKind::Unauthorized),
            (404, ErrorKind::NotFound),
            (409, ErrorKind::Conflict),
            (412, ErrorKind::Conflict),
            (429, ErrorKind::Throttled),
            (501, ErrorKind::Permanent),
            (500, ErrorKind::Transient),
            (502, ErrorKind::Transient),
            (503, ErrorKind::Transient),
            (504, ErrorKind::Transient),
            (400, ErrorKind::InvalidSpec),
            (405, ErrorKind::Permanent),
        ];
        for &(status, kind) in table {
            let e = from_status("GET /x", status, None, DMTF_409.as_bytes());
            assert_eq!(e.kind(), kind, "HTTP {status}");
            assert_eq!(e.is_retryable(), kind.is_retryable(), "HTTP {status}");
        }
    }

    #[test]
    fn throttled_keeps_retry_after() {
        let e = from_status("GET /x", 429, Some(Duration::from_secs(7)), b"");
        assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn messages_come_from_extended_info() {
        let e = from_status("PATCH /s/1", 409, None, DMTF_409.as_bytes());
        let m = e.to_string();
        assert!(m.contains("resource is in use or in transition"), "{m}");
        assert!(m.contains("resolution: Remove the condition"), "{m}");
        assert!(m.contains("PATCH /s/1"), "{m}");
        let m = from_status("POST /reset", 501, None, SUSHY_501.as_bytes()).to_string();
        assert!(m.contains("Power state Bogus is not supported"), "{m}");
        assert!(m.contains("(Base.1.0.GeneralError)"), "{m}");
    }

    #[test]
    fn bodies_that_are_not_redfish_errors_are_quoted_briefly() {
        let html = format!("<html><body>{}</body></html>", "x".repeat(1000));
        let m = from_status("GET /x", 502, None, html.as_bytes()).to_string();
        assert!(m.contains("<html>"), "{m}");
        assert!(m.len() < 400, "{m}");
        assert!(
            from_status("GET /x", 503, None, b"")
                .to_string()
                .contains("an empty body")
        );
        // PATCH refusals from sushy-tools are plain text.
        let m = from_status("PATCH /s", 400, None, b"PATCH only works for Boot").to_string();
        assert!(m.contains("PATCH only works for Boot"), "{m}");
    }

    #[test]
    fn truncated_json_is_transient_and_quoted() {
        let body = br#"{"PowerState": "O"#;
        let err = serde_json::from_slice::<serde_json::Value>(body).unwrap_err();
        let e = unreadable("GET /s/1", &err, body);
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert!(e.to_string().contains("PowerState"), "{e}");
    }
}
