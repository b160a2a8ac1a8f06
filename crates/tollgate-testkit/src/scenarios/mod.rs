//! The conformance scenarios. Each takes a fresh, empty store that reads
//! `clock`, and panics with a message on any deviation from the SPEC.
//!
//! Times in comments are relative to [`T0`](crate::T0), the SPEC's t = 0.
//!
//! Each scenario lives in a topic module and is re-exported here, so its
//! path is `scenarios::<name>`.

use tollgate_core::store::UserState;
use tollgate_core::{
    Decision, Denial, FakeClock, Limit, Limiter, PlanBook, PlanConfig, PlansConfig, RateConfig,
    Store,
};

mod buckets;
mod budgets;
mod examples;
pub mod fair;
mod grouped;
mod leases;
mod provider_state;
mod providers;
mod reservations;
mod sessions;

pub use buckets::{
    clock_steps_back, exceeds_capacity, inspection_and_reset, lowered_capacity_applies_at_refill,
    period_change_keeps_tokens, shadow_mode, take_many_all_or_nothing, take_one_shares_budgets,
};
pub use budgets::{
    budget_windows_follow_the_calendar, budgets_charge_and_refuse, budgets_top_up_reset_and_alerts,
    example_5_budgets, reconcile_charges_budgets,
};
pub use examples::{
    example_1_turn_burst, example_2_steady_turns, example_3_token_wait_boundary,
    example_4_concurrency, provider_example,
};
pub use fair::{
    fair_share_alone_uses_the_pool, fair_share_backlogged_by_weight,
    fair_share_light_tenant_is_never_refused, fair_share_reload_applies_to_the_next_permit,
    fair_share_state_reads_back_until_it_expires,
};
pub use grouped::{
    a_log_keeps_its_end_after_its_records_are_deleted,
    grouped_logs_live_as_long_as_they_are_written, session_append_is_fenced_and_once_per_id,
    session_create_writes_its_group_in_one_step, session_delete_writes_its_group_in_one_step,
};
pub use leases::{
    both_limits_fail, idempotent_admission, reclaimed_leases_are_counted, release_and_renew_by_id,
    renew_never_shortens, run_records_are_bounded,
};
pub use provider_state::{
    aimd_halves_once_and_recovers, clear_provider, cooldown,
    cooldown_is_a_duration_capped_when_read,
};
pub use providers::{
    provider_aimd_under_a_burst_of_429s, provider_bad_hint_is_clamped_and_cleared,
    provider_cooldown_is_shared, provider_governor_example, provider_tenant_shares_isolate,
};
pub use reservations::{
    abandoned_wait_is_refunded, max_llm_calls, reconcile_charges_and_resolves_ambiguity,
    refused_calls_are_not_counted, request_ids_answer_the_first_grant, reservations_are_per_user,
    settle_and_refund_once, waiting_reserve, zero_token_reservations_are_invalid,
};
pub use sessions::{
    session_fencing, sessions_are_bounded_per_user, sessions_without_records_are_kept_for_the_grace,
};

/// Plan "support" of SPEC §7: 20 turns/min, burst 5; 60,000 tokens/min,
/// burst 60,000; 2 concurrent runs; max wait 2,000 ms.
pub fn support() -> PlanConfig {
    PlanConfig {
        turns: RateConfig {
            amount: 20,
            period_ms: 60_000,
            burst: Some(5),
        },
        tokens: RateConfig {
            amount: 60_000,
            period_ms: 60_000,
            burst: Some(60_000),
        },
        max_wait_ms: 2_000,
        concurrent_runs: 2,
        lease_ttl_ms: None,
        concurrency_retry_ms: None,
        max_llm_calls: None,
        estimate_tokens: Some(6_000),
        max_sessions: None,
        shadow: false,
        budgets: None,
    }
}

/// Plans whose default plan is `plan`, named "p".
pub fn book_with(plan: PlanConfig) -> PlanBook {
    let mut cfg = PlansConfig {
        default_plan: Some("p".into()),
        ..PlansConfig::default()
    };
    cfg.plans.insert("p".into(), plan);
    cfg.validate().expect("valid plan")
}

/// A limiter whose default plan is `plan`, named "p". It keeps no
/// refusals (SPEC §3): every decision of a scenario is the store's.
pub fn limiter_with<S: Store>(store: S, clock: &FakeClock, plan: PlanConfig) -> Limiter<S> {
    Limiter::new(store, clock.clone(), book_with(plan)).with_refusal_cache(0)
}

fn limited<T: std::fmt::Debug>(d: &Decision<T>) -> (Limit, u64) {
    match d {
        Decision::Denied(Denial::Limited {
            limit,
            retry_after_ms,
        }) => (*limit, *retry_after_ms),
        other => panic!("expected a retryable denial, got {other:?}"),
    }
}

fn allowed<T: std::fmt::Debug + Clone>(d: &Decision<T>) -> T {
    match d {
        Decision::Allowed {
            grant,
            shadow_denied: None,
        } => grant.clone(),
        other => panic!("expected allowed, got {other:?}"),
    }
}

async fn state<S: Store>(l: &Limiter<S>, user: &str) -> UserState {
    let plan = l.plan_for(user).unwrap();
    l.store()
        .user_state(user, plan.turns, plan.tokens)
        .await
        .unwrap()
}
