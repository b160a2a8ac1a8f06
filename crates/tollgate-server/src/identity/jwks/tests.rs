//! Tests of JWKS files: selection by kid, restriction, rotation and their config errors.

use crate::identity::tests::*;
use crate::identity::*;

fn jwks_config(path: &Path) -> IdentityConfig {
    IdentityConfig {
        jwks_file: Some(path.to_path_buf()),
        issuer: Some(ISSUER.into()),
        audience: Some(AUDIENCE.into()),
        ..IdentityConfig::new(IdentityMode::Jwt)
    }
}

#[test]
fn jwks_happy_path_selects_by_kid() {
    let dir = TempDir::new("jwks-happy");
    let rsa = rsa_key(RSA_A_PRIVATE);
    let ec = ec_key(EC_A_PRIVATE);
    let path = dir.write(
        "jwks.json",
        &jwks_json(vec![
            jwk(&rsa, Algorithm::RS256, "rsa-1"),
            jwk(&ec, Algorithm::ES256, "ec-1"),
        ]),
    );
    let clock = FakeClock::new(NOW_MS);
    let v = build(&jwks_config(&path), Path::new("."), &clock);
    assert!(
        v.describe().contains("2 key(s) (ES256, RS256)"),
        "{}",
        v.describe()
    );

    let rs = sign(Algorithm::RS256, &rsa, Some("rsa-1"), &claims(60));
    assert_eq!(v.verify(&bearer(&rs)), Ok("alice".to_owned()));
    let es = sign(Algorithm::ES256, &ec, Some("ec-1"), &claims(60));
    assert_eq!(v.verify(&bearer(&es)), Ok("alice".to_owned()));

    // The right algorithm with another key's kid.
    let crossed = sign(Algorithm::RS256, &rsa, Some("ec-1"), &claims(60));
    assert_eq!(
        v.verify(&bearer(&crossed)),
        Err(AuthError::AlgorithmNotAllowed)
    );
    let unknown = sign(Algorithm::RS256, &rsa, Some("nope"), &claims(60));
    assert_eq!(v.verify(&bearer(&unknown)), Err(AuthError::UnknownKey));
    // Without a kid, two keys are ambiguous.
    let no_kid = sign(Algorithm::RS256, &rsa, None, &claims(60));
    assert_eq!(v.verify(&bearer(&no_kid)), Err(AuthError::UnknownKey));
    // Signed by another key under a known kid.
    let other = sign(
        Algorithm::RS256,
        &rsa_key(RSA_B_PRIVATE),
        Some("rsa-1"),
        &claims(60),
    );
    assert_eq!(v.verify(&bearer(&other)), Err(AuthError::BadSignature));
}

#[test]
fn jwks_never_accepts_hmac_even_with_an_oct_key() {
    let dir = TempDir::new("jwks-oct");
    let rsa = rsa_key(RSA_A_PRIVATE);
    let oct_secret = b"jwks-oct-secret-0123456789abcdef";
    let oct = jwk(
        &EncodingKey::from_secret(oct_secret),
        Algorithm::HS256,
        "oct-1",
    );
    let path = dir.write(
        "jwks.json",
        &jwks_json(vec![jwk(&rsa, Algorithm::RS256, "rsa-1"), oct]),
    );
    let clock = FakeClock::new(NOW_MS);
    let v = build(&jwks_config(&path), Path::new("."), &clock);
    assert!(
        v.describe()
            .contains("1 key(s) (RS256, 1 unusable skipped)"),
        "{}",
        v.describe()
    );
    let token = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(oct_secret),
        Some("oct-1"),
        &claims(60),
    );
    assert_eq!(
        v.verify(&bearer(&token)),
        Err(AuthError::AlgorithmNotAllowed)
    );
    // With a single usable key, a token without kid uses it.
    let no_kid = sign(Algorithm::RS256, &rsa, None, &claims(60));
    assert_eq!(v.verify(&bearer(&no_kid)), Ok("alice".to_owned()));
}

#[test]
fn jwks_algorithm_restricts_the_keys() {
    let dir = TempDir::new("jwks-restrict");
    let rsa = rsa_key(RSA_A_PRIVATE);
    let ec = ec_key(EC_A_PRIVATE);
    let path = dir.write(
        "jwks.json",
        &jwks_json(vec![
            jwk(&rsa, Algorithm::RS256, "rsa-1"),
            jwk(&ec, Algorithm::ES256, "ec-1"),
        ]),
    );
    let clock = FakeClock::new(NOW_MS);
    let cfg = IdentityConfig {
        algorithm: Some("ES256".into()),
        ..jwks_config(&path)
    };
    let v = build(&cfg, Path::new("."), &clock);
    let es = sign(Algorithm::ES256, &ec, Some("ec-1"), &claims(60));
    assert!(v.verify(&bearer(&es)).is_ok());
    let rs = sign(Algorithm::RS256, &rsa, Some("rsa-1"), &claims(60));
    assert_eq!(v.verify(&bearer(&rs)), Err(AuthError::AlgorithmNotAllowed));
}

#[test]
fn jwks_key_rotation_without_restart() {
    let dir = TempDir::new("jwks-rotation");
    let old = rsa_key(RSA_A_PRIVATE);
    let new = ec_key(EC_B_PRIVATE);
    let path = dir.write(
        "jwks.json",
        &jwks_json(vec![jwk(&old, Algorithm::RS256, "2024")]),
    );
    touch(&path, 1_000_000);
    let clock = FakeClock::new(NOW_MS);
    let v = build(&jwks_config(&path), Path::new("."), &clock);

    let old_token = sign(Algorithm::RS256, &old, Some("2024"), &claims(600));
    let new_token = sign(Algorithm::ES256, &new, Some("2025"), &claims(600));
    assert_eq!(v.verify(&bearer(&old_token)), Ok("alice".to_owned()));
    assert_eq!(v.verify(&bearer(&new_token)), Err(AuthError::UnknownKey));

    // Rotate: the file now holds only the new key.
    std::fs::write(&path, jwks_json(vec![jwk(&new, Algorithm::ES256, "2025")])).unwrap();
    touch(&path, 2_000_000);
    // Not rechecked within the same second of the clock.
    clock.advance(999);
    assert_eq!(v.verify(&bearer(&new_token)), Err(AuthError::UnknownKey));
    clock.advance(2);
    assert_eq!(v.verify(&bearer(&new_token)), Ok("alice".to_owned()));
    assert_eq!(v.verify(&bearer(&old_token)), Err(AuthError::UnknownKey));

    // A broken rewrite keeps the keys that work.
    std::fs::write(&path, "{ not json").unwrap();
    touch(&path, 3_000_000);
    clock.advance(1_000);
    assert_eq!(v.verify(&bearer(&new_token)), Ok("alice".to_owned()));
    // So does a vanished file; its return is picked up.
    std::fs::remove_file(&path).unwrap();
    clock.advance(1_000);
    assert_eq!(v.verify(&bearer(&new_token)), Ok("alice".to_owned()));
    std::fs::write(&path, jwks_json(vec![jwk(&old, Algorithm::RS256, "2024")])).unwrap();
    touch(&path, 4_000_000);
    clock.advance(1_000);
    assert_eq!(v.verify(&bearer(&old_token)), Ok("alice".to_owned()));
    assert_eq!(v.verify(&bearer(&new_token)), Err(AuthError::UnknownKey));
}

#[test]
fn jwks_config_errors() {
    let dir = TempDir::new("jwks-errors");
    let rsa = rsa_key(RSA_A_PRIVATE);
    let check = |name: &str, contents: &str, needle: &str| {
        let path = dir.write(name, contents);
        let e = config_errors(&jwks_config(&path), &dir.0);
        assert!(has_error(&e, "identity.jwks_file", needle), "{name}: {e:?}");
    };
    check(
        "empty.json",
        r#"{"keys": []}"#,
        "no usable RS256 or ES256 signing key",
    );
    check("nokeys.json", r#"{"other": 1}"#, "not a JWKS");
    check("bad.json", "[", "not valid JSON");
    let oct = jwk(
        &EncodingKey::from_secret(b"0123456789abcdef0123456789abcdef"),
        Algorithm::HS256,
        "k",
    );
    check("oct.json", &jwks_json(vec![oct]), "symmetric");
    let dup = jwks_json(vec![
        jwk(&rsa, Algorithm::RS256, "k"),
        jwk(&rsa, Algorithm::RS256, "k"),
    ]);
    check("dup.json", &dup, "duplicate kid");
    let small_n =
        json!({"keys": [{"kty": "RSA", "kid": "s", "n": b64url(&[0xff; 128]), "e": "AQAB"}]});
    check("small.json", &small_n.to_string(), "1024 bits");
    let bad_point = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "p", "x": b64url(&[1; 32]), "y": b64url(&[2; 32])}]});
    check("point.json", &bad_point.to_string(), "P-256");

    let e = config_errors(&jwks_config(&dir.0.join("absent.json")), &dir.0);
    assert!(has_error(&e, "identity.jwks_file", "cannot read"), "{e:?}");

    // HS256 keys are never read from a JWKS.
    let path = dir.write(
        "ok.json",
        &jwks_json(vec![jwk(&rsa, Algorithm::RS256, "k")]),
    );
    let cfg = IdentityConfig {
        algorithm: Some("HS256".into()),
        secret: Some(SECRET.into()),
        ..jwks_config(&path)
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.jwks_file", "not used with HS256"),
        "{e:?}"
    );
    // Restricted to ES256, an RSA-only JWKS has no usable key.
    let cfg = IdentityConfig {
        algorithm: Some("ES256".into()),
        ..jwks_config(&path)
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.jwks_file", "no usable ES256"),
        "{e:?}"
    );
}
