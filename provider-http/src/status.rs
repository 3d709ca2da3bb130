//! HTTP statuses as the core's error kinds.

use std::time::{Duration, SystemTime};

use machine_core::{Error, ErrorKind};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The error for a response whose status is not a success, with `message` (say what was
/// asked and what the server said; never put credentials in it).
///
/// | status | kind |
/// |---|---|
/// | 400, 422 | [`ErrorKind::InvalidSpec`] |
/// | 401, 403 | [`ErrorKind::Unauthorized`] |
/// | 404, 410 | [`ErrorKind::NotFound`] |
/// | 409, 412 | [`ErrorKind::Conflict`] |
/// | 429, and 503 with `Retry-After` | [`ErrorKind::Throttled`], with `retry_after` |
/// | 501, 505 | [`ErrorKind::Permanent`] (the server will never do it) |
/// | other 5xx | [`ErrorKind::Transient`] |
/// | other 4xx | [`ErrorKind::Permanent`] |
pub fn status_error(
    status: StatusCode,
    retry_after: Option<Duration>,
    message: impl Into<String>,
) -> Error {
    let message = format!("HTTP {status}: {}", message.into());
    let kind = match status.as_u16() {
        400 | 422 => ErrorKind::InvalidSpec,
        401 | 403 => ErrorKind::Unauthorized,
        404 | 410 => ErrorKind::NotFound,
        409 | 412 => ErrorKind::Conflict,
        429 => return Error::throttled(message, retry_after),
        503 if retry_after.is_some() => return Error::throttled(message, retry_after),
        501 | 505 => ErrorKind::Permanent,
        500..=599 => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    };
    Error::new(kind, message)
}

/// The wait a `Retry-After` header asks for, in seconds or as an HTTP date (a date in the
/// past is no wait). `None` when the header is absent or unreadable.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn every_status_row_maps_to_its_kind() {
        let rows = [
            (400, ErrorKind::InvalidSpec),
            (422, ErrorKind::InvalidSpec),
            (401, ErrorKind::Unauthorized),
            (403, ErrorKind::Unauthorized),
            (404, ErrorKind::NotFound),
            (410, ErrorKind::NotFound),
            (409, ErrorKind::Conflict),
            (412, ErrorKind::Conflict),
            (429, ErrorKind::Throttled),
            (501, ErrorKind::Permanent),
            (505, ErrorKind::Permanent),
            (500, ErrorKind::Transient),
            (502, ErrorKind::Transient),
            (503, ErrorKind::Transient),
            (504, ErrorKind::Transient),
            (418, ErrorKind::Permanent),
        ];
        for (code, kind) in rows {
            let err = status_error(StatusCode::from_u16(code).unwrap(), None, "asked");
            assert_eq!(err.kind(), kind, "HTTP {code}");
            assert!(err.message().contains(&code.to_string()), "{err}");
        }
    }

    #[test]
    fn a_503_with_retry_after_is_throttled_for_that_long() {
        let err = status_error(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(Duration::from_secs(7)),
            "busy",
        );
        assert_eq!(err.kind(), ErrorKind::Throttled);
        assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("12"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(12)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), Some(Duration::ZERO));
        let soon = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        headers.insert(RETRY_AFTER, HeaderValue::from_str(&soon).unwrap());
        let wait = retry_after(&headers).unwrap();
        assert!(
            wait > Duration::from_secs(100) && wait <= Duration::from_secs(120),
            "{wait:?}"
        );
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers), None);
    }
}
