//! Tests of jwt and dev modes: the bearer token, algorithm pinning, signatures and claims.

use crate::identity::tests::*;
use crate::identity::*;

#[test]
fn hs256_happy_path() {
    let (v, _) = hs_verifier();
    assert_eq!(v.verify(&bearer(&hs(&claims(60)))), Ok("alice".to_owned()));
}

#[test]
fn missing_authorization_header() {
    let (v, _) = hs_verifier();
    assert_eq!(
        v.verify(&HeaderMap::new()),
        Err(AuthError::MissingCredentials)
    );
}

#[test]
fn scheme_other_than_bearer() {
    let (v, _) = hs_verifier();
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_static("Basic YWxpY2U6cHc="),
    );
    assert_eq!(v.verify(&headers), Err(AuthError::NotBearer));
    headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearertoken"));
    assert_eq!(v.verify(&headers), Err(AuthError::NotBearer));
}

#[test]
fn bearer_scheme_is_case_insensitive() {
    let (v, _) = hs_verifier();
    let mut headers = HeaderMap::new();
    let value = format!("bearer   {}", hs(&claims(60)));
    headers.insert(AUTHORIZATION, HeaderValue::from_str(&value).unwrap());
    assert_eq!(v.verify(&headers), Ok("alice".to_owned()));
}

#[test]
fn empty_duplicate_or_huge_bearer_is_malformed() {
    let (v, _) = hs_verifier();
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer "));
    assert!(matches!(v.verify(&headers), Err(AuthError::Malformed(_))));

    let token = hs(&claims(60));
    let mut headers = bearer(&token);
    headers.append(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    assert!(matches!(v.verify(&headers), Err(AuthError::Malformed(_))));

    let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
    assert!(matches!(
        v.verify(&bearer(&huge)),
        Err(AuthError::Malformed(_))
    ));
}

#[test]
fn garbage_tokens_are_malformed() {
    let (v, _) = hs_verifier();
    let valid = hs(&claims(60));
    let mut parts = valid.split('.');
    let (h, c) = (parts.next().unwrap(), parts.next().unwrap());
    for garbage in [
        "not-a-jwt".to_owned(),
        "a.b".to_owned(),
        "a.b.c.d".to_owned(),
        "%%%.b.c".to_owned(),
        format!("{}.{c}.sig", b64url(b"not json")),
        format!("{}.{c}.sig", b64url(b"[1,2]")),
        format!("{}.{c}.sig", b64url(br#"{"typ":"JWT"}"#)),
        format!("{}.{c}.sig", b64url(br#"{"alg":"HS256","kid":5}"#)),
        format!("{h}.%%%.sig"),
        format!("{h}.{c}.%%%"),
    ] {
        let got = v.verify(&bearer(&garbage));
        assert!(
            matches!(got, Err(AuthError::Malformed(_))),
            "{garbage}: {got:?}"
        );
    }
}

#[test]
fn claims_that_are_not_an_object_are_malformed() {
    let (v, _) = hs_verifier();
    let token = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(SECRET.as_bytes()),
        None,
        &json!(["alice"]),
    );
    assert!(matches!(
        v.verify(&bearer(&token)),
        Err(AuthError::Malformed(_))
    ));
}

#[test]
fn alg_none_is_refused() {
    let (v, _) = hs_verifier();
    let payload = b64url(claims(60).to_string().as_bytes());
    for alg in ["none", "None", "NONE", "nOnE"] {
        let head = b64url(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#).as_bytes());
        let token = format!("{head}.{payload}.");
        assert_eq!(
            v.verify(&bearer(&token)),
            Err(AuthError::AlgorithmNotAllowed),
            "{alg}"
        );
    }
}

#[test]
fn other_hmac_algorithms_are_refused() {
    let (v, _) = hs_verifier();
    for alg in [Algorithm::HS384, Algorithm::HS512] {
        let token = sign(
            alg,
            &EncodingKey::from_secret(SECRET.as_bytes()),
            None,
            &claims(60),
        );
        assert_eq!(
            v.verify(&bearer(&token)),
            Err(AuthError::AlgorithmNotAllowed)
        );
    }
}

#[test]
fn expired_beyond_leeway_is_refused_within_leeway_accepted() {
    let (v, clock) = hs_verifier();
    // Default leeway: 30 s.
    assert_eq!(
        v.verify(&bearer(&hs(&claims(-31)))),
        Err(AuthError::Expired)
    );
    assert_eq!(
        v.verify(&bearer(&hs(&claims(-30)))),
        Err(AuthError::Expired)
    );
    assert_eq!(v.verify(&bearer(&hs(&claims(-29)))), Ok("alice".to_owned()));

    // The same token expires as the injected clock moves.
    let token = hs(&claims(10));
    assert!(v.verify(&bearer(&token)).is_ok());
    clock.advance(39_999);
    assert!(v.verify(&bearer(&token)).is_ok());
    clock.advance(1);
    assert_eq!(v.verify(&bearer(&token)), Err(AuthError::Expired));
}

#[test]
fn configured_leeway_is_used() {
    let clock = FakeClock::new(NOW_MS);
    let cfg = IdentityConfig {
        leeway_s: Some(0),
        ..hs256_config()
    };
    let v = build(&cfg, Path::new("."), &clock);
    assert_eq!(v.verify(&bearer(&hs(&claims(0)))), Err(AuthError::Expired));
    assert!(v.verify(&bearer(&hs(&claims(1)))).is_ok());
}

#[test]
fn missing_or_non_numeric_exp_is_refused() {
    let (v, _) = hs_verifier();
    let mut c = claims(60);
    c.as_object_mut().unwrap().remove("exp");
    assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::MissingExpiry));
    c["exp"] = json!("tomorrow");
    assert!(matches!(
        v.verify(&bearer(&hs(&c))),
        Err(AuthError::Malformed(_))
    ));
    c["exp"] = json!(-5);
    assert!(matches!(
        v.verify(&bearer(&hs(&c))),
        Err(AuthError::Malformed(_))
    ));
    // A fractional NumericDate is accepted.
    c["exp"] = json!((NOW_S + 60) as f64 + 0.5);
    assert!(v.verify(&bearer(&hs(&c))).is_ok());
}

#[test]
fn nbf_in_the_future_is_refused() {
    let (v, clock) = hs_verifier();
    let mut c = claims(600);
    c["nbf"] = json!(NOW_S + 31);
    let token = hs(&c);
    assert_eq!(v.verify(&bearer(&token)), Err(AuthError::NotYetValid));
    clock.advance(1_000);
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
    c["nbf"] = json!(NOW_S + 29);
    assert!(v.verify(&bearer(&hs(&c))).is_ok());
}

#[test]
fn wrong_signing_key_is_a_bad_signature() {
    let (v, _) = hs_verifier();
    let other = EncodingKey::from_secret(b"another-secret-0123456789abcdef-0123456789");
    let token = sign(Algorithm::HS256, &other, None, &claims(60));
    assert_eq!(v.verify(&bearer(&token)), Err(AuthError::BadSignature));

    // A tampered payload with the original signature.
    let good = hs(&claims(60));
    let parts: Vec<&str> = good.split('.').collect();
    let mut forged = claims(60);
    forged["sub"] = json!("mallory");
    let token = format!(
        "{}.{}.{}",
        parts[0],
        b64url(forged.to_string().as_bytes()),
        parts[2]
    );
    assert_eq!(v.verify(&bearer(&token)), Err(AuthError::BadSignature));
}

#[test]
fn wrong_audience_is_refused() {
    let (v, _) = hs_verifier();
    let mut c = claims(60);
    c["aud"] = json!("someone-else");
    assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongAudience));
    c["aud"] = json!(["a", "b"]);
    assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongAudience));
    c.as_object_mut().unwrap().remove("aud");
    assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongAudience));
    c["aud"] = json!(["other", AUDIENCE]);
    assert!(v.verify(&bearer(&hs(&c))).is_ok());
}

#[test]
fn audience_is_required_unless_the_operator_turns_its_check_off() {
    let dir = TempDir::new("audience");
    let cfg = IdentityConfig {
        audience: None,
        ..hs256_config()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.audience", "required in jwt mode"),
        "{e:?}"
    );
    let off = IdentityConfig {
        audience_check: Some(false),
        ..cfg.clone()
    };
    let v = build(&off, Path::new("."), &FakeClock::new(NOW_MS));
    let mut c = claims(60);
    c["aud"] = json!("anything");
    assert!(v.verify(&bearer(&hs(&c))).is_ok());
    assert!(v.describe().contains("audience not checked"));
    let both = IdentityConfig {
        audience_check: Some(false),
        ..hs256_config()
    };
    let e = config_errors(&both, &dir.0);
    assert!(
        has_error(&e, "identity.audience_check", "contradicts"),
        "{e:?}"
    );
}

#[test]
fn scopes_and_tenant_come_from_the_verified_claims() {
    let clock = FakeClock::new(NOW_MS);
    let cfg = IdentityConfig {
        tenant_claim: Some("org".into()),
        ..hs256_config()
    };
    let v = build(&cfg, Path::new("."), &clock);
    assert!(v.verifies_tenant());
    let id = |c: &Value| v.identify(&bearer(&hs(c)), None);
    let plain = id(&claims(60)).unwrap();
    assert_eq!((plain.feedback, plain.tenant.as_deref()), (false, None));
    let mut c = claims(60);
    c["scope"] = json!("read tollgate:feedback write");
    c["org"] = json!("acme");
    let svc = id(&c).unwrap();
    assert_eq!((svc.feedback, svc.tenant.as_deref()), (true, Some("acme")));
    c["scope"] = json!(["read", "tollgate:feedback"]);
    assert!(id(&c).unwrap().feedback);
    // Near misses are not the scope.
    for near in [
        json!("tollgate:feedbackx"),
        json!("Tollgate:feedback"),
        json!(7),
    ] {
        c["scope"] = near;
        assert!(!id(&c).unwrap().feedback);
    }
    c["org"] = json!(1);
    assert!(matches!(id(&c), Err(AuthError::Malformed(_))));
    // Minted tokens carry them.
    let token = v
        .mint_with("svc", 60, &["tollgate:feedback".to_owned()], Some("acme"))
        .unwrap();
    let minted = v.identify(&bearer(&token), None).unwrap();
    assert_eq!(
        minted,
        Identity {
            user: tollgate_core::IdBuf::new("svc").unwrap(),
            feedback: true,
            tenant: Some("acme".into())
        }
    );
    let (plain_v, _) = hs_verifier();
    assert!(matches!(
        plain_v.mint_with("svc", 60, &[], Some("acme")),
        Err(MintError::NoTenantClaim)
    ));
}

#[test]
fn expiry_is_read_on_the_injected_wall_clock() {
    // The verifier's clock is the one it was given (the system clock in
    // production): a token valid now expires when that clock passes it.
    let (v, clock) = hs_verifier();
    let token = hs(&claims(60));
    assert!(v.verify(&bearer(&token)).is_ok());
    clock.advance((60 + DEFAULT_LEEWAY_S) * 1_000);
    assert_eq!(v.verify(&bearer(&token)), Err(AuthError::Expired));
}

#[test]
fn wrong_issuer_is_refused() {
    let (v, _) = hs_verifier();
    let mut c = claims(60);
    c["iss"] = json!("https://evil.test");
    assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongIssuer));
    c["iss"] = json!([ISSUER]);
    assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongIssuer));
    c.as_object_mut().unwrap().remove("iss");
    assert_eq!(v.verify(&bearer(&hs(&c))), Err(AuthError::WrongIssuer));
}

fn rs256_verifier(dir: &TempDir, clock: &FakeClock) -> Verifier {
    dir.write("rsa.pub.pem", RSA_A_PUBLIC);
    let cfg = IdentityConfig {
        algorithm: Some("RS256".into()),
        // Relative: resolved against the config's directory.
        public_key_file: Some("rsa.pub.pem".into()),
        issuer: Some(ISSUER.into()),
        audience: Some(AUDIENCE.into()),
        ..IdentityConfig::new(IdentityMode::Jwt)
    };
    build(&cfg, &dir.0, clock)
}

#[test]
fn rs256_happy_path() {
    let dir = TempDir::new("rs256-happy");
    let clock = FakeClock::new(NOW_MS);
    let v = rs256_verifier(&dir, &clock);
    let token = sign(Algorithm::RS256, &rsa_key(RSA_A_PRIVATE), None, &claims(60));
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
    assert!(
        v.describe().starts_with("jwt (RS256 public key"),
        "{}",
        v.describe()
    );
    assert!(!v.can_mint());
    assert!(matches!(
        v.mint("alice", 60),
        Err(MintError::Unsupported(..))
    ));
}

#[test]
fn rs256_with_another_key_is_a_bad_signature() {
    let dir = TempDir::new("rs256-wrong-key");
    let clock = FakeClock::new(NOW_MS);
    let v = rs256_verifier(&dir, &clock);
    let token = sign(Algorithm::RS256, &rsa_key(RSA_B_PRIVATE), None, &claims(60));
    assert_eq!(v.verify(&bearer(&token)), Err(AuthError::BadSignature));
}

#[test]
fn hs256_signed_with_the_rsa_public_key_is_refused() {
    // Algorithm confusion: the attacker uses the (public) PEM bytes as an
    // HMAC secret and hopes the server verifies HS256 with them.
    let dir = TempDir::new("rs-hs-confusion");
    let clock = FakeClock::new(NOW_MS);
    let v = rs256_verifier(&dir, &clock);
    let forged = EncodingKey::from_secret(RSA_A_PUBLIC.as_bytes());
    let token = sign(Algorithm::HS256, &forged, None, &claims(60));
    assert_eq!(
        v.verify(&bearer(&token)),
        Err(AuthError::AlgorithmNotAllowed)
    );
    // Nor any other algorithm than the configured one.
    let token = sign(Algorithm::RS512, &rsa_key(RSA_A_PRIVATE), None, &claims(60));
    assert_eq!(
        v.verify(&bearer(&token)),
        Err(AuthError::AlgorithmNotAllowed)
    );
    let token = sign(Algorithm::PS256, &rsa_key(RSA_A_PRIVATE), None, &claims(60));
    assert_eq!(
        v.verify(&bearer(&token)),
        Err(AuthError::AlgorithmNotAllowed)
    );
}

#[test]
fn rs256_token_is_refused_when_configured_for_hs256() {
    let (v, _) = hs_verifier();
    let token = sign(Algorithm::RS256, &rsa_key(RSA_A_PRIVATE), None, &claims(60));
    assert_eq!(
        v.verify(&bearer(&token)),
        Err(AuthError::AlgorithmNotAllowed)
    );
    let token = sign(Algorithm::ES256, &ec_key(EC_A_PRIVATE), None, &claims(60));
    assert_eq!(
        v.verify(&bearer(&token)),
        Err(AuthError::AlgorithmNotAllowed)
    );
}

#[test]
fn es256_happy_path() {
    let dir = TempDir::new("es256-happy");
    let path = dir.write("ec.pub.pem", EC_A_PUBLIC);
    let clock = FakeClock::new(NOW_MS);
    let cfg = IdentityConfig {
        algorithm: Some("ES256".into()),
        public_key_file: Some(path),
        audience: Some(AUDIENCE.into()),
        ..IdentityConfig::new(IdentityMode::Jwt)
    };
    let v = build(&cfg, Path::new("/nonexistent"), &clock);
    let token = sign(Algorithm::ES256, &ec_key(EC_A_PRIVATE), None, &claims(60));
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));

    let other = sign(Algorithm::ES256, &ec_key(EC_B_PRIVATE), None, &claims(60));
    assert_eq!(v.verify(&bearer(&other)), Err(AuthError::BadSignature));
    let rs = sign(Algorithm::RS256, &rsa_key(RSA_A_PRIVATE), None, &claims(60));
    assert_eq!(v.verify(&bearer(&rs)), Err(AuthError::AlgorithmNotAllowed));
    let forged = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(EC_A_PUBLIC.as_bytes()),
        None,
        &claims(60),
    );
    assert_eq!(
        v.verify(&bearer(&forged)),
        Err(AuthError::AlgorithmNotAllowed)
    );
}

#[test]
fn missing_user_claim_is_refused() {
    let (v, _) = hs_verifier();
    let mut c = claims(60);
    c.as_object_mut().unwrap().remove("sub");
    assert_eq!(
        v.verify(&bearer(&hs(&c))),
        Err(AuthError::MissingUserClaim("sub".into()))
    );
    for bad in [
        json!(""),
        json!(42),
        json!(true),
        json!("x".repeat(513)),
        json!("a\nb"),
    ] {
        c["sub"] = bad.clone();
        assert!(
            matches!(v.verify(&bearer(&hs(&c))), Err(AuthError::InvalidUserId(_))),
            "{bad}"
        );
    }
    // jsonwebtoken's own parsing of `sub` refuses an array or object.
    for bad in [json!(["alice"]), json!({"id": "alice"})] {
        c["sub"] = bad;
        assert!(matches!(
            v.verify(&bearer(&hs(&c))),
            Err(AuthError::Malformed(_))
        ));
    }
    c["sub"] = json!("é".repeat(512)); // 512 characters, 1,024 bytes
    assert!(v.verify(&bearer(&hs(&c))).is_ok());
    c["sub"] = json!("é".repeat(513));
    assert!(matches!(
        v.verify(&bearer(&hs(&c))),
        Err(AuthError::InvalidUserId(_))
    ));
}

#[test]
fn custom_user_claim() {
    let clock = FakeClock::new(NOW_MS);
    let cfg = IdentityConfig {
        user_claim: Some("email".into()),
        ..hs256_config()
    };
    let v = build(&cfg, Path::new("."), &clock);
    let mut c = claims(60);
    c["email"] = json!("alice@example.com");
    assert_eq!(
        v.verify(&bearer(&hs(&c))),
        Ok("alice@example.com".to_owned())
    );
    c.as_object_mut().unwrap().remove("email");
    assert_eq!(
        v.verify(&bearer(&hs(&c))),
        Err(AuthError::MissingUserClaim("email".into()))
    );
    assert!(v.describe().contains("user claim email"));
    // Minting writes the user into the configured claim.
    let token = v.mint("bob@example.com", 60).unwrap();
    assert_eq!(v.verify(&bearer(&token)), Ok("bob@example.com".to_owned()));
}

#[test]
fn base64url_decoding() {
    // Tokens are read with the `base64` crate's unpadded base64url engine
    // (RFC 4648 §5), which refuses padding, other alphabets and
    // non-canonical trailing bits.
    let b64url_decode = |input: &str| URL_SAFE_NO_PAD.decode(input).ok();
    assert_eq!(b64url_decode("").unwrap(), b"");
    for input in [
        &b"f"[..],
        b"fo",
        b"foo",
        b"foob",
        b"fooba",
        b"foobar",
        &[0xfb, 0xff, 0xfe],
    ] {
        assert_eq!(b64url_decode(&b64url(input)).unwrap(), input);
    }
    assert_eq!(b64url(&[0xfb, 0xff]), "-_8");
    assert!(b64url_decode("Zm9v=").is_none());
    assert!(b64url_decode("Zm9v+").is_none());
    assert!(b64url_decode("Z").is_none());
    assert!(b64url_decode("Zh").is_none()); // non-canonical trailing bits
}
