//! The admission plugin's hooks driven directly (the runner-level tests,
//! SPEC §7 examples 1–4 as real turns, are in `turns.rs`).

use std::sync::Arc;

use adk_core::Part;
use tollgate_adk::AdmissionPlugin;
use tollgate_core::MemoryStore;
use tollgate_testkit::scenarios::{limiter_with, support};

/// The plugin's hooks driven directly: `after_run` of a denied turn
/// releases nothing and does not panic; a second release is a no-op.
#[tokio::test]
async fn release_tolerates_denied_and_repeated_turns() {
    let clock = tollgate_testkit::clock();
    let limiter = Arc::new(limiter_with(
        MemoryStore::new(clock.clone()),
        &clock,
        support(),
    ));
    let plugin = AdmissionPlugin::new(Arc::clone(&limiter));
    assert!(plugin.admit("u1", "r1").await.is_none());
    assert!(plugin.admit("u1", "r2").await.is_none());
    let denied = plugin.admit("u1", "r3").await.expect("denied");
    assert_eq!(denied.role, "model");
    assert!(
        !plugin.release("u1", "r3").await,
        "a denied turn holds no lease"
    );
    assert!(plugin.release("u1", "r1").await);
    assert!(
        !plugin.release("u1", "r1").await,
        "second release is a no-op"
    );
    assert!(!plugin.release("u1", "never-admitted").await);
    assert!(
        plugin.admit("u1", "r3").await.is_none(),
        "a slot is free again"
    );
}

/// A limiter error (here: an invalid, empty invocation id) denies the turn
/// with the plain "temporarily unavailable" text.
#[tokio::test]
async fn limiter_error_denies_with_unavailable() {
    let clock = tollgate_testkit::clock();
    let limiter = Arc::new(limiter_with(
        MemoryStore::new(clock.clone()),
        &clock,
        support(),
    ));
    let plugin = AdmissionPlugin::new(limiter);
    let content = plugin.admit("u1", "").await.expect("denied");
    let text = match &content.parts[..] {
        [Part::Text { text }] => text.clone(),
        other => panic!("one text part expected, got {other:?}"),
    };
    assert_eq!(text, tollgate_adk::UNAVAILABLE_MESSAGE);
    assert!(!plugin.release("u1", "").await);
}

/// Shadow mode: a turn that enforcement would deny proceeds.
#[tokio::test]
async fn shadow_denied_turns_proceed() {
    let clock = tollgate_testkit::clock();
    let mut plan = support();
    plan.shadow = true;
    plan.concurrent_runs = 1;
    let limiter = Arc::new(limiter_with(MemoryStore::new(clock.clone()), &clock, plan));
    let plugin = AdmissionPlugin::new(limiter);
    assert!(plugin.admit("u1", "r1").await.is_none());
    assert!(plugin.admit("u1", "r2").await.is_none(), "shadow: proceeds");
}
