//! The `tollgate.v1.Tollgate` gRPC service over an [`App`].
//!
//! Each method runs exactly as its HTTP route does: it verifies the user
//! from the call's metadata with the same
//! [`Verifier`](crate::identity::Verifier) (`authorization: Bearer <JWT>`,
//! or the trusted header), takes a place under the replica's in-flight cap
//! ([`ops::enter`]; tonic has read the whole message by then), converts the
//! message into the operation's request and calls the same operation in
//! [`crate::ops`]; a refusal becomes its gRPC status through the one table
//! ([`ApiError::to_status`]). Every call is counted in
//! `tollgate_grpc_requests_total{method,code}`; store faults in
//! `tollgate_store_errors_total`, as over HTTP.

use tollgate_core::{Limit, Store};
use tonic::metadata::MetadataValue;
use tonic::{Code, Request, Response, Status};

use super::proto;
use super::proto::tollgate_server::{Tollgate, TollgateServer};
use crate::identity::Identity;
use crate::ops::{self, Shadowed};
use crate::outcome::{ApiError, GrpcStatus};
use crate::state::App;

/// Largest request message accepted, bytes: the HTTP API's body limit.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The `tollgate.v1.Tollgate` service. Cloning shares the [`App`].
pub struct TollgateService<S> {
    app: App<S>,
}

impl<S> Clone for TollgateService<S> {
    fn clone(&self) -> Self {
        Self {
            app: self.app.clone(),
        }
    }
}

impl<S> std::fmt::Debug for TollgateService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TollgateService").finish_non_exhaustive()
    }
}

impl<S: Store + Clone> TollgateService<S> {
    /// The service over `app`.
    pub fn new(app: App<S>) -> Self {
        Self { app }
    }

    /// The tonic server of this service, accepting requests of at most
    /// [`MAX_MESSAGE_BYTES`].
    pub fn into_server(self) -> TollgateServer<Self> {
        TollgateServer::new(self).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }
}

/// A successful answer and the limit that would have refused it had its
/// plan not been in shadow mode.
struct Reply<R> {
    message: R,
    shadow_denied: Option<Limit>,
}

impl<R> Reply<R> {
    fn new(message: impl Into<R>) -> Self {
        Self {
            message: message.into(),
            shadow_denied: None,
        }
    }

    fn shadowed<T: Into<R>>(s: Shadowed<T>) -> Self {
        Self {
            message: s.value.into(),
            shadow_denied: s.shadow_denied,
        }
    }
}

/// Counts a call of `method` when it ends: with its code, or `CANCELLED`
/// when the client went away first (the call's future was dropped).
struct Counted<'a, S: Store + Clone> {
    app: &'a App<S>,
    method: &'static str,
    code: Option<Code>,
}

impl<S: Store + Clone> Drop for Counted<'_, S> {
    fn drop(&mut self) {
        let code = self.code.unwrap_or(Code::Cancelled);
        self.app.metrics().grpc_request(self.method, code);
    }
}

impl<S: Store + Clone> TollgateService<S> {
    /// One call of `method`: the verified user, the in-flight cap, then
    /// `op` on the request message; the outcome counted and mapped.
    async fn call<M, R>(
        &self,
        method: &'static str,
        request: Request<M>,
        op: impl AsyncFnOnce(&App<S>, &Identity, M) -> Result<Reply<R>, ApiError>,
    ) -> Result<Response<R>, Status> {
        let app = &self.app;
        let mut counted = Counted {
            app,
            method,
            code: None,
        };
        let result = async {
            // The identity first: an unverified call takes no place.
            let peer = request.remote_addr().map(|a| a.ip());
            let headers = request.metadata().clone().into_headers();
            let caller = ops::verify_caller(app, &headers, peer)?;
            let _place = ops::enter(app)?;
            let result = if app.audit().is_some() || app.telemetry().is_some() {
                let context = crate::audit::from_headers(&headers, app.clock().now_ms());
                crate::audit::REQUEST
                    .scope(context, op(app, &caller, request.into_inner()))
                    .await
            } else {
                op(app, &caller, request.into_inner()).await
            };
            if let Err(e) = &result
                && e.is_fault()
            {
                app.metrics().store_errors.inc();
            }
            result
        }
        .await;
        match result {
            Ok(reply) => {
                counted.code = Some(Code::Ok);
                let mut response = Response::new(reply.message);
                if let Some(limit) = reply.shadow_denied {
                    response.metadata_mut().insert(
                        "x-tollgate-shadow-denied",
                        MetadataValue::from_static(limit.as_str()),
                    );
                }
                Ok(response)
            }
            Err(e) => {
                let status = e.to_status();
                counted.code = Some(status.code());
                Err(status)
            }
        }
    }
}

#[tonic::async_trait]
impl<S: Store + Clone> Tollgate for TollgateService<S> {
    async fn admit_run(
        &self,
        request: Request<proto::AdmitRunRequest>,
    ) -> Result<Response<proto::AdmitRunResponse>, Status> {
        self.call("AdmitRun", request, async |app, user, m| {
            ops::admit_run(app, user.user.as_id(), m.into())
                .await
                .map(Reply::shadowed)
        })
        .await
    }

    async fn release_run(
        &self,
        request: Request<proto::ReleaseRunRequest>,
    ) -> Result<Response<proto::ReleaseRunResponse>, Status> {
        self.call("ReleaseRun", request, async |app, user, m| {
            ops::release_run(
                app,
                user.user.as_id(),
                &m.invocation_id,
                m.session_id.as_deref(),
            )
            .await
            .map(Reply::new)
        })
        .await
    }

    async fn renew_run(
        &self,
        request: Request<proto::RenewRunRequest>,
    ) -> Result<Response<proto::RenewRunResponse>, Status> {
        self.call("RenewRun", request, async |app, user, m| {
            ops::renew_run(app, user.user.as_id(), &m.invocation_id)
                .await
                .map(Reply::new)
        })
        .await
    }

    async fn reserve_tokens(
        &self,
        request: Request<proto::ReserveTokensRequest>,
    ) -> Result<Response<proto::ReserveTokensResponse>, Status> {
        // With `wait`, a cancelled call drops this future; the limiter then
        // refunds the reservation it was waiting on.
        self.call("ReserveTokens", request, async |app, user, m| {
            ops::reserve_tokens(app, user.user.as_id(), m.into())
                .await
                .map(Reply::shadowed)
        })
        .await
    }

    async fn settle(
        &self,
        request: Request<proto::SettleRequest>,
    ) -> Result<Response<proto::SettleResponse>, Status> {
        self.call("Settle", request, async |app, user, m| {
            ops::settle(app, user.user.as_id(), m.into())
                .await
                .map(Reply::new)
        })
        .await
    }

    async fn refund(
        &self,
        request: Request<proto::RefundRequest>,
    ) -> Result<Response<proto::RefundResponse>, Status> {
        self.call("Refund", request, async |app, user, m| {
            ops::refund(app, user.user.as_id(), m.into())
                .await
                .map(Reply::new)
        })
        .await
    }

    async fn acquire_session_lease(
        &self,
        request: Request<proto::AcquireSessionLeaseRequest>,
    ) -> Result<Response<proto::AcquireSessionLeaseResponse>, Status> {
        self.call("AcquireSessionLease", request, async |app, user, m| {
            let req = ops::SessionLeaseRequest {
                holder: m.holder,
                ttl_ms: m.ttl_ms,
            };
            ops::acquire_session_lease(app, user.user.as_id(), &m.session_id, req)
                .await
                .map(Reply::new)
        })
        .await
    }

    async fn renew_session_lease(
        &self,
        request: Request<proto::RenewSessionLeaseRequest>,
    ) -> Result<Response<proto::RenewSessionLeaseResponse>, Status> {
        self.call("RenewSessionLease", request, async |app, user, m| {
            let req = ops::SessionLeaseRequest {
                holder: m.holder,
                ttl_ms: m.ttl_ms,
            };
            ops::renew_session_lease(app, user.user.as_id(), &m.session_id, req)
                .await
                .map(Reply::new)
        })
        .await
    }

    async fn release_session_lease(
        &self,
        request: Request<proto::ReleaseSessionLeaseRequest>,
    ) -> Result<Response<proto::ReleaseSessionLeaseResponse>, Status> {
        self.call("ReleaseSessionLease", request, async |app, user, m| {
            ops::release_session_lease(app, user.user.as_id(), &m.session_id, &m.holder)
                .await
                .map(Reply::new)
        })
        .await
    }

    async fn check_fence(
        &self,
        request: Request<proto::CheckFenceRequest>,
    ) -> Result<Response<proto::CheckFenceResponse>, Status> {
        self.call("CheckFence", request, async |app, user, m| {
            let req = ops::FenceRequest { fence: m.fence };
            ops::check_fence(app, user.user.as_id(), &m.session_id, req)
                .await
                .map(Reply::new)
        })
        .await
    }

    async fn provider_permit(
        &self,
        request: Request<proto::ProviderPermitRequest>,
    ) -> Result<Response<proto::ProviderPermitResponse>, Status> {
        self.call("ProviderPermit", request, async |app, user, m| {
            let req = ops::PermitBody {
                model: m.model,
                tenant: m.tenant,
                tokens: m.tokens,
                input_tokens: m.input_tokens,
                output_tokens: m.output_tokens,
                max_wait_ms: m.max_wait_ms,
                wait: m.wait,
            };
            ops::provider_permit(app, user, &m.provider, req)
                .await
                .map(Reply::new)
        })
        .await
    }

    async fn provider_feedback(
        &self,
        request: Request<proto::ProviderFeedbackRequest>,
    ) -> Result<Response<proto::ProviderFeedbackResponse>, Status> {
        self.call("ProviderFeedback", request, async |app, user, m| {
            let req = ops::FeedbackBody {
                model: m.model,
                status: u64::from(m.status),
                headers: m.headers.into_iter().collect(),
                body: m.body,
            };
            ops::provider_feedback(app, user, &m.provider, req)
                .await
                .map(Reply::new)
        })
        .await
    }
}

// Messages to the operations' requests, and their answers to messages: the
// same fields under the same names.

impl From<proto::AdmitRunRequest> for ops::AdmitRequest {
    fn from(m: proto::AdmitRunRequest) -> Self {
        Self {
            invocation_id: m.invocation_id,
            session_id: m.session_id,
            session_ttl_ms: m.session_ttl_ms,
        }
    }
}

impl From<ops::AdmitResponse> for proto::AdmitRunResponse {
    fn from(r: ops::AdmitResponse) -> Self {
        Self {
            lease_expires_at_ms: r.lease_expires_at_ms,
            lease_ttl_ms: r.lease_ttl_ms,
            estimate_tokens: r.estimate_tokens,
            max_wait_ms: r.max_wait_ms,
            max_llm_calls: r.max_llm_calls,
            session: r.session.map(|s| proto::SessionLease {
                fence: s.fence,
                expires_at_ms: s.expires_at_ms,
            }),
        }
    }
}

impl From<ops::ReleasedResponse> for proto::ReleaseRunResponse {
    fn from(r: ops::ReleasedResponse) -> Self {
        Self {
            released: r.released,
            pending: r.pending,
        }
    }
}

impl From<ops::RenewResponse> for proto::RenewRunResponse {
    fn from(r: ops::RenewResponse) -> Self {
        Self {
            lease_expires_at_ms: r.lease_expires_at_ms,
        }
    }
}

impl From<proto::ReserveTokensRequest> for ops::ReserveRequest {
    fn from(m: proto::ReserveTokensRequest) -> Self {
        Self {
            invocation_id: m.invocation_id,
            estimate: m.estimate,
            wait: m.wait,
            request_id: m.request_id,
            model: m.model,
            input_tokens: m.input_tokens,
            output_tokens: m.output_tokens,
            cached_input_tokens: m.cached_input_tokens,
        }
    }
}

impl From<ops::ReserveResponse> for proto::ReserveTokensResponse {
    fn from(r: ops::ReserveResponse) -> Self {
        Self {
            reservation_id: r.reservation_id,
            wait_ms: r.wait_ms,
        }
    }
}

impl From<proto::SettleRequest> for ops::SettleRequest {
    fn from(m: proto::SettleRequest) -> Self {
        Self {
            reservation_id: m.reservation_id,
            actual: m.actual,
            input_tokens: m.input_tokens,
            output_tokens: m.output_tokens,
            cached_input_tokens: m.cached_input_tokens,
        }
    }
}

impl From<ops::BalanceResponse> for proto::SettleResponse {
    fn from(r: ops::BalanceResponse) -> Self {
        Self {
            balance: r.balance.unwrap_or(0),
            pending: r.pending,
        }
    }
}

impl From<proto::RefundRequest> for ops::RefundRequest {
    fn from(m: proto::RefundRequest) -> Self {
        Self {
            reservation_id: m.reservation_id,
        }
    }
}

impl From<ops::BalanceResponse> for proto::RefundResponse {
    fn from(r: ops::BalanceResponse) -> Self {
        Self {
            balance: r.balance.unwrap_or(0),
            pending: r.pending,
        }
    }
}

impl From<ops::SessionLeaseBody> for proto::AcquireSessionLeaseResponse {
    fn from(r: ops::SessionLeaseBody) -> Self {
        Self {
            fence: r.fence,
            expires_at_ms: r.expires_at_ms,
        }
    }
}

impl From<ops::SessionLeaseBody> for proto::RenewSessionLeaseResponse {
    fn from(r: ops::SessionLeaseBody) -> Self {
        Self {
            fence: r.fence,
            expires_at_ms: r.expires_at_ms,
        }
    }
}

impl From<ops::ReleasedResponse> for proto::ReleaseSessionLeaseResponse {
    fn from(r: ops::ReleasedResponse) -> Self {
        Self {
            released: r.released,
        }
    }
}

impl From<ops::FenceResponse> for proto::CheckFenceResponse {
    fn from(r: ops::FenceResponse) -> Self {
        Self { current: r.current }
    }
}

impl From<ops::PermitResponse> for proto::ProviderPermitResponse {
    fn from(r: ops::PermitResponse) -> Self {
        Self {
            wait_ms: r.wait_ms,
            effective_permille: r.effective_permille,
        }
    }
}

impl From<ops::FeedbackResponse> for proto::ProviderFeedbackResponse {
    fn from(r: ops::FeedbackResponse) -> Self {
        Self {
            class: r.class.to_owned(),
            retryable: r.retryable,
            retry_after_ms: r.retry_after_ms,
            cooldown_until_ms: r.cooldown_until_ms,
            effective_permille: r.effective_permille,
            reason: r.reason,
        }
    }
}
