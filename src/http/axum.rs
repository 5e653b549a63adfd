//! `ServiceSaturated` as an axum response.

use super::response;
use crate::error::ServiceSaturated;
use axum_core::response::{IntoResponse, Response};

/// `503 Service Unavailable` with `Retry-After`, for applications that keep
/// the generic [`ConcurrencyLayer`](crate::ConcurrencyLayer) behind axum's
/// `HandleErrorLayer`:
///
/// ```
/// use std::time::Duration;
/// use axum::{error_handling::HandleErrorLayer, response::IntoResponse, routing::get, Router};
/// use http::StatusCode;
/// use tower::{BoxError, ServiceBuilder};
/// use tower_inflight::{ConcurrencyLayer, Config, ServiceSaturated};
///
/// async fn handle(error: BoxError) -> axum::response::Response {
///     match error.downcast::<ServiceSaturated>() {
///         Ok(shed) => shed.into_response(),
///         Err(other) => (StatusCode::INTERNAL_SERVER_ERROR, other.to_string()).into_response(),
///     }
/// }
///
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(
///     ServiceBuilder::new()
///         .layer(HandleErrorLayer::new(handle))
///         .layer(ConcurrencyLayer::new(Config::new(32, Duration::from_secs(30)))),
/// );
/// # let _ = app;
/// ```
impl IntoResponse for ServiceSaturated {
    fn into_response(self) -> Response {
        response::refusal(&self).map(axum_core::body::Body::from)
    }
}

impl IntoResponse for Box<ServiceSaturated> {
    fn into_response(self) -> Response {
        (*self).into_response()
    }
}
