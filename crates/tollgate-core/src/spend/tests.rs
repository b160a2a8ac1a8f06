use super::*;
use crate::bucket::BucketSpec;
use crate::reserve::{self, CallState};
use crate::store::{ReservationId, ReserveOutcome, ReserveRequest, SettleOutcome, SettleRequest};

const DAY: u64 = 86_400_000;
/// 2027-01-01T00:00Z.
const D0: u64 = 1_798_761_600_000;

fn daily(unit: BudgetUnit, limit: u64) -> BudgetCheck {
    BudgetCheck {
        period: Period::Daily,
        unit,
        limit,
        current: Window {
            start_ms: D0,
            end_ms: D0 + DAY,
        },
        next: Window {
            start_ms: D0 + DAY,
            end_ms: D0 + 2 * DAY,
        },
        fallback: false,
    }
}

fn monthly_cost(limit: u64) -> BudgetCheck {
    BudgetCheck {
        period: Period::Monthly,
        unit: BudgetUnit::Cost,
        limit,
        current: Window {
            start_ms: D0,
            end_ms: D0 + 31 * DAY,
        },
        next: Window {
            start_ms: D0 + 31 * DAY,
            end_ms: D0 + 59 * DAY,
        },
        fallback: false,
    }
}

/// $3 per million input tokens, $15 per million output, $0.30 cached.
fn price() -> Price {
    Price {
        input: 3_000_000,
        output: 15_000_000,
        cached_input: 300_000,
    }
}

fn req<'a>(checks: &'a [BudgetCheck], split: Option<TokenSplit>) -> BudgetRequest<'a> {
    BudgetRequest {
        checks,
        price: Some(price()),
        split,
        alerts: &[80, 100],
    }
}

#[test]
fn the_store_clock_picks_the_window() {
    let c = daily(BudgetUnit::Tokens, 10);
    assert_eq!(c.window(D0 + DAY - 1), c.current, "the last ms of the day");
    assert_eq!(c.window(D0 + DAY), c.next, "midnight is the next day");
    // A store clock behind the caller's stays in the caller's current window.
    assert_eq!(c.window(D0 - 5), c.current);
}

#[test]
fn amounts_in_tokens_and_money_to_the_micro_unit() {
    let p = price();
    assert_eq!(amount(BudgetUnit::Tokens, Some(&p), 1_000, None), 1_000);
    let split = TokenSplit::new(700, 300, 2_000);
    // Token budgets count the tokens; a split only prices them.
    assert_eq!(
        amount(BudgetUnit::Tokens, Some(&p), 3_000, Some(split)),
        3_000
    );
    // Unsplit: at the higher (output) price, 1,000 × $15 / 1e6 = $0.015.
    assert_eq!(amount(BudgetUnit::Cost, Some(&p), 1_000, None), 15_000);
    // 700 × 3 + 300 × 15 + 2,000 × 0.3 = 2,100 + 4,500 + 600 micro-units.
    assert_eq!(amount(BudgetUnit::Cost, Some(&p), 0, Some(split)), 7_200);
    // Rounded up once over the call: 1 input token at $3/M is 3 micro-units,
    // 1 cached token at $0.30/M is 0.3, so the call costs 4 (not 3 + 1).
    assert_eq!(
        amount(
            BudgetUnit::Cost,
            Some(&p),
            0,
            Some(TokenSplit::new(1, 0, 1))
        ),
        4
    );
    assert_eq!(
        amount(
            BudgetUnit::Cost,
            Some(&p),
            0,
            Some(TokenSplit::new(0, 0, 1))
        ),
        1
    );
    // No price: nothing could be charged, so it counts as the most.
    assert_eq!(amount(BudgetUnit::Cost, None, 1, None), MAX_AMOUNT);
    // Past 2^53 micro-units (or tokens): 2^53.
    assert_eq!(
        amount(BudgetUnit::Cost, Some(&p), u64::MAX, None),
        MAX_AMOUNT
    );
    assert_eq!(amount(BudgetUnit::Tokens, None, u64::MAX, None), MAX_AMOUNT);
}

#[test]
fn a_reserve_fits_up_to_the_limit_and_the_next_is_refused_until_midnight() {
    let checks = [daily(BudgetUnit::Tokens, 2_000_000)];
    let mut s = Spend::default();
    let now = D0 + 20 * 3_600_000;
    s.add(
        Period::Daily,
        BudgetUnit::Tokens,
        checks[0].current,
        1_990_000,
    );
    let ok = s
        .decide(&req(&checks, None), now, 10_000)
        .expect("fits exactly");
    assert_eq!(ok.charges[0].amount, 10_000);
    assert_eq!(ok.charges[0].window_start, D0);
    s.charge(&checks, &ok, now);
    assert_eq!(s.spent(&checks[0], now), 2_000_000);
    assert_eq!(
        s.decide(&req(&checks, None), now, 1),
        Err(Denial::Limited {
            limit: Limit::BudgetDaily,
            retry_after_ms: 4 * 3_600_000,
        })
    );
    assert_eq!(
        s.exhausted(&checks, now),
        Some(Denial::Limited {
            limit: Limit::BudgetDaily,
            retry_after_ms: 4 * 3_600_000,
        })
    );
    // At midnight a fresh window: nothing spent in it.
    assert_eq!(s.spent(&checks[0], D0 + DAY), 0);
    assert!(s.exhausted(&checks, D0 + DAY).is_none());
    assert!(s.decide(&req(&checks, None), D0 + DAY, 2_000_000).is_ok());
    // More than the whole budget can never fit.
    assert_eq!(
        s.decide(&req(&checks, None), D0 + DAY, 2_000_001),
        Err(Denial::ExceedsCapacity {
            limit: Limit::BudgetDaily,
            cost: 2_000_001,
            max_cost: 2_000_000,
        })
    );
}

#[test]
fn of_several_refusals_the_latest_reset_is_reported() {
    let checks = [daily(BudgetUnit::Tokens, 100), monthly_cost(1_000)];
    let mut s = Spend::default();
    s.add(Period::Daily, BudgetUnit::Tokens, checks[0].current, 100);
    s.add(Period::Monthly, BudgetUnit::Cost, checks[1].current, 1_000);
    let now = D0 + 1_000;
    assert_eq!(
        s.decide(&req(&checks, None), now, 1),
        Err(Denial::Limited {
            limit: Limit::BudgetMonthly,
            retry_after_ms: 31 * DAY - 1_000,
        })
    );
}

#[test]
fn a_settle_moves_the_charged_window_or_charges_the_next_one() {
    let checks = [monthly_cost(50_000_000)];
    let mut s = Spend::default();
    let now = D0 + DAY;
    // Reserved 1,000 tokens unsplit: $0.015.
    let charged = s.decide(&req(&checks, None), now, 1_000).unwrap();
    s.charge(&checks, &charged, now);
    assert_eq!(s.spent(&checks[0], now), 15_000);
    // Settled with 600 input + 400 output: 1,800 + 6,000 = 7,800.
    let usage = req(&checks, Some(TokenSplit::new(600, 400, 0)));
    s.close(&charged, &usage, now + 5_000, Some(1_000));
    assert_eq!(s.spent(&checks[0], now), 7_800);
    // The price kept with the reservation is used, not the settle's.
    let mut dearer = usage;
    dearer.price = Some(Price {
        input: 30_000_000,
        output: 150_000_000,
        cached_input: 0,
    });
    let charged2 = s.decide(&req(&checks, None), now, 1_000).unwrap();
    s.charge(&checks, &charged2, now);
    s.close(&charged2, &dearer, now, Some(1_000));
    assert_eq!(s.spent(&checks[0], now), 15_600);
    // A reservation made in the last ms of the month, settled in the next:
    // the old window keeps its estimate, the new one gets the actual cost.
    let last = D0 + 31 * DAY - 1;
    let charged3 = s.decide(&req(&checks, None), last, 1_000).unwrap();
    s.charge(&checks, &charged3, last);
    assert_eq!(s.spent(&checks[0], last), 30_600);
    s.close(&charged3, &usage, last + 1, Some(1_000));
    assert_eq!(s.spent(&checks[0], last + 1), 7_800, "next month");
}

#[test]
fn a_refund_gives_back_in_its_window_only() {
    let checks = [daily(BudgetUnit::Tokens, 10_000)];
    let mut s = Spend::default();
    let now = D0 + 10;
    let a = s.decide(&req(&checks, None), now, 4_000).unwrap();
    s.charge(&checks, &a, now);
    let b = s.decide(&req(&checks, None), now, 3_000).unwrap();
    s.charge(&checks, &b, now);
    s.close(&a, &req(&checks, None), now + 1, None);
    assert_eq!(s.spent(&checks[0], now), 3_000);
    // The day has ended: giving b back changes nothing today.
    s.close(&b, &req(&checks, None), D0 + DAY, None);
    assert_eq!(s.spent(&checks[0], D0 + DAY), 0);
    assert_eq!(s.spent(&checks[0], now), 3_000, "yesterday untouched");
}

#[test]
fn a_budget_removed_or_counted_otherwise_is_left_alone() {
    let tokens = [daily(BudgetUnit::Tokens, 10_000)];
    let mut s = Spend::default();
    let a = s.decide(&req(&tokens, None), D0, 4_000).unwrap();
    s.charge(&tokens, &a, D0);
    // Reloaded as a cost budget: the token spend does not count in money.
    let cost = [daily(BudgetUnit::Cost, 10_000)];
    assert_eq!(s.spent(&cost[0], D0), 0);
    s.close(&a, &req(&cost, None), D0, Some(9_000));
    assert_eq!(s.spent(&tokens[0], D0), 4_000, "not moved");
    s.close(&a, &req(&[], None), D0, None);
    assert_eq!(s.spent(&tokens[0], D0), 4_000, "not moved");
}

fn call_state_reserve(
    state: &mut CallState,
    now: u64,
    estimate: u64,
    checks: &[BudgetCheck],
) -> ReserveOutcome {
    reserve::reserve(
        state,
        now,
        &ReserveRequest {
            user: "u",
            invocation_id: "run",
            tokens: BucketSpec::new(1_000, 1_000, 10_000).unwrap(),
            estimate,
            max_wait_ms: 0,
            max_llm_calls: 100,
            shadow: false,
            request_id: None,
            budget: Some(req(checks, None)),
        },
    )
}

#[test]
fn the_token_bucket_and_the_budgets_are_all_or_nothing() {
    let checks = [daily(BudgetUnit::Tokens, 12_000)];
    let mut state = CallState::default();
    let now = D0 + 1_000;
    // Granted: both charged.
    assert!(matches!(
        call_state_reserve(&mut state, now, 8_000, &checks),
        ReserveOutcome::Granted { .. }
    ));
    assert_eq!(state.spend.as_ref().unwrap().spent(&checks[0], now), 8_000);
    // The bucket (2,000 left) refuses 5,000: the budget (4,000 left) is
    // not charged either, and the bucket's hint (3 s) is later than...
    // no: the budget refuses too, and its reset is later.
    let d = call_state_reserve(&mut state, now, 5_000, &checks);
    assert_eq!(
        d,
        ReserveOutcome::Denied {
            denial: Denial::Limited {
                limit: Limit::BudgetDaily,
                retry_after_ms: DAY - 1_000,
            },
            shadow_reservation: None,
        }
    );
    assert_eq!(state.spend.as_ref().unwrap().spent(&checks[0], now), 8_000);
    // The bucket refuses 3,000 alone (the budget has 4,000 left): nothing
    // is charged to the budget.
    let d = call_state_reserve(&mut state, now, 3_000, &checks);
    assert_eq!(
        d,
        ReserveOutcome::Denied {
            denial: Denial::Limited {
                limit: Limit::TokenRate,
                retry_after_ms: 1_000,
            },
            shadow_reservation: None,
        }
    );
    assert_eq!(state.spend.as_ref().unwrap().spent(&checks[0], now), 8_000);
    // 10 s later the bucket is full again (10,000), the budget has 4,000:
    // 5,000 is refused by the budget alone, and the bucket keeps its level.
    let later = now + 10_000;
    let d = call_state_reserve(&mut state, later, 5_000, &checks);
    assert!(matches!(
        d,
        ReserveOutcome::Denied {
            denial: Denial::Limited {
                limit: Limit::BudgetDaily,
                ..
            },
            ..
        }
    ));
    assert!(matches!(
        call_state_reserve(&mut state, later, 4_000, &checks),
        ReserveOutcome::Granted { .. }
    ));
    assert_eq!(
        state.spend.as_ref().unwrap().spent(&checks[0], later),
        12_000
    );
}

#[test]
fn a_settle_closes_the_budget_charge_exactly_once() {
    let checks = [daily(BudgetUnit::Tokens, 100_000)];
    let mut state = CallState::default();
    let now = D0 + 1_000;
    let ReserveOutcome::Granted { reservation, .. } =
        call_state_reserve(&mut state, now, 6_000, &checks)
    else {
        panic!("granted");
    };
    let settle = |state: &mut CallState, r: &ReservationId, actual| {
        reserve::settle(
            state,
            now,
            &SettleRequest {
                user: "u",
                tokens: BucketSpec::new(1_000, 1_000, 10_000).unwrap(),
                reservation: r,
                actual,
                budget: Some(req(&checks, None)),
            },
        )
    };
    assert!(matches!(
        settle(&mut state, &reservation, Some(9_000)),
        SettleOutcome::Applied { .. }
    ));
    assert_eq!(state.spend.as_ref().unwrap().spent(&checks[0], now), 9_000);
    assert!(matches!(
        settle(&mut state, &reservation, Some(1)),
        SettleOutcome::AlreadyClosed { .. }
    ));
    assert!(matches!(
        settle(&mut state, &reservation, None),
        SettleOutcome::AlreadyClosed { .. }
    ));
    assert_eq!(state.spend.as_ref().unwrap().spent(&checks[0], now), 9_000);
}

#[test]
fn thresholds_are_exact_ceilings_up_to_2_pow_53() {
    for limit in [
        1,
        7,
        99,
        100,
        101,
        10_000,
        123_456_789,
        MAX_AMOUNT - 1,
        MAX_AMOUNT,
    ] {
        for pct in [1u8, 33, 50, 80, 99, 100] {
            let exact = (u128::from(limit) * u128::from(pct)).div_ceil(100);
            assert_eq!(
                u128::from(threshold(limit, pct)),
                exact,
                "{limit} × {pct} %"
            );
        }
    }
}

#[test]
fn crossings_name_their_period_and_threshold() {
    let c = Crossed((1 << 1) | (1 << 16));
    let got: Vec<_> = c.iter(&[80, 100]).collect();
    assert_eq!(got, [(Period::Daily, 100), (Period::Monthly, 80)]);
    assert!(Crossed::NONE.is_empty() && Crossed::NONE.iter(&[80]).next().is_none());
}

#[test]
fn top_up_ids_are_first_once_within_a_day() {
    let mut ids = TopUpIds::default();
    assert!(ids.first("a", D0));
    assert!(!ids.first("a", D0 + 1), "a repeat is not applied");
    assert!(ids.first("b", D0 + 2));
    assert_eq!(ids.expires_at(), D0 + 2 + TOP_UP_ID_RETENTION_MS);
    assert!(
        !ids.first("a", D0 + TOP_UP_ID_RETENTION_MS - 1),
        "remembered for the whole retention"
    );
    assert!(
        ids.first("a", D0 + TOP_UP_ID_RETENTION_MS),
        "forgotten once it passed"
    );
    assert!(!ids.first("b", D0 + TOP_UP_ID_RETENTION_MS));
}

#[test]
fn top_up_ids_forget_the_least_time_then_the_least_id() {
    let mut ids = TopUpIds::default();
    // Two at the first instant: "z" then "m"; the rest later.
    assert!(ids.first("z", D0));
    assert!(ids.first("m", D0));
    for i in 2..MAX_TOP_UP_IDS {
        assert!(ids.first(&format!("k{i}"), D0 + 1));
    }
    // One more: "m" (least id of the least time) goes, "z" stays.
    assert!(ids.first("new", D0 + 2));
    // m's return pushes out "z", now the oldest.
    assert!(ids.first("m", D0 + 3), "m was forgotten");
    assert!(ids.first("z", D0 + 4), "z was forgotten");
    assert!(!ids.first("new", D0 + 5), "newer ids are kept");
}
