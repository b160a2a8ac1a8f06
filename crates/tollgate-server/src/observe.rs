//! What every decision leaves behind, for the API's operations
//! ([`crate::ops`]) and Envoy's rate-limit service ([`crate::envoy`])
//! alike: `tollgate_decisions_total` by operation, limit, outcome and plan
//! (never the user), a span when `[telemetry]` is on, and an audit line
//! for a refusal when `[audit]` is on.

use std::sync::Arc;

use tollgate_core::Store;

use crate::audit::{AuditEntry, RequestContext};
use crate::metrics::DecisionLabels;
use crate::state::App;
use crate::telemetry::DecisionSpan;

/// One decision as it is counted, traced and audited.
#[derive(Debug)]
pub(crate) struct Observed<'a> {
    /// `admit`, `reserve`, `session` or `rls`.
    pub(crate) op: &'static str,
    /// The refusing limit, or `none`.
    pub(crate) limit: &'static str,
    /// `allowed`, `waited`, `denied` or `shadow_denied`.
    pub(crate) outcome: &'static str,
    /// The plan that decided (an RLS bucket: its rule's name).
    pub(crate) plan: &'a Arc<str>,
    /// The user, when the decision has one.
    pub(crate) user: Option<&'a str>,
    /// The wait granted, ms.
    pub(crate) wait_ms: u64,
    /// A refusal's retry hint, ms.
    pub(crate) retry_after_ms: Option<u64>,
}

/// Records `d`, made during the request of `ctx` (its start and its
/// caller's trace), on `app`'s metrics, telemetry and audit log.
pub(crate) fn decision<S: Store + Clone>(
    app: &App<S>,
    d: &Observed<'_>,
    ctx: Option<&RequestContext>,
) {
    app.metrics()
        .decisions
        .get_or_create(&DecisionLabels {
            op: d.op,
            limit: d.limit,
            outcome: d.outcome,
            plan: Arc::clone(d.plan),
        })
        .inc();
    let (telemetry, audit) = (app.telemetry(), app.audit());
    if telemetry.is_none() && audit.is_none() {
        return;
    }
    let now = app.clock().now_ms();
    let parent = ctx.and_then(|c| c.parent.as_ref());
    if let Some(t) = telemetry {
        t.decision(
            &DecisionSpan {
                op: d.op,
                limit: d.limit,
                outcome: d.outcome,
                plan: d.plan,
                wait_ms: d.wait_ms,
                user: d.user,
                started_ms: ctx.map_or(now, |c| c.started_ms),
                ended_ms: now,
            },
            parent,
        );
    }
    if let Some(a) = audit
        && matches!(d.outcome, "denied" | "shadow_denied")
    {
        a.record(&AuditEntry {
            ts_ms: now,
            user: d.user,
            plan: d.plan,
            op: d.op,
            limit: d.limit,
            outcome: d.outcome,
            retry_after_ms: d.retry_after_ms,
            trace_id: parent.map(|p| p.trace_id.as_str()),
        });
    }
}
