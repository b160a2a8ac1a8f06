//! One request decides with one config: a reload that lands
//! in the middle of a request — here, just before the request's store call,
//! through a store that runs the reload there — changes nothing of that
//! request. Its decision, its charge, its answer and its metrics all follow
//! the plans it started with; the next request follows the new ones.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use tollgate_core::budget::BudgetAmount;
use tollgate_core::{FakeClock, Limiter, MemoryStore, PlanBook};
use tollgate_server::config::Config;
use tollgate_server::identity::Verifier;
use tollgate_server::ops::{self, AdmitRequest, ReserveRequest};
use tollgate_server::state::App;
use tollgate_testkit::T0;
use tollgate_testkit::faulty::{Faulty, Hook};

type Store = Faulty<MemoryStore>;

/// Two configs that differ in everything a request reads: the plan's
/// name, its lease TTL and estimate, and the model's price.
fn config(plan: &str, lease_ttl_ms: u64, estimate: u64, output_price: &str) -> Config {
    let text = format!(
        r#"listen = "127.0.0.1:0"
default_plan = "{plan}"
currency = "USD"

[identity]
mode = "dev"

[prices."openai:gpt-4o"]
input = "1.00"
output = "{output_price}"

[plans.{plan}]
turns = {{ amount = 100, period_ms = 3600000 }}
tokens = {{ amount = 1000000, period_ms = 3600000 }}
concurrent_runs = 10
lease_ttl_ms = {lease_ttl_ms}
estimate_tokens = {estimate}
max_wait_ms = 0

[plans.{plan}.budgets]
daily = {{ cost = "100.00" }}
"#
    );
    Config::parse(&text, "t.toml", Path::new(".")).expect("a valid config")
}

fn old() -> Config {
    config("old", 60_000, 1_000, "10.00")
}

fn new() -> Config {
    config("new", 5_000, 2_000, "20.00")
}

/// An application whose store reloads `new()` just before its `at`th call.
fn app_reloading_at(at: usize) -> (App<Store>, FakeClock) {
    let clock = FakeClock::new(T0);
    let app_cell: Arc<OnceLock<App<Store>>> = Arc::default();
    let hook: Hook = {
        let app_cell = Arc::clone(&app_cell);
        Arc::new(move || {
            let app = app_cell.get().expect("the app is built").clone();
            Box::pin(async move {
                let book: PlanBook = new().plans;
                app.limiter().set_plans(book);
            })
        })
    };
    let store = Faulty::interleaved(MemoryStore::new(clock.clone()), at, hook);
    let cfg = old();
    let verifier =
        Verifier::from_config(&cfg.identity, &cfg.base_dir, Arc::new(clock.clone())).unwrap();
    let app = App::new(
        Limiter::new(store, clock.clone(), cfg.plans),
        verifier,
        16,
        None,
    );
    assert!(app_cell.set(app.clone()).is_ok());
    (app, clock)
}

fn user() -> tollgate_core::Id<'static> {
    tollgate_testkit::id("u1")
}

/// `tollgate_decisions_total` samples of operation `op`, by plan label.
fn decisions(app: &App<Store>, op: &str) -> Vec<String> {
    app.metrics()
        .encode()
        .lines()
        .filter(|l| {
            l.starts_with("tollgate_decisions_total{") && l.contains(&format!("op=\"{op}\""))
        })
        .map(|l| {
            let plan = l.split("plan=\"").nth(1).and_then(|r| r.split('"').next());
            format!(
                "{} {}",
                plan.unwrap_or("?"),
                l.rsplit(' ').next().unwrap_or("?")
            )
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[tokio::test]
async fn a_reload_during_an_admission_changes_nothing_of_it() {
    // With a session, the first store call is the session count; the
    // reload lands there, after the request read its plan and before the
    // session lease, the turn and the answer.
    let (app, _clock) = app_reloading_at(1);
    let answer = ops::admit_run(
        &app,
        user(),
        serde_json::from_value::<AdmitRequest>(
            serde_json::json!({"invocation_id": "inv-1", "session_id": "chat"}),
        )
        .unwrap(),
    )
    .await
    .expect("admitted")
    .value;
    assert!(app.store().fired(), "the reload ran mid-request");
    assert_eq!(
        app.limiter().plans().resolve("u1").unwrap().name.as_ref(),
        "new"
    );

    // The decision: the lease the store granted is the old plan's TTL.
    assert_eq!(answer.lease_expires_at_ms, T0 + 60_000);
    // The answer: the old plan's fields.
    assert_eq!(answer.lease_ttl_ms, 60_000);
    assert_eq!(answer.estimate_tokens, 1_000);
    // The metrics: both decisions of the request counted under the old plan.
    assert_eq!(decisions(&app, "session"), ["old 1"]);
    assert_eq!(decisions(&app, "admit"), ["old 1"]);

    // The next request follows the new plan.
    let next = ops::admit_run(
        &app,
        user(),
        serde_json::from_value::<AdmitRequest>(serde_json::json!({"invocation_id": "inv-2"}))
            .unwrap(),
    )
    .await
    .expect("admitted")
    .value;
    assert_eq!(
        (
            next.lease_expires_at_ms,
            next.lease_ttl_ms,
            next.estimate_tokens
        ),
        (T0 + 5_000, 5_000, 2_000)
    );
    assert_eq!(decisions(&app, "admit"), ["new 1", "old 1"]);
}

#[tokio::test]
async fn a_reload_during_a_reservation_changes_nothing_of_it() {
    // Without a wait, the reservation's first store call is the
    // reservation itself; the reload lands just before it.
    let (app, _clock) = app_reloading_at(1);
    let reserve = |inv: &str| {
        serde_json::from_value::<ReserveRequest>(serde_json::json!({
            "invocation_id": inv, "estimate": 1_000, "model": "openai:gpt-4o"
        }))
        .unwrap()
    };
    let granted = ops::reserve_tokens(&app, user(), reserve("inv-1"))
        .await
        .expect("reserved")
        .value;
    assert!(app.store().fired(), "the reload ran mid-request");
    assert_eq!(granted.wait_ms, 0);
    assert_eq!(decisions(&app, "reserve"), ["old 1"]);

    // The charge: 1,000 tokens at the old price of output, $10 per
    // million, is $0.01 (10,000 micro-units), not the new price's $0.02.
    let spent = |budgets: Vec<tollgate_core::limiter::BudgetStatus>| budgets[0].spent;
    assert_eq!(spent(app.limiter().budgets("u1").await.unwrap()), 10_000);

    // The next reservation is priced by the new config.
    ops::reserve_tokens(&app, user(), reserve("inv-2"))
        .await
        .expect("reserved");
    assert_eq!(spent(app.limiter().budgets("u1").await.unwrap()), 30_000);
    assert_eq!(decisions(&app, "reserve"), ["new 1", "old 1"]);
    let plan = app.limiter().plans();
    let daily = plan.resolve("u1").unwrap().budgets.as_ref().unwrap();
    assert!(matches!(
        daily.iter().next().map(|(_, a)| a),
        Some(BudgetAmount::Cost(100_000_000))
    ));
}
