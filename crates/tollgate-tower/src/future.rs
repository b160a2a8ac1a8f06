//! The [`ResponseFuture`] of the [`TurnRate`](crate::TurnRate) service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{Either, Full};
use pin_project_lite::pin_project;
use tower_service::Service;

use tollgate_outcome::ApiError;

use crate::error;
use crate::service::{Check, SHADOW_DENIED_HEADER, TurnChecked, Verdict};

/// The body of a [`TurnRate`](crate::TurnRate) response: the inner
/// service's own body (`Left`) when it was called, or the layer's JSON
/// refusal (`Right`).
///
/// It is an [`http_body::Body`] whenever `B` is one with `Data = Bytes`, so
/// axum accepts it (`Response<ResponseBody<axum::body::Body>>` implements
/// `IntoResponse`), as do hyper and tonic.
///
/// [`http_body::Body`]: https://docs.rs/http-body/1/http_body/trait.Body.html
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

pin_project! {
    /// Future for the [`TurnRate`](crate::TurnRate) service: waits for the
    /// limiter, then either answers the refusal or calls the inner service
    /// and passes its response through (with `x-tollgate-shadow-denied` when
    /// the plan is in shadow mode and would have refused).
    ///
    /// # Cancel safety
    ///
    /// Dropping it while the limiter decides (a client that hangs up) is
    /// safe: the store's admission is one atomic step, so the turn is either
    /// charged or not. If the drop falls between the admission and the
    /// release of its lease, that lease is held until the plan's
    /// `lease_ttl_ms` passes. Nothing else is left behind.
    pub struct ResponseFuture<Inner, ReqB>
    where
        Inner: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<Inner, ReqB>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Inner, ReqB>
    where
        Inner: Service<Request<ReqB>>,
    {
        /// The limiter is deciding; the ready inner service and the request
        /// wait for its verdict.
        Checking {
            check: Check,
            pending: Option<(Inner, Request<ReqB>)>,
        },
        /// Allowed: the inner service is answering.
        Calling {
            #[pin]
            fut: Inner::Future,
            shadow_denied: Option<HeaderValue>,
        },
        /// Refused before the limiter was asked (no identity).
        Rejected {
            rejection: Option<ApiError>,
        },
        /// The response was handed out.
        Done,
    }
}

impl<Inner, ReqB> ResponseFuture<Inner, ReqB>
where
    Inner: Service<Request<ReqB>>,
{
    pub(crate) fn checking(check: Check, ready: Inner, req: Request<ReqB>) -> Self {
        Self {
            state: State::Checking {
                check,
                pending: Some((ready, req)),
            },
        }
    }

    pub(crate) fn rejected(rejection: ApiError) -> Self {
        Self {
            state: State::Rejected {
                rejection: Some(rejection),
            },
        }
    }
}

impl<Inner, ReqB> fmt::Debug for ResponseFuture<Inner, ReqB>
where
    Inner: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Checking { .. } => "checking",
            State::Calling { .. } => "calling",
            State::Rejected { .. } => "rejected",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

const POLLED_AFTER_DONE: &str = "ResponseFuture polled after completion";

impl<Inner, ReqB, ResB> Future for ResponseFuture<Inner, ReqB>
where
    Inner: Service<Request<ReqB>, Response = Response<ResB>>,
{
    type Output = Result<Response<ResponseBody<ResB>>, Inner::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Checking { check, pending } => {
                    let verdict = ready!(check.as_mut().poll(cx));
                    let Some((mut inner, mut req)) = pending.take() else {
                        panic!("{POLLED_AFTER_DONE}");
                    };
                    match verdict {
                        Verdict::Allow {
                            user,
                            shadow_denied,
                        } => {
                            let header = shadow_denied
                                .and_then(|d| HeaderValue::from_str(d.limit().as_str()).ok());
                            req.extensions_mut().insert(TurnChecked {
                                user,
                                shadow_denied,
                            });
                            let fut = inner.call(req);
                            state.set(State::Calling {
                                fut,
                                shadow_denied: header,
                            });
                        }
                        Verdict::Reject(rejection) => {
                            state.set(State::Done);
                            return Poll::Ready(Ok(error::respond(rejection).map(Either::Right)));
                        }
                    }
                }
                StateProj::Calling { fut, shadow_denied } => {
                    let result = ready!(fut.poll(cx));
                    let header = shadow_denied.take();
                    state.set(State::Done);
                    let mut res = result?;
                    if let Some(v) = header {
                        res.headers_mut().insert(SHADOW_DENIED_HEADER, v);
                    }
                    return Poll::Ready(Ok(res.map(Either::Left)));
                }
                StateProj::Rejected { rejection } => {
                    let Some(rejection) = rejection.take() else {
                        panic!("{POLLED_AFTER_DONE}");
                    };
                    state.set(State::Done);
                    return Poll::Ready(Ok(error::respond(rejection).map(Either::Right)));
                }
                StateProj::Done => panic!("{POLLED_AFTER_DONE}"),
            }
        }
    }
}
