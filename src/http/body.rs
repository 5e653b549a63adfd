//! The response body, which holds the call's slot until it ends.

use crate::adaptive::Outcome;
use crate::bulkhead::Permit;
use crate::sync::{lock, Arc, Mutex};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// What an admitted request holds until its response body ends: its slot,
/// and the bytes reserved for it unless its handler took them over.
pub(crate) enum InFlight {
    Alone(Permit),
    /// Shared with the [`ReservedBytes`](super::ReservedBytes) in the
    /// request's extensions.
    Shared(Arc<Mutex<Option<Permit>>>),
    /// A key's slot and the ceiling's, from a keyed bulkhead.
    Keyed(crate::keyed::KeyedPermit),
}

impl InFlight {
    /// Tells the adaptive limit how the call went, as its response's head
    /// arrives: the slot is held on until the body ends, but the
    /// dependency's latency is the head's.
    pub(crate) fn record(&mut self, outcome: Outcome) {
        match self {
            InFlight::Alone(permit) => permit.record(outcome),
            InFlight::Shared(permit) => {
                if let Some(permit) = lock(permit).as_mut() {
                    permit.record(outcome);
                }
            }
            InFlight::Keyed(permit) => permit.record(outcome),
        }
    }
}

impl InFlight {
    /// Tells the adaptive limit the call failed with `error` (a timeout's
    /// error is a drop; see `Permit::record_error`).
    pub(crate) fn record_error(&mut self, error: &dyn std::any::Any) {
        match self {
            InFlight::Alone(permit) => permit.record_error(error),
            InFlight::Shared(permit) => {
                if let Some(permit) = lock(permit).as_mut() {
                    permit.record_error(error);
                }
            }
            InFlight::Keyed(permit) => permit.record_error(error),
        }
    }
}

/// What a response says of the dependency. A bulkhead's own refusal (a
/// layer further in) says nothing, whatever else it carries: it never
/// reached the dependency. Else what the inner service put in its
/// extensions (an [`Outcome`]: a cache hit that did no work, say), or else
/// its status: 503, 429 and the other 5xx are drops, anything else was
/// served, but for 400, 408 and 413, which say nothing: what a server
/// answers a request whose body did not come as it should (cut by a body
/// timeout, over a length limit, malformed), or a bulkhead further in
/// answers a `Content-Length` it refuses, whose latency is the client's or
/// none.
pub(crate) fn outcome_of<B>(response: &http::Response<B>) -> Outcome {
    let extensions = response.extensions();
    if extensions.get::<super::response::Shed>().is_some() {
        return Outcome::Ignore;
    }
    if let Some(outcome) = extensions.get::<Outcome>() {
        return *outcome;
    }
    let status = response.status();
    if matches!(
        status,
        http::StatusCode::BAD_REQUEST
            | http::StatusCode::REQUEST_TIMEOUT
            | http::StatusCode::PAYLOAD_TOO_LARGE
    ) {
        Outcome::Ignore
    } else if status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS {
        Outcome::Dropped
    } else {
        Outcome::Success
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let InFlight::Shared(permit) = self {
            let permit = lock(permit).take();
            drop(permit);
        }
    }
}

pin_project! {
    /// The body of a response from [`HttpConcurrency`](super::HttpConcurrency):
    /// the inner service's body, holding the request's slot until it has been
    /// produced to its end or dropped, or the short text of a refusal.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Streaming { #[pin] body: B, in_flight: Option<InFlight> },
        Refusal { text: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn streaming(body: B, in_flight: Option<InFlight>) -> Self {
        Self {
            kind: Kind::Streaming { body, in_flight },
        }
    }

    pub(crate) fn refusal(text: Bytes) -> Self {
        Self {
            kind: Kind::Refusal {
                text: (!text.is_empty()).then_some(text),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Streaming {
                mut body,
                in_flight,
            } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                // The work is over once the body has nothing more to give,
                // whether or not anyone polls it again.
                if !matches!(frame, Some(Ok(_))) || body.is_end_stream() {
                    drop(in_flight.take());
                }
                Poll::Ready(frame)
            }
            KindProj::Refusal { text } => {
                Poll::Ready(text.take().map(|text| Ok(Frame::data(text))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Streaming { body, .. } => body.is_end_stream(),
            Kind::Refusal { text } => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Streaming { body, .. } => body.size_hint(),
            Kind::Refusal { text } => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
        }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Streaming { in_flight, .. } if in_flight.is_some() => "streaming",
            Kind::Streaming { .. } => "done",
            Kind::Refusal { .. } => "refusal",
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}
