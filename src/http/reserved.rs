//! The byte reservation a request carries in its extensions.

use crate::permit::ByteReservation;
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
    reservation: Arc<Mutex<Option<ByteReservation>>>,
}

impl ReservedBytes {
    pub(crate) fn new(reservation: ByteReservation) -> Self {
        Self {
            bytes: reservation.bytes(),
            reservation: Arc::new(Mutex::new(Some(reservation))),
        }
    }

    /// How many bytes were reserved for the request.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the bytes are still held by the request (not released, not
    /// taken).
    pub fn is_held(&self) -> bool {
        lock(&self.reservation).is_some()
    }

    /// Returns the bytes to the budget now.
    pub fn release(&self) {
        drop(self.take());
    }

    /// Takes the reservation over: the bytes come back when it is dropped,
    /// no longer when the request completes. `None` if already taken or
    /// released.
    pub fn take(&self) -> Option<ByteReservation> {
        lock(&self.reservation).take()
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
