//! The one id rule (SPEC §6, `tollgate_core::id`) holds at the `Limiter`,
//! so the tower layer and the adk crate refuse what the sidecar refuses.

use tollgate_core::id::MAX_ID_LEN;
use tollgate_core::{FakeClock, Limiter, LimiterError, MemoryStore, PlansConfig};

fn limiter() -> Limiter<MemoryStore> {
    let cfg: PlansConfig = serde_json::from_str(
        r#"{ "default_plan": "p", "plans": { "p": {
            "turns": { "amount": 10, "period_ms": 1000 },
            "tokens": { "amount": 1000, "period_ms": 1000 },
            "concurrent_runs": 2 } } }"#,
    )
    .unwrap();
    let clock = FakeClock::new(0);
    Limiter::new(
        MemoryStore::new(clock.clone()),
        clock,
        cfg.validate().unwrap(),
    )
}

fn refused(r: Result<impl std::fmt::Debug, LimiterError>) -> (&'static str, String) {
    match r {
        Err(LimiterError::InvalidRequest { field, message }) => (field, message),
        other => panic!("expected an invalid request, got {other:?}"),
    }
}

#[tokio::test]
async fn the_limiter_refuses_control_characters_empty_and_long_ids() {
    let l = limiter();
    assert_eq!(
        refused(l.admit_turn("u\n1", "inv").await),
        ("user", "must not contain control characters".to_owned())
    );
    assert_eq!(
        refused(l.admit_turn("u1", "inv\u{0}").await),
        (
            "invocation_id",
            "must not contain control characters".to_owned()
        )
    );
    assert_eq!(
        refused(l.admit_turn("", "inv").await),
        ("user", "must not be empty".to_owned())
    );
    let long = "u".repeat(MAX_ID_LEN + 1);
    assert_eq!(
        refused(l.admit_turn(&long, "inv").await),
        ("user", format!("must be at most {MAX_ID_LEN} characters"))
    );
    // The limit counts characters, as JSON Schema's maxLength does: 513
    // two-byte characters are too long, 512 of them (1,024 bytes) are not.
    assert_eq!(
        refused(l.admit_turn(&"é".repeat(MAX_ID_LEN + 1), "inv").await),
        ("user", format!("must be at most {MAX_ID_LEN} characters"))
    );
    // The longest id is accepted, and so is any non-control Unicode.
    let longest = "u".repeat(MAX_ID_LEN);
    assert!(l.admit_turn(&longest, "inv").await.unwrap().is_allowed());
    let longest = "é".repeat(MAX_ID_LEN);
    assert!(l.admit_turn(&longest, "inv").await.unwrap().is_allowed());
    assert!(l.admit_turn("üser/1 ✓", "inv").await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_turn_in_a_session_follows_the_id_rule_and_holds_nothing_when_refused() {
    use tollgate_core::session::{SessionAdmit, SessionLease, session_key};
    let l = limiter();
    let key = session_key("u1", "chat");
    let lease = SessionLease {
        key: &key,
        ttl_ms: 30_000,
    };
    assert_eq!(
        refused(l.admit_turn_in_session("u1", "inv\n", Some(lease)).await),
        (
            "invocation_id",
            "must not contain control characters".to_owned()
        )
    );
    assert_eq!(
        refused(l.admit_turn_in_session("u\t1", "inv", Some(lease)).await),
        ("user", "must not contain control characters".to_owned())
    );
    // Nothing was held: another invocation takes the session at once.
    match l.admit_turn_in_session("u1", "inv-2", Some(lease)).await {
        Ok(SessionAdmit::Decided(d)) => assert!(d.is_allowed()),
        other => panic!("expected the turn admitted, got {other:?}"),
    }
}
