//! The byte reservation a request carries in its extensions.

use crate::bulkhead::{ByteReservation, Permit};
use crate::sync::{lock, Arc, Mutex};
use std::fmt;

/// The share of the byte budget reserved for a request, in its extensions.
///
/// By default the bytes come back when the request completes (its response
/// body ends or is dropped). A handler that knows better can
/// [`release`](Self::release) them as soon as it no longer holds the request's
/// buffer, or [`take`](Self::take) them into whatever keeps the buffer alive
/// (a spawned task, a cache entry), so that they come back exactly when the
/// buffer goes.
///
/// ```
/// use axum::{body::Bytes, Extension};
/// use tower_inflight::http::ReservedBytes;
///
/// async fn upload(Extension(reserved): Extension<ReservedBytes>, body: Bytes) -> &'static str {
///     let bytes = reserved.take(); // the budget follows the buffer into the task
///     tokio::spawn(async move {
///         let _keep = bytes;
///         store(body).await;
///     });
///     "accepted"
/// }
/// # async fn store(_: Bytes) {}
/// ```
#[derive(Clone)]
pub struct ReservedBytes {
    bytes: u64,
    /// The request's permit, shared with its response body: the bytes stay
    /// on it (and come back with its slot if the response is leaked) until
    /// the handler takes them off.
    permit: Arc<Mutex<Option<Permit>>>,
}

impl ReservedBytes {
    pub(crate) fn new(bytes: u64, permit: Arc<Mutex<Option<Permit>>>) -> Self {
        Self { bytes, permit }
    }

    /// How many bytes were reserved for the request.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the bytes are still held by the request (not released, not
    /// taken, and the request not complete).
    pub fn is_held(&self) -> bool {
        lock(&self.permit)
            .as_ref()
            .is_some_and(|permit| permit.bytes() > 0)
    }

    /// Returns the bytes to the budget now.
    pub fn release(&self) {
        drop(self.take());
    }

    /// Takes the reservation over: the bytes come back when it is dropped,
    /// no longer when the request completes. `None` if already taken or
    /// released, or if the request has completed.
    pub fn take(&self) -> Option<ByteReservation> {
        let mut permit = lock(&self.permit);
        let permit = permit.as_mut().filter(|permit| permit.bytes() > 0)?;
        Some(permit.split_bytes())
    }
}

impl fmt::Debug for ReservedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReservedBytes")
            .field("bytes", &self.bytes)
            .field("held", &self.is_held())
            .finish()
    }
}
