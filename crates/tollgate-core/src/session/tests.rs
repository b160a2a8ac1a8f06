use super::*;
use crate::decision::{Denial, Limit};
use crate::store::grouped::session_group;
use crate::{FakeClock, MemoryStore, PlansConfig};

#[test]
fn keys_are_versioned_and_length_prefixed() {
    assert_eq!(session_key("bob", "s1"), "s1:3:bob/s1");
    assert_eq!(SessionKey::new("bob", "s1").to_string(), "s1:3:bob/s1");
    // The scheme before: `{user}/{s}` made these two one session.
    assert_ne!(session_key("a/b", "c"), session_key("a", "b/c"));
    assert_ne!(session_key("a:1", "b"), session_key("a", "1:b"));
    let scoped = SessionKey::scoped("adk:app", "u1", "s1").to_string();
    assert_eq!(scoped, "@7:adk:app/s1:2:u1/s1");
    assert_eq!(
        scoped,
        grouped_name("adk:app", &session_key("u1", "s1")),
        "a scoped key is the grouped name of the unscoped one"
    );
    assert_eq!(session_group(&scoped), "adk:app");
    // An unscoped key is never grouped: it is a group of its own.
    assert_eq!(session_group("s1:3:bob/s1"), "s1:3:bob/s1");
}

#[test]
fn keys_parse_back_and_other_names_do_not() {
    for key in [
        SessionKey::new("bob", "s1"),
        SessionKey::new("u:2/x", "s/3:"),
        SessionKey::new("", ""),
        SessionKey::new("@7:adk:app", "x"),
        SessionKey::scoped("adk:a/b:1", "u:2/x", "s/3:"),
        SessionKey::scoped("g", "", ""),
    ] {
        let name = key.to_string();
        assert_eq!(SessionKey::parse(&name), Some(key), "{name}");
    }
    for other in [
        "",
        "s1",
        "s1:",
        "s1:3:bob",
        "s1:3:bo/x",
        "s1:03:bob/x",
        "s1:+3:bob/x",
        "s1:9:bob/s",
        "s2:3:bob/s1",
        // The schemes before version 1.
        "3:bob/s1",
        "bob/s1",
        "@7:adk:app/s:2:u1/s1",
        "adk:3:app/2:u1/s1",
        // Other names of an adk app's group.
        "@7:adk:app/c:2:u1",
        "@7:adk:app/a",
    ] {
        assert_eq!(SessionKey::parse(other), None, "{other}");
    }
}

#[test]
fn ttl_bounds() {
    for bad in [0, MAX_SESSION_TTL_MS + 1, u64::MAX] {
        match check_ttl("ttl_ms", bad) {
            Err(LimiterError::InvalidRequest { field, message }) => {
                assert_eq!(field, "ttl_ms");
                assert_eq!(message, "must be between 1 and 3600000 ms");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    for ok in [1, DEFAULT_SESSION_TTL_MS, MAX_SESSION_TTL_MS] {
        assert_eq!(check_ttl("ttl_ms", ok).unwrap(), ok);
    }
    assert_eq!(renewable_ttl(0), 3);
    assert_eq!(renewable_ttl(2), 3);
    assert_eq!(renewable_ttl(10), 10);
    assert_eq!(renew_every_ms(0), 1);
    assert_eq!(renew_every_ms(3), 1);
    assert_eq!(renew_every_ms(4), 2);
    assert_eq!(renew_every_ms(30_000), 10_000);
}

/// A limiter whose plan admits `burst` turns at once (one per minute
/// after), three runs at once; `shadow` puts it in shadow mode. User
/// `nobody` has a plan only when `default`.
fn limiter(shadow: bool, default: bool, burst: u64) -> Limiter<MemoryStore> {
    let cfg: PlansConfig = serde_json::from_value(serde_json::json!({
        "default_plan": if default { Some("p") } else { None },
        "users": { "u1": "p" },
        "plans": { "p": {
            "turns":  { "amount": 1, "period_ms": 60000, "burst": burst },
            "tokens": { "amount": 1000, "period_ms": 60000 },
            "concurrent_runs": 3, "max_wait_ms": 0, "shadow": shadow } }
    }))
    .unwrap();
    let clock = FakeClock::new(1_000);
    let store = MemoryStore::new(clock.clone());
    Limiter::new(store, clock, cfg.validate().unwrap())
}

fn lease(key: &str) -> Option<SessionLease<'_>> {
    Some(SessionLease {
        key,
        ttl_ms: 30_000,
    })
}

#[tokio::test]
async fn an_admitted_turn_holds_its_session_and_a_busy_session_takes_nothing() {
    let l = limiter(false, true, 2);
    let key = session_key("u1", "chat");
    let SessionAdmit::Decided(Decision::Allowed {
        grant,
        shadow_denied: None,
    }) = l
        .admit_turn_in_session("u1", "inv-1", lease(&key))
        .await
        .unwrap()
    else {
        panic!("admitted")
    };
    let session = grant.session.unwrap();
    assert_eq!(session.fence, 1);
    assert_eq!(session.expires_at_ms, 31_000);
    assert_eq!(grant.run.expires_at_ms, 121_000);
    assert!(l.check_fence(&key, 1).await.unwrap().current);

    // Another turn of the session: busy, and nothing is taken (the
    // bucket's second turn is still there for a turn of another session;
    // its third is not).
    assert_eq!(
        l.admit_turn_in_session("u1", "inv-2", lease(&key))
            .await
            .unwrap(),
        SessionAdmit::Busy {
            retry_after_ms: 30_000
        }
    );
    let other = session_key("u1", "other");
    assert!(matches!(
        l.admit_turn_in_session("u1", "inv-3", lease(&other))
            .await
            .unwrap(),
        SessionAdmit::Decided(Decision::Allowed { .. })
    ));
    let third = session_key("u1", "third");
    assert!(matches!(
        l.admit_turn_in_session("u1", "inv-4", lease(&third))
            .await
            .unwrap(),
        SessionAdmit::Decided(Decision::Denied(_))
    ));

    // The holder's retry refreshes both leases, same fence.
    let SessionAdmit::Decided(Decision::Allowed { grant, .. }) = l
        .admit_turn_in_session("u1", "inv-1", lease(&key))
        .await
        .unwrap()
    else {
        panic!("refreshed")
    };
    assert!(grant.run.refreshed);
    assert_eq!(grant.session.unwrap().fence, 1);

    // Renew and release go through the same key.
    assert!(
        l.renew_session(&key, "inv-1", 30_000)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        l.renew_session(&key, "inv-2", 30_000)
            .await
            .unwrap()
            .is_none()
    );
    assert!(!l.release_session(&key, "inv-2").await.unwrap());
    assert!(l.release_session(&key, "inv-1").await.unwrap());
}

#[tokio::test]
async fn a_denied_turn_releases_its_session() {
    let l = limiter(false, true, 1);
    let key = session_key("u1", "chat");
    let other = session_key("u1", "other");
    assert!(matches!(
        l.admit_turn_in_session("u1", "inv-1", lease(&other))
            .await
            .unwrap(),
        SessionAdmit::Decided(Decision::Allowed { .. })
    ));
    // The bucket of one turn is empty now.
    let decided = l
        .admit_turn_in_session("u1", "inv-2", lease(&key))
        .await
        .unwrap();
    assert!(
        matches!(
            decided,
            SessionAdmit::Decided(Decision::Denied(Denial::Limited {
                limit: Limit::TurnRate,
                ..
            }))
        ),
        "{decided:?}"
    );
    // The lease it took (fence 1) is free again: a new holder gets fence 2.
    assert_eq!(l.check_fence(&key, 1).await.unwrap().latest, 1);
    match l.acquire_session(&key, "h", 1_000).await.unwrap() {
        SessionAcquire::Acquired(g) => assert_eq!(g.fence, 2),
        busy => panic!("{busy:?}"),
    }
}

#[tokio::test]
async fn an_invalid_id_or_an_unknown_user_takes_nothing() {
    let l = limiter(false, false, 1);
    let key = session_key("u1", "chat");
    // An invalid invocation id is refused before the session lease is
    // taken: no fence was ever issued.
    let e = l
        .admit_turn_in_session("u1", "", lease(&key))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            LimiterError::InvalidRequest {
                field: "invocation_id",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(l.check_fence(&key, 1).await.unwrap().latest, 0);
    assert!(matches!(
        l.acquire_session(&key, "h", 1_000).await.unwrap(),
        SessionAcquire::Acquired(_)
    ));

    // No plan: refused before the session is touched.
    let nobody = session_key("nobody", "chat");
    let e = l
        .admit_turn_in_session("nobody", "inv-1", lease(&nobody))
        .await
        .unwrap_err();
    assert!(matches!(e, LimiterError::UnknownUser { .. }), "{e}");
    assert_eq!(l.check_fence(&nobody, 1).await.unwrap().latest, 0);
}

#[tokio::test]
async fn without_a_session_it_is_admit_turn_and_shadow_mode_keeps_the_session() {
    let l = limiter(false, true, 1);
    let SessionAdmit::Decided(Decision::Allowed { grant, .. }) =
        l.admit_turn_in_session("u1", "inv-1", None).await.unwrap()
    else {
        panic!("admitted")
    };
    assert_eq!(grant.session, None);
    assert!(matches!(
        l.admit_turn_in_session("u1", "inv-2", None).await.unwrap(),
        SessionAdmit::Decided(Decision::Denied(_))
    ));

    let l = limiter(true, true, 1);
    let key = session_key("u1", "chat");
    for (inv, shadowed) in [("inv-1", false), ("inv-2", true)] {
        let other = session_key("u1", inv);
        let SessionAdmit::Decided(Decision::Allowed {
            grant,
            shadow_denied,
        }) = l
            .admit_turn_in_session("u1", inv, lease(if shadowed { &key } else { &other }))
            .await
            .unwrap()
        else {
            panic!("shadow mode allows")
        };
        assert_eq!(shadow_denied.is_some(), shadowed);
        assert_eq!(grant.session.unwrap().fence, 1);
    }
    // The shadow-admitted turn holds the session: it is busy for another.
    assert!(matches!(
        l.admit_turn_in_session("u1", "inv-3", lease(&key))
            .await
            .unwrap(),
        SessionAdmit::Busy { .. }
    ));
}
