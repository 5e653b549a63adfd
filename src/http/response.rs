//! The responses the HTTP bulkhead answers with when it refuses a request.

use crate::error::ServiceSaturated;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use std::sync::Arc;
use std::time::Duration;

/// Builds the response to a shed request.
/// Marks a response as a bulkhead's own refusal: an adaptive limit
/// further out takes it for no sign of the dependency's capacity.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shed;

/// Marks `response` as a bulkhead's own refusal (see [`Shed`]).
pub(crate) fn marked_shed(mut response: Response<Bytes>) -> Response<Bytes> {
    response.extensions_mut().insert(Shed);
    response
}

pub(crate) type ShedResponder = Arc<dyn Fn(&ServiceSaturated) -> Response<Bytes> + Send + Sync>;

/// `503 Service Unavailable` with `Retry-After` (whole seconds, at least
/// one) and the reason in plain text; `500` without `Retry-After` for the
/// one reason a retry cannot cure (see `ServiceSaturated::http_status`).
pub(crate) fn service_unavailable(
    shed: &ServiceSaturated,
    retry_after_secs: u64,
) -> Response<Bytes> {
    let status = shed.http_status();
    let mut response = text(status, shed.to_string());
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
    }
    response
}

/// [`service_unavailable`] with the shed's own retry hint.
pub(crate) fn refusal(shed: &ServiceSaturated) -> Response<Bytes> {
    marked_shed(service_unavailable(
        shed,
        retry_after_secs(shed.retry_after()),
    ))
}

/// A `Retry-After` value: the hint rounded up to whole seconds, and never 0,
/// which would invite an immediate retry into the same overload.
pub(crate) fn retry_after_secs(hint: Duration) -> u64 {
    let secs = hint
        .as_secs()
        .saturating_add(u64::from(hint.subsec_nanos() > 0));
    secs.max(1)
}

pub(crate) fn payload_too_large(max_body: u64) -> Response<Bytes> {
    text(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body over the limit of {max_body} bytes"),
    )
}

pub(crate) fn bad_content_length() -> Response<Bytes> {
    text(StatusCode::BAD_REQUEST, "invalid content-length".to_owned())
}

fn text(status: StatusCode, body: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_never_overflows() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }
}
