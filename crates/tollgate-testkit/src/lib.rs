//! # tollgate-testkit
//!
//! The conformance suite every tollgate [`Store`] runs: the worked examples
//! of the SPEC (§7) to the exact number, and the rules of §2–4, driven by a
//! [`FakeClock`] so no test sleeps.
//!
//! A store's tests instantiate it with [`conformance_tests!`], giving a
//! factory that builds a fresh, empty store reading the given fake clock:
//!
//! ```no_run
//! # mod t {
//! tollgate_testkit::conformance_tests!(|clock| async move {
//!     tollgate_core::MemoryStore::new(clock)
//! });
//! # }
//! ```
//!
//! Each scenario is also a plain `async fn` in [`scenarios`], and
//! [`run_all`] runs every one in turn.
//!
//! [`Store`]: tollgate_core::Store

use std::future::Future;

use tollgate_core::{FakeClock, Store};

pub mod faulty;
pub mod redis;
pub mod scenarios;

/// The fake clock's start: a realistic Unix time in ms, so stores are tested
/// with the magnitudes they see in production. The SPEC's "t = 0" is this.
pub const T0: u64 = 1_700_000_000_000;

/// A fresh fake clock at [`T0`].
pub fn clock() -> FakeClock {
    FakeClock::new(T0)
}

/// `v` as an id, for tests that build one by hand.
///
/// # Panics
///
/// If `v` is no id ([`tollgate_core::id::check_id`]).
#[track_caller]
pub fn id(v: &str) -> tollgate_core::Id<'_> {
    tollgate_core::Id::new(v).expect("a valid id")
}

/// Calls `$m!` with every scenario's name, once: the one list the test
/// macro and [`run_all`] both expand.
#[doc(hidden)]
#[macro_export]
macro_rules! for_each_scenario {
    ($m:path; $($args:tt)*) => {
        $m!($($args)*;
            example_1_turn_burst,
            example_2_steady_turns,
            example_3_token_wait_boundary,
            example_4_concurrency,
            provider_example,
            settle_and_refund_once,
            reservations_are_per_user,
            max_llm_calls,
            idempotent_admission,
            release_and_renew_by_id,
            session_fencing,
            shadow_mode,
            clock_steps_back,
            waiting_reserve,
            abandoned_wait_is_refunded,
            take_many_all_or_nothing,
            cooldown,
            cooldown_is_a_duration_capped_when_read,
            aimd_halves_once_and_recovers,
            clear_provider,
            provider_governor_example,
            provider_cooldown_is_shared,
            provider_bad_hint_is_clamped_and_cleared,
            provider_aimd_under_a_burst_of_429s,
            provider_tenant_shares_isolate,
            fair_share_alone_uses_the_pool,
            fair_share_backlogged_by_weight,
            fair_share_light_tenant_is_never_refused,
            fair_share_reload_applies_to_the_next_permit,
            fair_share_state_reads_back_until_it_expires,
            inspection_and_reset,
            exceeds_capacity,
            lowered_capacity_applies_at_refill,
            both_limits_fail,
            refused_calls_are_not_counted,
            period_change_keeps_tokens,
            renew_never_shortens,
            reclaimed_leases_are_counted,
            run_records_are_bounded,
            take_one_shares_budgets,
            sessions_are_bounded_per_user,
            sessions_without_records_are_kept_for_the_grace,
            a_log_keeps_its_end_after_its_records_are_deleted,
            zero_token_reservations_are_invalid,
            request_ids_answer_the_first_grant,
            reconcile_charges_and_resolves_ambiguity,
            session_create_writes_its_group_in_one_step,
            session_append_is_fenced_and_once_per_id,
            session_delete_writes_its_group_in_one_step,
            grouped_logs_live_as_long_as_they_are_written,
            budgets_charge_and_refuse,
            budgets_top_up_reset_and_alerts,
            budget_windows_follow_the_calendar,
            reconcile_charges_budgets,
            example_5_budgets
        );
    };
}

/// Runs every scenario against fresh stores from `make`, in order; panics on
/// the first failure with the scenario's name.
pub async fn run_all<S, F, Fut>(make: F)
where
    S: Store + Clone,
    F: Fn(FakeClock) -> Fut,
    Fut: Future<Output = S>,
{
    macro_rules! each {
        ($make:ident; $($name:ident),* $(,)?) => {$(
            let c = clock();
            let store = $make(c.clone()).await;
            eprintln!("conformance: {}", stringify!($name));
            scenarios::$name(store, c).await;
        )*};
    }
    for_each_scenario!(each; make);
}

/// Expands to one `#[tokio::test]` per conformance scenario, each building a
/// fresh store with `$make` (a `Fn(FakeClock) -> impl Future<Output = S>`).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::for_each_scenario!($crate::conformance_tests; @each $make);
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            let clock = $crate::clock();
            let store = ($make)(clock.clone()).await;
            $crate::scenarios::$name(store, clock).await;
        }
    )*};
}
