//! Tests of trusted_header mode: headers believed only from the trusted proxies.

use crate::identity::tests::*;
use crate::identity::*;

#[test]
fn trusted_header_mode() {
    let clock = FakeClock::new(NOW_MS);
    let v = build(&trusted_config(), Path::new("."), &clock);
    assert_eq!(v.mode(), IdentityMode::TrustedHeader);
    let v = Proxied(v);
    let mut headers = HeaderMap::new();
    assert_eq!(v.verify(&headers), Err(AuthError::MissingTrustedHeader));
    // A bearer token is not an identity in this mode.
    let with_token = bearer(&hs(&claims(60)));
    assert_eq!(v.verify(&with_token), Err(AuthError::MissingTrustedHeader));

    headers.insert(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("carol"));
    assert_eq!(v.verify(&headers), Ok("carol".to_owned()));
    headers.insert(
        DEFAULT_TRUSTED_HEADER,
        HeaderValue::from_bytes("zoë".as_bytes()).unwrap(),
    );
    assert_eq!(v.verify(&headers), Ok("zoë".to_owned()));

    for bad in [
        b"".to_vec(),
        vec![b'x'; 513],
        vec![0xff, 0xfe],
        b"a\tb".to_vec(),
    ] {
        headers.insert(
            DEFAULT_TRUSTED_HEADER,
            HeaderValue::from_bytes(&bad).unwrap(),
        );
        assert!(
            matches!(v.verify(&headers), Err(AuthError::InvalidUserId(_))),
            "{bad:?}"
        );
    }
    headers.insert(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("carol"));
    headers.append(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("mallory"));
    assert!(matches!(v.verify(&headers), Err(AuthError::Malformed(_))));
    assert!(v.describe().contains("x-tollgate-user"));
    assert!(matches!(
        v.mint("carol", 60),
        Err(MintError::Unsupported(..))
    ));
}

/// trusted_header mode believing 10.0.0.0/8 and ::1.
fn trusted_config() -> IdentityConfig {
    IdentityConfig {
        trusted_proxies: Some(vec!["10.0.0.0/8".into(), "::1".into()]),
        ..IdentityConfig::new(IdentityMode::TrustedHeader)
    }
}

/// A verifier whose requests come from the trusted proxy 10.1.2.3.
struct Proxied(Verifier);

impl Proxied {
    fn verify(&self, headers: &HeaderMap) -> Result<String, AuthError> {
        self.0
            .identify(headers, Some("10.1.2.3".parse().unwrap()))
            .map(|id| id.user.into())
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn mint(&self, user: &str, ttl_s: u64) -> Result<String, MintError> {
        self.0.mint(user, ttl_s)
    }
}

#[test]
fn trusted_header_is_believed_only_from_trusted_proxies() {
    let clock = FakeClock::new(NOW_MS);
    let v = build(&trusted_config(), Path::new("."), &clock);
    let mut headers = HeaderMap::new();
    headers.insert(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("carol"));
    for peer in ["10.255.0.1", "::1", "::ffff:10.0.0.7"] {
        assert_eq!(
            v.identify(&headers, Some(peer.parse().unwrap()))
                .map(|i| String::from(i.user)),
            Ok("carol".to_owned()),
            "{peer}"
        );
    }
    for peer in [Some("11.0.0.1"), Some("127.0.0.1"), Some("::2"), None] {
        assert_eq!(
            v.identify(&headers, peer.map(|p| p.parse().unwrap())),
            Err(AuthError::UntrustedPeer),
            "{peer:?}"
        );
    }
    assert!(v.describe().contains("10.0.0.0/8"));
    // The scope and tenant headers, when the proxy sets them.
    let cfg = IdentityConfig {
        tenant_claim: Some("x-tenant".into()),
        ..trusted_config()
    };
    let v = build(&cfg, Path::new("."), &clock);
    headers.insert(
        DEFAULT_SCOPE_HEADER,
        HeaderValue::from_static("tollgate:feedback"),
    );
    headers.insert("x-tenant", HeaderValue::from_static("acme"));
    let id = v
        .identify(&headers, Some("10.0.0.1".parse().unwrap()))
        .unwrap();
    assert_eq!((id.feedback, id.tenant.as_deref()), (true, Some("acme")));
}

#[test]
fn trusted_header_mode_requires_its_proxies() {
    let dir = TempDir::new("proxies");
    let e = config_errors(&IdentityConfig::new(IdentityMode::TrustedHeader), &dir.0);
    assert!(
        has_error(&e, "identity.trusted_proxies", "required"),
        "{e:?}"
    );
    let cfg = IdentityConfig {
        trusted_proxies: Some(vec![]),
        ..IdentityConfig::new(IdentityMode::TrustedHeader)
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.trusted_proxies", "at least one"),
        "{e:?}"
    );
    let cfg = IdentityConfig {
        trusted_proxies: Some(vec!["10.0.0.0/8".into(), "proxy.local".into()]),
        ..IdentityConfig::new(IdentityMode::TrustedHeader)
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.trusted_proxies[1]", "not an IP"),
        "{e:?}"
    );
    let cfg = IdentityConfig {
        trusted_proxies: Some(vec!["10.0.0.1".into()]),
        ..IdentityConfig::dev()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.trusted_proxies", "not used"),
        "{e:?}"
    );
}

#[test]
fn trusted_header_custom_name() {
    let clock = FakeClock::new(NOW_MS);
    let cfg = IdentityConfig {
        header: Some("X-Forwarded-User".into()),
        ..trusted_config()
    };
    let v = Proxied(build(&cfg, Path::new("."), &clock));
    let mut headers = HeaderMap::new();
    headers.insert(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("carol"));
    assert_eq!(v.verify(&headers), Err(AuthError::MissingTrustedHeader));
    headers.insert("x-forwarded-user", HeaderValue::from_static("dave"));
    assert_eq!(v.verify(&headers), Ok("dave".to_owned()));
}

#[test]
fn trusted_header_is_off_unless_configured() {
    let mut headers = HeaderMap::new();
    headers.insert(DEFAULT_TRUSTED_HEADER, HeaderValue::from_static("mallory"));
    let (jwt, _) = hs_verifier();
    assert_eq!(jwt.verify(&headers), Err(AuthError::MissingCredentials));
    let dev = build(
        &IdentityConfig::dev(),
        Path::new("."),
        &FakeClock::new(NOW_MS),
    );
    assert_eq!(dev.verify(&headers), Err(AuthError::MissingCredentials));
}
