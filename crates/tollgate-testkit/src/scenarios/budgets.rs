//! Spend budgets in the store: checked and charged with the
//! token take, moved by the settle at the reservation's price, given back
//! by a refund, refusing turns once spent, windows picked by the store's
//! clock.

use tollgate_core::calendar::{BudgetZone, Period};
use tollgate_core::money::{Price, TokenSplit};
use tollgate_core::spend::{
    BudgetAdjust, BudgetCheck, BudgetRequest, BudgetUnit, Crossed, SpentNow,
};
use tollgate_core::store::{
    ReservationId, ReserveOutcome, ReserveRequest, SettleOutcome, SettleRequest, TurnRequest,
};
use tollgate_core::{BucketSpec, Clock, Denial, FakeClock, Limit, Store};

use crate::T0;

/// T0 is 2023-11-14 22:13:20 UTC: the day ends at 2023-11-15 00:00 UTC,
/// the month at 2023-12-01 00:00.
const DAY_END: u64 = 1_700_006_400_000;
const MONTH_END: u64 = 1_701_388_800_000;

/// 10,000 tokens a day and $0.10 (100,000 micro-units) a month, in UTC, as
/// a caller at `now` names them.
fn checks(now: u64) -> Vec<BudgetCheck> {
    let utc = BudgetZone::new("UTC").expect("UTC");
    let check = |period, unit, limit| {
        let w = utc.windows(period, now).expect("in range");
        BudgetCheck {
            period,
            unit,
            limit,
            current: w.current,
            next: w.next,
            fallback: false,
        }
    };
    vec![
        check(Period::Daily, BudgetUnit::Tokens, 10_000),
        check(Period::Monthly, BudgetUnit::Cost, 100_000),
    ]
}

/// $3 per million input tokens, $15 per million output.
const PRICE: Price = Price {
    input: 3_000_000,
    output: 15_000_000,
    cached_input: 300_000,
};

/// The alert thresholds the scenarios pass: 50 % and 100 %.
const ALERTS: &[u8] = &[50, 100];

/// The crossing bit of the `i`-th alert of `period`.
fn bit(period: Period, i: usize) -> u32 {
    1 << (8 * period.index() + i)
}

/// Spent amounts, no top-ups.
fn spent(amounts: &[u64]) -> Vec<SpentNow> {
    let pairs: Vec<(u64, u64)> = amounts.iter().map(|a| (*a, 0)).collect();
    spent_granted(&pairs)
}

/// (spent, granted) per budget.
fn spent_granted(pairs: &[(u64, u64)]) -> Vec<SpentNow> {
    pairs
        .iter()
        .map(|&(spent, granted)| SpentNow { spent, granted })
        .collect()
}

fn tokens() -> BucketSpec {
    BucketSpec::new(1_000_000, 60_000, 1_000_000).expect("valid")
}

async fn reserve<S: Store>(
    store: &S,
    now: u64,
    estimate: u64,
    split: Option<TokenSplit>,
) -> ReserveOutcome {
    reserve_as(store, now, estimate, split, None).await
}

/// A reserve of u1's run whose caller names the budgets at `at` (its
/// clock), under `request_id`.
async fn reserve_as<S: Store>(
    store: &S,
    at: u64,
    estimate: u64,
    split: Option<TokenSplit>,
    request_id: Option<&str>,
) -> ReserveOutcome {
    let checks = checks(at);
    store
        .reserve_tokens(ReserveRequest {
            user: "u1",
            invocation_id: "run",
            tokens: tokens(),
            estimate,
            max_wait_ms: 0,
            max_llm_calls: 1_000,
            shadow: false,
            request_id,
            budget: Some(BudgetRequest {
                checks: &checks,
                price: Some(PRICE),
                split,
                alerts: ALERTS,
            }),
        })
        .await
        .expect("reserve")
}

async fn close<S: Store>(
    store: &S,
    now: u64,
    r: &ReservationId,
    actual: Option<u64>,
    split: Option<TokenSplit>,
) -> SettleOutcome {
    let checks = checks(now);
    store
        .settle(SettleRequest {
            user: "u1",
            tokens: tokens(),
            reservation: r,
            actual,
            budget: Some(BudgetRequest {
                checks: &checks,
                price: Some(PRICE),
                split,
                alerts: ALERTS,
            }),
        })
        .await
        .expect("settle")
}

async fn admit<S: Store>(store: &S, now: u64, invocation: &str) -> Option<Denial> {
    let checks = checks(now);
    let out = store
        .admit_turn(TurnRequest {
            user: "u1",
            invocation_id: invocation,
            params: tollgate_core::lease::TurnParams {
                turns: BucketSpec::new(100, 60_000, 100).expect("valid"),
                max_runs: 100,
                lease_ttl_ms: 60_000,
                concurrency_retry_ms: 1_000,
            },
            budgets: &checks,
        })
        .await
        .expect("admit");
    match out.admit {
        tollgate_core::lease::Admit::Admitted { .. } => None,
        tollgate_core::lease::Admit::Denied(d) => Some(d),
    }
}

fn granted(o: ReserveOutcome) -> ReservationId {
    match o {
        ReserveOutcome::Granted { reservation, .. } => reservation,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn limited(limit: Limit, retry_after_ms: u64) -> Denial {
    Denial::Limited {
        limit,
        retry_after_ms,
    }
}

/// The day's tokens and the month's money, to the unit: a reserve charges
/// both (unsplit tokens at the output price), is refused whole when either
/// would go over (nothing charged), a settle moves both by the real usage
/// at the reservation's price, a refund gives back, a spent budget refuses
/// turns until its window ends, and the store's clock picks the window.
pub async fn budgets_charge_and_refuse<S: Store + Clone>(store: S, clock: FakeClock) {
    assert_eq!(clock.now_ms(), T0);
    // Ten minutes before midnight (run records live an hour).
    let now = DAY_END - 600_000;
    clock.set(now);
    // 4,000 tokens unsplit: 4,000 of the day, 4,000 × $15/M = 60,000 µ.
    let a = granted(reserve(&store, now, 4_000, None).await);
    // 3,000 more: 7,000 tokens fit the day, but 105,000 µ > 100,000 for
    // the month, so nothing is taken; the month resets latest.
    assert_eq!(
        reserve(&store, now, 3_000, None).await,
        ReserveOutcome::Denied {
            denial: limited(Limit::BudgetMonthly, MONTH_END - now),
            shadow_reservation: None,
        }
    );
    // Settled with 3,000 input + 500 output: the day 3,500 tokens, the
    // month 9,000 + 7,500 = 16,500 µ.
    assert!(matches!(
        close(
            &store,
            now,
            &a,
            Some(3_500),
            Some(TokenSplit::new(3_000, 500, 0))
        )
        .await,
        SettleOutcome::Applied { .. }
    ));
    // 2,000 input + 1,000 output: 21,000 µ (month 37,500), day 6,500;
    // refunded: back to 16,500 and 3,500.
    let b = granted(reserve(&store, now, 3_000, Some(TokenSplit::new(2_000, 1_000, 0))).await);
    assert!(matches!(
        close(&store, now, &b, None, None).await,
        SettleOutcome::Applied { .. }
    ));
    assert_eq!(admit(&store, now, "t1").await, None, "nothing spent yet");
    // 6,500 input tokens: the day exactly full (10,000), 19,500 µ (month
    // 36,000).
    let _c = granted(reserve(&store, now, 6_500, Some(TokenSplit::new(6_500, 0, 0))).await);
    assert_eq!(
        store
            .budget_spent("u1", &checks(now), None)
            .await
            .expect("read"),
        spent(&[10_000, 36_000]),
        "the day full, the month 16,500 + 19,500 µ"
    );
    assert_eq!(
        reserve(&store, now, 1, None).await,
        ReserveOutcome::Denied {
            denial: limited(Limit::BudgetDaily, DAY_END - now),
            shadow_reservation: None,
        },
        "the day is spent"
    );
    assert_eq!(
        admit(&store, now, "t2").await,
        Some(limited(Limit::BudgetDaily, DAY_END - now)),
        "a spent budget refuses the turn"
    );
    // More than a whole budget never fits.
    assert_eq!(
        reserve(&store, now, 10_001, Some(TokenSplit::new(10_001, 0, 0))).await,
        ReserveOutcome::Denied {
            denial: Denial::ExceedsCapacity {
                limit: Limit::BudgetDaily,
                cost: 10_001,
                max_cost: 10_000,
            },
            shadow_reservation: None,
        }
    );

    // A caller whose clock still reads the last ms of the day while the
    // store's reads midnight: the store charges the new day.
    let stale = DAY_END - 1;
    clock.set(DAY_END);
    let _d = granted(
        reserve_as(
            &store,
            stale,
            9_000,
            Some(TokenSplit::new(9_000, 0, 0)),
            None,
        )
        .await,
    );
    // The new day holds 9,000: 1,001 more is refused until the next
    // midnight; 1,000 fits.
    let now = clock.now_ms();
    assert_eq!(
        reserve(&store, now, 1_001, Some(TokenSplit::new(1_001, 0, 0))).await,
        ReserveOutcome::Denied {
            denial: limited(Limit::BudgetDaily, 86_400_000),
            shadow_reservation: None,
        }
    );
    assert_eq!(admit(&store, now, "t3").await, None);
    // A reservation of the day before, settled today, charges today its
    // actual usage: call 3 (6,500 input yesterday) settled at 2,000 makes
    // today 11,000, so the day is spent again.
    assert!(matches!(
        close(
            &store,
            now,
            &ReservationId::new("run", 3),
            Some(2_000),
            None
        )
        .await,
        SettleOutcome::Applied { .. }
    ));
    assert_eq!(
        admit(&store, now, "t4").await,
        Some(limited(Limit::BudgetDaily, 86_400_000))
    );
    // Today 9,000 + 2,000 tokens; the month 36,000 + 27,000 (call 4: 9,000
    // input) + 30,000 − 19,500 (call 3 settled at its kept price, 2,000
    // unsplit at the output price, in its own month) = 73,500 µ.
    assert_eq!(
        store
            .budget_spent("u1", &checks(now), None)
            .await
            .expect("read"),
        spent(&[11_000, 73_500])
    );
    assert_eq!(
        store
            .budget_spent("nobody", &checks(now), None)
            .await
            .expect("read"),
        spent(&[0, 0])
    );
}

/// Alert thresholds are crossed once per window, by the peak spend (a
/// refund does not let the same threshold be crossed again); a top-up
/// raises one window's limit (and the thresholds with it) and is gone
/// with the window; a reset starts the window afresh. To the unit.
pub async fn budgets_top_up_reset_and_alerts<S: Store + Clone>(store: S, clock: FakeClock) {
    let now = DAY_END - 600_000;
    clock.set(now);
    let crossed = |o: &ReserveOutcome| match o {
        ReserveOutcome::Granted { crossed, .. } => *crossed,
        other => panic!("expected a grant, got {other:?}"),
    };
    // 4,000 tokens unsplit: the day at 40 %, the month at 60,000 µ (60 %:
    // past 50 %).
    let a = reserve(&store, now, 4_000, None).await;
    assert_eq!(crossed(&a), Crossed(bit(Period::Monthly, 0)));
    // 1,000 input tokens: the day at 50 % exactly (crossed), the month
    // 63,000 µ (nothing new).
    let b = reserve(&store, now, 1_000, Some(TokenSplit::new(1_000, 0, 0))).await;
    assert_eq!(crossed(&b), Crossed(bit(Period::Daily, 0)));
    // Refunded: the day back to 40 %; 1,000 more brings it to 50 % again,
    // which is not a new crossing.
    let b = granted(b);
    assert!(matches!(
        close(&store, now, &b, None, None).await,
        SettleOutcome::Applied {
            crossed: Crossed(0),
            ..
        }
    ));
    let c = reserve(&store, now, 1_000, Some(TokenSplit::new(1_000, 0, 0))).await;
    assert_eq!(
        crossed(&c),
        Crossed::NONE,
        "50 % of the day was reached before"
    );
    // A settle that crosses: call 1 (4,000 estimated) settles at 9,000
    // tokens, 3,000 output: the day 10,000 (100 %), the month 3,000 (the
    // second call) + 45,000 + 6,000 x 3 ... exactly: 6,000 input x 3 +
    // 3,000 output x 15 = 63,000 µ, so 3,000 + 63,000 = 66,000 µ.
    assert_eq!(
        close(
            &store,
            now,
            &granted(a),
            Some(9_000),
            Some(TokenSplit::new(6_000, 3_000, 0))
        )
        .await,
        SettleOutcome::Applied {
            balance: 1_000_000 - 10_000,
            crossed: Crossed(bit(Period::Daily, 1)),
        }
    );
    let read = |adjust| {
        let store = store.clone();
        async move {
            store
                .budget_spent("u1", &checks(now), adjust)
                .await
                .expect("budget_spent")
        }
    };
    assert_eq!(read(None).await, spent(&[10_000, 66_000]));
    assert_eq!(
        reserve(&store, now, 1, None).await,
        ReserveOutcome::Denied {
            denial: limited(Limit::BudgetDaily, DAY_END - now),
            shadow_reservation: None,
        }
    );
    assert_eq!(
        admit(&store, now, "t1").await,
        Some(limited(Limit::BudgetDaily, DAY_END - now))
    );
    // A top-up of 5,000 tokens for today: the limit is 15,000, so 5,000
    // fits, and 100 % of the raised limit is crossed when it is reached.
    // Its repeat (a retry after a lost answer, same request id) grants
    // nothing more.
    let top_up = |request_id| {
        Some((
            Period::Daily,
            BudgetAdjust::TopUp {
                amount: 5_000,
                request_id,
            },
        ))
    };
    for _ in 0..2 {
        assert_eq!(
            read(top_up(Some("top-up-1"))).await,
            spent_granted(&[(10_000, 5_000), (66_000, 0)]),
            "a top-up's repeat grants once"
        );
    }
    assert_eq!(
        admit(&store, now, "t2").await,
        None,
        "the top-up lets turns in"
    );
    let d = reserve(&store, now, 5_000, Some(TokenSplit::new(5_000, 0, 0))).await;
    assert_eq!(crossed(&d), Crossed(bit(Period::Daily, 1)));
    assert_eq!(
        reserve(&store, now, 15_001, Some(TokenSplit::new(15_001, 0, 0))).await,
        ReserveOutcome::Denied {
            denial: Denial::ExceedsCapacity {
                limit: Limit::BudgetDaily,
                cost: 15_001,
                max_cost: 15_000,
            },
            shadow_reservation: None,
        },
        "a whole budget is the limit with the window's top-ups"
    );
    // A reset of the month: nothing spent in it, no top-up; its 50 % is
    // crossed anew.
    assert_eq!(
        read(Some((Period::Monthly, BudgetAdjust::Reset))).await,
        spent_granted(&[(15_000, 5_000), (0, 0)])
    );
    // The reservations made before the reset close, in the month, as ones
    // of an ended window: d's refund gives the day its 5,000 back and the
    // month nothing; c's settle (1,000 input tokens, as estimated) moves
    // the day by nothing and charges the month its whole cost, 3,000 µ.
    assert!(matches!(
        close(&store, now, &granted(d), None, None).await,
        SettleOutcome::Applied { .. }
    ));
    assert!(matches!(
        close(
            &store,
            now,
            &granted(c),
            Some(1_000),
            Some(TokenSplit::new(1_000, 0, 0))
        )
        .await,
        SettleOutcome::Applied { .. }
    ));
    assert_eq!(
        read(None).await,
        spent_granted(&[(10_000, 5_000), (3_000, 0)])
    );
    // The next day: the top-up is gone with its window.
    clock.set(DAY_END);
    let next = DAY_END;
    let e = reserve(&store, next, 5_000, Some(TokenSplit::new(5_000, 0, 0))).await;
    assert_eq!(
        crossed(&e),
        Crossed(bit(Period::Daily, 0)),
        "18,000 µ of the month is under 50 %; 5,000 is 50 % of the new day"
    );
    assert_eq!(
        store
            .budget_spent("u1", &checks(next), None)
            .await
            .expect("read"),
        spent(&[5_000, 18_000])
    );
    let f = reserve(&store, next, 5_001, Some(TokenSplit::new(5_001, 0, 0))).await;
    assert!(
        matches!(
            f,
            ReserveOutcome::Denied {
                denial: Denial::Limited {
                    limit: Limit::BudgetDaily,
                    ..
                },
                ..
            }
        ),
        "{f:?}"
    );
}

/// Reconciliation and budgets (SPEC §6): an ambiguous reserve the store
/// did run gives its budget charges back with its tokens (the fallback's
/// charges replace them), and the fallback's net budget charges are added
/// to each window that has not ended; one that has is dropped.
pub async fn reconcile_charges_budgets<S: Store + Clone>(store: S, clock: FakeClock) {
    use tollgate_core::calendar::Window;
    use tollgate_core::store::{BudgetNet, ReconcileRequest};
    let now = DAY_END - 600_000;
    clock.set(now);
    let c = checks(now);
    // Sent, answered here, but the answer was lost: 4,000 tokens (the day)
    // and 60,000 µ (the month, unsplit at the output price).
    let _ = granted(reserve_as(&store, now, 4_000, None, Some("lost")).await);
    assert_eq!(
        store.budget_spent("u1", &c, None).await.expect("read"),
        spent(&[4_000, 60_000])
    );
    let day = c[0].current;
    let month = c[1].current;
    let yesterday = Window {
        start_ms: day.start_ms - 86_400_000,
        end_ms: day.start_ms,
    };
    let r = store
        .reconcile(ReconcileRequest {
            user: "u1",
            turns: BucketSpec::new(100, 60_000, 100).expect("valid"),
            tokens: tokens(),
            turns_taken: 0,
            tokens_net: 1_500,
            ambiguous_reserves: &[("run", "lost")],
            ambiguous_admissions: &[],
            budgets: &[
                BudgetNet {
                    period: Period::Daily,
                    unit: BudgetUnit::Tokens,
                    window: day,
                    delta: 1_500,
                },
                BudgetNet {
                    period: Period::Daily,
                    unit: BudgetUnit::Tokens,
                    window: yesterday,
                    delta: 999,
                },
                BudgetNet {
                    period: Period::Monthly,
                    unit: BudgetUnit::Cost,
                    window: month,
                    delta: 22_500,
                },
            ],
            replica: 3,
            batch: 1,
        })
        .await
        .expect("reconcile");
    assert_eq!(r.refunded, 1);
    assert_eq!(
        store.budget_spent("u1", &c, None).await.expect("read"),
        spent(&[1_500, 22_500]),
        "the lost reserve's charges given back, the fallback's added, yesterday's dropped"
    );
}

/// Budget windows are calendar windows in the configured zone, through the
/// `Limiter` on the store's clock: in New York, a day of 23 hours (DST
/// starts on 14 March 2027) and one of 25 (it ends on 7 November), the
/// last millisecond of a 31-day March and the 30-day April after it, and 29
/// February 2028. 5,000 tokens a day, 10,000 a month.
pub async fn budget_windows_follow_the_calendar<S: Store + Clone>(store: S, clock: FakeClock) {
    use tollgate_core::budget::{BudgetAmountConfig, BudgetSettingsConfig, BudgetsConfig};
    use tollgate_core::limiter::Reserve;
    use tollgate_core::{Decision, Limiter};

    const H: u64 = 3_600_000;
    // 00:00 in New York (ms since the epoch).
    const MAR_14: u64 = 1_805_000_400_000;
    const MAR_15: u64 = MAR_14 + 23 * H;
    const APR_1: u64 = 1_806_552_000_000;
    const MAY_1: u64 = 1_809_144_000_000;
    const NOV_7: u64 = 1_825_560_000_000;
    const FEB_29: u64 = 1_835_413_200_000;
    const MAR_1_2028: u64 = 1_835_499_600_000;

    let mut plan = super::support();
    plan.tokens = tollgate_core::RateConfig {
        amount: 10_000_000,
        period_ms: 60_000,
        burst: Some(10_000_000),
    };
    plan.max_wait_ms = 0;
    let tokens = |n| BudgetAmountConfig {
        tokens: Some(n),
        cost: None,
    };
    plan.budgets = Some(BudgetsConfig {
        daily: Some(tokens(5_000)),
        monthly: Some(tokens(10_000)),
        ..BudgetsConfig::default()
    });
    let mut cfg = tollgate_core::PlansConfig {
        default_plan: Some("p".into()),
        budgets: BudgetSettingsConfig {
            time_zone: Some("America/New_York".into()),
            alert_percent: None,
        },
        ..tollgate_core::PlansConfig::default()
    };
    cfg.plans.insert("p".into(), plan);
    let l = Limiter::new(store, clock.clone(), cfg.validate().expect("valid plan"))
        .with_refusal_cache(0);
    let reserve = |estimate: u64| {
        let l = &l;
        async move {
            match l
                .reserve(
                    "nyc",
                    Reserve {
                        invocation_id: crate::id("run"),
                        estimate,
                        request_id: None,
                        wait: false,
                        model: None,
                        split: None,
                    },
                )
                .await
                .expect("reserve")
            {
                Decision::Allowed { .. } => None,
                Decision::Denied(d) => Some(d),
            }
        }
    };
    let at = |t: u64| {
        clock.set(t);
    };
    // The day DST starts lasts 23 hours.
    at(MAR_14);
    assert_eq!(reserve(5_000).await, None);
    assert_eq!(reserve(1).await, Some(limited(Limit::BudgetDaily, 23 * H)));
    // Its last millisecond, then the next day.
    at(MAR_15 - 1);
    assert_eq!(reserve(1).await, Some(limited(Limit::BudgetDaily, 1)));
    at(MAR_15);
    assert_eq!(reserve(5_000).await, None);
    // The month's 10,000 are spent: refused until 1 April, the later reset.
    assert_eq!(
        reserve(1).await,
        Some(limited(Limit::BudgetMonthly, APR_1 - MAR_15))
    );
    // The last millisecond of March (31 days, one of them 23 hours long).
    assert_eq!(APR_1 - 1_803_877_200_000, 31 * 24 * H - H);
    at(APR_1 - 1);
    assert_eq!(reserve(1).await, Some(limited(Limit::BudgetMonthly, 1)));
    at(APR_1);
    assert_eq!(reserve(5_000).await, None);
    let view: Vec<_> = l
        .budgets("nyc")
        .await
        .expect("budgets")
        .iter()
        .map(|b| (b.period, b.spent, b.resets_at_ms))
        .collect();
    assert_eq!(
        view,
        [
            (Period::Daily, 5_000, APR_1 + 24 * H),
            (Period::Monthly, 5_000, MAY_1)
        ],
        "April has 30 days"
    );
    assert_eq!(MAY_1 - APR_1, 30 * 24 * H);
    // The day DST ends lasts 25 hours.
    at(NOV_7);
    assert_eq!(reserve(5_000).await, None);
    assert_eq!(reserve(1).await, Some(limited(Limit::BudgetDaily, 25 * H)));
    // 29 February 2028: a day of its own, the last of the month.
    at(FEB_29);
    assert_eq!(reserve(5_000).await, None);
    let view: Vec<_> = l
        .budgets("nyc")
        .await
        .expect("budgets")
        .iter()
        .map(|b| (b.spent, b.resets_at_ms))
        .collect();
    assert_eq!(view, [(5_000, MAR_1_2028), (5_000, MAR_1_2028)]);
    at(MAR_1_2028 - 1);
    assert_eq!(reserve(1).await, Some(limited(Limit::BudgetDaily, 1)));
    at(MAR_1_2028);
    assert_eq!(reserve(5_000).await, None);
}

/// Plan "pro" of the budget example (docs/spec.md §7, example 5): a
/// generous token rate, 2,000,000 tokens a day and $50.00 a month (UTC),
/// `openai:gpt-4o` at $2.50 / $10.00 / $1.25 per million input / output /
/// cached input tokens.
fn pro(store_clock: &FakeClock) -> (tollgate_core::PlansConfig, FakeClock) {
    use tollgate_core::budget::{BudgetAmountConfig, BudgetsConfig};
    use tollgate_core::money::PriceConfig;
    let mut plan = super::support();
    plan.tokens = tollgate_core::RateConfig {
        amount: 10_000_000,
        period_ms: 60_000,
        burst: Some(10_000_000),
    };
    plan.max_wait_ms = 0;
    plan.budgets = Some(BudgetsConfig {
        daily: Some(BudgetAmountConfig {
            tokens: Some(2_000_000),
            cost: None,
        }),
        monthly: Some(BudgetAmountConfig {
            tokens: None,
            cost: Some("50.00".into()),
        }),
        ..BudgetsConfig::default()
    });
    let mut cfg = tollgate_core::PlansConfig {
        default_plan: Some("pro".into()),
        currency: Some("USD".into()),
        ..tollgate_core::PlansConfig::default()
    };
    cfg.plans.insert("pro".into(), plan);
    cfg.prices.insert(
        "openai:gpt-4o".into(),
        PriceConfig {
            input: "2.50".into(),
            output: "10.00".into(),
            cached_input: Some("1.25".into()),
        },
    );
    (cfg, store_clock.clone())
}

/// SPEC §7 example 5: $50 a month and 2,000,000 tokens a day, the day that
/// crosses the month's budget, to the micro-unit.
pub async fn example_5_budgets<S: Store + Clone>(store: S, clock: FakeClock) {
    use tollgate_core::limiter::{ModelRef, Reserve};
    use tollgate_core::{Decision, Limiter, LimiterError};

    let gpt_4o = ModelRef {
        provider: crate::id("openai"),
        model: crate::id("gpt-4o"),
    };
    let (cfg, clock) = pro(&clock);
    let l = Limiter::new(store, clock.clone(), cfg.validate().expect("valid plan"))
        .with_refusal_cache(0);
    let reserve = |inv: &'static str, estimate: u64, split: Option<(u64, u64, u64)>| {
        let l = &l;
        async move {
            l.reserve(
                "alice",
                Reserve {
                    invocation_id: crate::id(inv),
                    estimate,
                    request_id: None,
                    wait: false,
                    model: Some(gpt_4o),
                    split: split.map(|(i, o, c)| TokenSplit::new(i, o, c)),
                },
            )
            .await
            .expect("reserve")
        }
    };
    let id = |d: Decision<tollgate_core::limiter::Reservation>| match d {
        Decision::Allowed { grant, .. } => grant.id,
        other => panic!("expected a grant, got {other:?}"),
    };
    let denied = |d: Decision<tollgate_core::limiter::Reservation>| match d {
        Decision::Denied(Denial::Limited {
            limit,
            retry_after_ms,
        }) => (limit, retry_after_ms),
        other => panic!("expected a budget refusal, got {other:?}"),
    };
    let settle = |r: ReservationId, actual: u64, split: Option<(u64, u64, u64)>| {
        let l = &l;
        async move {
            let s = l
                .settle_split(
                    "alice",
                    &r,
                    actual,
                    split.map(|(i, o, c)| TokenSplit::new(i, o, c)),
                )
                .await
                .expect("settle");
            assert!(s.applied);
        }
    };
    // 09:00 UTC: midnight is 15 h away.
    const TO_MIDNIGHT: u64 = 54_000_000;

    // 1 and 2 March: each day 400,000 input + 1,600,000 output tokens,
    // $1.00 + $16.00 = $17.00, the day's 2,000,000 tokens exactly.
    for (day, at) in [("1", 1_803_891_600_000u64), ("2", 1_803_978_000_000)] {
        clock.set(at);
        let r = id(reserve(
            if day == "1" { "d1" } else { "d2" },
            2_000_000,
            Some((400_000, 1_600_000, 0)),
        )
        .await);
        settle(r, 2_000_000, Some((400_000, 1_600_000, 0))).await;
        assert_eq!(
            denied(reserve("more", 1, None).await),
            (Limit::BudgetDaily, TO_MIDNIGHT),
            "day {day}: the 2,000,001st token"
        );
    }
    // 3 March: the month holds $34.00.
    clock.set(1_804_064_400_000);
    // A: 100,000 in + 400,000 out = $4.25 (month $38.25, day 500,000),
    // settled at 100,000 + 350,000 = $3.75 (month $37.75, day 450,000).
    let a = id(reserve("a", 500_000, Some((100_000, 400_000, 0))).await);
    settle(a, 450_000, Some((100_000, 350_000, 0))).await;
    // B: 1,000,000 unsplit, at the output price: $10.00 (month $47.75, day
    // 1,450,000), settled as 200,000 in + 500,000 out + 300,000 cached =
    // $0.50 + $5.00 + $0.375 = $5.875 (month $43.625; the day unchanged).
    let b = id(reserve("b", 1_000_000, None).await);
    settle(b, 1_000_000, Some((200_000, 500_000, 300_000))).await;
    // C: 600,000 would fit the month ($49.625) but not the day (2,050,000).
    assert_eq!(
        denied(reserve("c", 600_000, None).await),
        (Limit::BudgetDaily, TO_MIDNIGHT)
    );
    // D: 50,000 in + 500,000 out = $5.125: the day exactly full, the month
    // $48.75.
    let d = id(reserve("d", 550_000, Some((50_000, 500_000, 0))).await);
    settle(d, 550_000, Some((50_000, 500_000, 0))).await;
    assert_eq!(
        denied(reserve("e", 1, None).await),
        (Limit::BudgetDaily, TO_MIDNIGHT)
    );
    // Turns are still admitted (on_exhausted = "deny_model_calls").
    assert!(matches!(
        l.admit_turn("alice", "turn").await.expect("admit"),
        Decision::Allowed { .. }
    ));
    // 4 March, 09:00: a new day, the month's last $1.25.
    clock.set(1_804_150_800_000);
    const TO_APRIL: u64 = 1_806_537_600_000 - 1_804_150_800_000;
    // F: 200,000 unsplit = $2.00: past $50.00 until 1 April.
    assert_eq!(
        denied(reserve("f", 200_000, None).await),
        (Limit::BudgetMonthly, TO_APRIL)
    );
    // G: $1.00 (month $49.75). H: 25,001 tokens = $0.25001, refused; I:
    // 25,000 = $0.25, the month exactly $50.00.
    let g = id(reserve("g", 100_000, None).await);
    settle(g, 100_000, None).await;
    assert_eq!(
        denied(reserve("h", 25_001, None).await),
        (Limit::BudgetMonthly, TO_APRIL)
    );
    let _i = id(reserve("i", 25_000, None).await);
    assert_eq!(
        denied(reserve("j", 1, None).await),
        (Limit::BudgetMonthly, TO_APRIL)
    );
    // The user's budgets now: the day 100,000 + 25,000 tokens of 2,000,000
    // (resets at 5 March 00:00), the month exactly $50.00 (1 April).
    use tollgate_core::limiter::BudgetStatus;
    assert_eq!(
        l.budgets("alice").await.expect("budgets"),
        vec![
            BudgetStatus {
                granted: 0,
                period: Period::Daily,
                unit: BudgetUnit::Tokens,
                limit: 2_000_000,
                spent: 125_000,
                resets_at_ms: 1_804_204_800_000,
            },
            BudgetStatus {
                granted: 0,
                period: Period::Monthly,
                unit: BudgetUnit::Cost,
                limit: 50_000_000,
                spent: 50_000_000,
                resets_at_ms: 1_806_537_600_000,
            },
        ]
    );
    // A model with no price, and no default_price: cannot be charged.
    let e = l
        .reserve(
            "alice",
            Reserve {
                invocation_id: crate::id("k"),
                estimate: 1,
                request_id: None,
                wait: false,
                model: Some(ModelRef {
                    provider: crate::id("openai"),
                    model: crate::id("unpriced"),
                }),
                split: None,
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, LimiterError::InvalidRequest { field, .. } if *field == "model"),
        "{e:?}"
    );
}
