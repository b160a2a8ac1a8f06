use super::*;

#[test]
fn session_keys_parse_back() {
    for (app, user, id) in [
        ("app", "u1", "s1"),
        ("a/b:1", "u:2/x", "s/3:"),
        ("", "", ""),
    ] {
        let key = session_key(app, user, id);
        assert_eq!(parse_session_key(&key), Some((app, user, id)), "{key}");
    }
    for bad in [
        "",
        "adk:",
        "adk:3:app",
        // The layout before grouped keys: not a session key any more.
        "adk:3:app/2:u1/s1",
        // The layout before versioned keys: not one either.
        "@7:adk:app/s:2:u1/s1",
        "@7:adk:app/s:9:u1/s",
        "@7:adk:app/c:2:u1",
        "@7:xyz:app/s:2:u1/s1",
        "x:3:app/2:u1/s1",
    ] {
        assert_eq!(parse_session_key(bad), None, "{bad}");
    }
}

#[test]
fn fence_errors_convert_with_their_source() {
    let error: AdkError = FenceError::Stale {
        fence: 1,
        latest: 2,
    }
    .into();
    assert_eq!(error.code, "session.fence_stale");
    assert_eq!(
        FenceError::find_in(&error),
        Some(&FenceError::Stale {
            fence: 1,
            latest: 2
        })
    );
    let error: AdkError = FenceError::NotHeld {
        session: "s".into(),
    }
    .into();
    assert_eq!(error.code, "session.fence_not_held");
    assert!(matches!(
        FenceError::find_in(&error),
        Some(FenceError::NotHeld { .. })
    ));
}
