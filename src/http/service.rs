//! The HTTP service and its response future.

use super::body::{InFlight, ResponseBody};
use super::layer::Settings;
use super::request::declared_length;
use super::reserved::ReservedBytes;
use super::response;
use crate::bulkhead::{Bulkhead, Permit, Shared};
use crate::error::ServiceSaturated;
use crate::sync::{Arc, Mutex};
use crate::tower::{admit, take_ready, Parked, Readiness, TicketAdmission};
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Limited;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_service::Service;

/// Caps how many requests to the inner HTTP service are in flight at once,
/// and how many bytes of request bodies they hold.
///
/// Built by [`HttpConcurrencyLayer`](super::HttpConcurrencyLayer); see the
/// [module docs](super). The readiness contract is that of
/// [`Concurrency`](crate::Concurrency): ready when there is room, the slot
/// taken in `call`; with a `wait` budget, `poll_ready` waits for a slot;
/// with a cluster ceiling, `poll_ready` takes the slot and its lease.
///
/// The inner service sees the request body wrapped in
/// [`http_body_util::Limited`], which ends it with an error if it grows past
/// what was declared or reserved.
pub struct HttpConcurrency<S> {
    inner: S,
    bulkhead: Bulkhead,
    settings: Arc<Settings>,
    readiness: Readiness,
}

impl<S> HttpConcurrency<S> {
    pub(crate) fn new(inner: S, bulkhead: Bulkhead, settings: Arc<Settings>) -> Self {
        Self {
            inner,
            bulkhead,
            settings,
            readiness: Readiness::Idle,
        }
    }

    /// The bulkhead this service takes its slots from.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for HttpConcurrency<S>
where
    S: Service<Request<Limited<ReqBody>>, Response = Response<ResBody>> + Clone,
    S::Error: 'static,
    ReqBody: Body,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        ready!(self.inner.poll_ready(cx))?;
        if self.settings.classify.is_none() {
            ready!(self.readiness.poll_ready(&self.bulkhead, cx));
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // A body over the byte budget could never be reserved: it is over
        // the cap (413), not shed for want of room (503 and a retry).
        let max_body = match (self.settings.max_body, self.bulkhead.max_bytes()) {
            (Some(max_body), Some(max_bytes)) => Some(max_body.min(max_bytes)),
            (max_body, max_bytes) => max_body.or(max_bytes),
        };
        // Judge the declared length before taking anything: a request that
        // cannot be served must not hold a slot, and a slot handed over while
        // waiting goes on to the next in line.
        let declared = match declared_length(request.headers()) {
            Ok(declared) => declared,
            Err(_) => {
                self.readiness = Readiness::Idle;
                return ResponseFuture::refused(response::bad_content_length());
            }
        };
        if let (Some(length), Some(max_body)) = (declared, max_body) {
            if length > max_body {
                self.readiness = Readiness::Idle;
                return ResponseFuture::refused(response::payload_too_large(max_body));
            }
        }
        let body_limit = match declared {
            Some(length) => Some(length),
            None if request.body().is_end_stream() => Some(0),
            None => max_body,
        };
        // The bytes reserved beside the slot (none without a byte budget).
        let share = body_limit.unwrap_or(0);
        let Some(classify) = &self.settings.classify else {
            let (inner, settings) = (&mut self.inner, &self.settings);
            return self.readiness.call(
                &self.bulkhead,
                share,
                |permit| start(inner, permit, request, body_limit),
                |shed| ResponseFuture::refused(shed_response(settings, &shed)),
            );
        };
        let (parts, body) = request.into_parts();
        let ticket = classify(&parts);
        let request = Request::from_parts(parts, body);
        match admit(&self.bulkhead, ticket) {
            TicketAdmission::Admitted(claim) => {
                match Shared::permit(self.bulkhead.shared(), claim, share) {
                    Ok(permit) => start(&mut self.inner, permit, request, body_limit),
                    Err(shed) => ResponseFuture::refused(shed_response(&self.settings, &shed)),
                }
            }
            TicketAdmission::Wait(acquire) => {
                let admission = Admission {
                    inner: take_ready(&mut self.inner),
                    request,
                    body_limit,
                    settings: self.settings.clone(),
                };
                ResponseFuture::waiting(Parked::new(acquire.with_bytes(share), admission))
            }
            TicketAdmission::Shed(shed) => {
                ResponseFuture::refused(shed_response(&self.settings, &shed))
            }
        }
    }
}

/// A request waiting for its slots, with the ready inner service that will
/// take it once they are handed over.
struct Admission<S, ReqBody> {
    inner: S,
    request: Request<ReqBody>,
    body_limit: Option<u64>,
    settings: Arc<Settings>,
}

/// Calls the inner service with the request's slot and bytes (reserved
/// already, beside the slot), and a body that cannot outgrow them.
fn start<S, ReqBody, ResBody>(
    inner: &mut S,
    permit: Permit,
    request: Request<ReqBody>,
    body_limit: Option<u64>,
) -> ResponseFuture<S, ReqBody>
where
    S: Service<Request<Limited<ReqBody>>, Response = Response<ResBody>>,
{
    let (mut parts, body) = request.into_parts();
    let mut permit = permit;
    permit.ignore_unless_recorded();
    let in_flight = if permit.bytes() > 0 {
        let bytes = permit.bytes();
        let permit = Arc::new(Mutex::new(Some(permit)));
        parts
            .extensions
            .insert(ReservedBytes::new(bytes, permit.clone()));
        InFlight::Shared(permit)
    } else {
        InFlight::Alone(permit)
    };
    let limit = body_limit.map_or(usize::MAX, |limit| {
        usize::try_from(limit).unwrap_or(usize::MAX)
    });
    let request = Request::from_parts(parts, Limited::new(body, limit));
    ResponseFuture::called(inner.call(request), in_flight)
}

fn shed_response(settings: &Settings, shed: &ServiceSaturated) -> Response<Bytes> {
    if let Some(respond) = &settings.on_shed {
        return response::marked_shed(respond(shed));
    }
    let hint = settings.retry_after.unwrap_or(shed.retry_after());
    response::marked_shed(response::service_unavailable(
        shed,
        response::retry_after_secs(hint),
    ))
}

impl<S: Clone> Clone for HttpConcurrency<S> {
    /// The clone shares the bulkhead but not this service's readiness.
    fn clone(&self) -> Self {
        Self::new(
            self.inner.clone(),
            self.bulkhead.clone(),
            self.settings.clone(),
        )
    }
}

impl<S: fmt::Debug> fmt::Debug for HttpConcurrency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpConcurrency")
            .field("inner", &self.inner)
            .field("bulkhead", &self.bulkhead)
            .field("settings", &self.settings)
            .field("readiness", &self.readiness.as_str())
            .finish()
    }
}

pin_project! {
    /// Future for [`HttpConcurrency`]'s responses: the inner call, whose
    /// response body takes over the slot, or a refusal ready at once; with
    /// a classifier, first the wait for slots.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<Limited<ReqBody>>>,
    {
        #[pin]
        kind: Kind<S, ReqBody>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody>
    where
        S: Service<Request<Limited<ReqBody>>>,
    {
        Waiting { parked: Pin<Box<Parked<Admission<S, ReqBody>>>> },
        Called { #[pin] future: S::Future, in_flight: Option<InFlight> },
        Refused { response: Option<Response<Bytes>> },
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<Limited<ReqBody>>>,
{
    fn waiting(parked: Pin<Box<Parked<Admission<S, ReqBody>>>>) -> Self {
        Self {
            kind: Kind::Waiting { parked },
        }
    }

    fn called(future: S::Future, in_flight: InFlight) -> Self {
        Self {
            kind: Kind::Called {
                future,
                in_flight: Some(in_flight),
            },
        }
    }

    fn refused(response: Response<Bytes>) -> Self {
        Self {
            kind: Kind::Refused {
                response: Some(response),
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<Limited<ReqBody>>, Response = Response<ResBody>>,
    // So that an adaptive limit can tell a timeout's error.
    S::Error: 'static,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project().kind.project() {
                KindProj::Waiting { parked } => {
                    let (
                        admitted,
                        Admission {
                            mut inner,
                            request,
                            body_limit,
                            settings,
                        },
                    ) = ready!(parked.as_mut().poll_admitted(cx));
                    let next = match admitted {
                        Ok(permit) => start(&mut inner, permit, request, body_limit),
                        Err(shed) => Self::refused(shed_response(&settings, &shed)),
                    };
                    self.set(next);
                }
                KindProj::Called { future, in_flight } => {
                    let output = ready!(future.poll(cx));
                    // On success the body carries the slot on; on error it is freed here.
                    let mut in_flight = in_flight.take();
                    match (&output, &mut in_flight) {
                        (Ok(response), Some(in_flight)) => {
                            in_flight.record(super::body::outcome_of(response));
                        }
                        (Err(error), Some(in_flight)) => in_flight.record_error(error),
                        (_, None) => {}
                    }
                    return Poll::Ready(output.map(|response| {
                        response.map(|body| ResponseBody::streaming(body, in_flight))
                    }));
                }
                KindProj::Refused { response } => {
                    let response = response
                        .take()
                        .expect("`ResponseFuture` polled after completion");
                    return Poll::Ready(Ok(response.map(ResponseBody::refusal)));
                }
            }
        }
    }
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<Limited<ReqBody>>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Waiting { .. } => "waiting",
            Kind::Called { .. } => "called",
            Kind::Refused { .. } => "refused",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
