//! The identity tests' shared keys and helpers, and the tests of the
//! [`Verifier`] entry itself (minting, dev mode, messages). Each part's own
//! tests are beside it: `jwt/tests.rs`, `jwks/tests.rs`, `keys/tests.rs`,
//! `config/tests.rs`, `trusted/tests.rs`.

pub(super) use std::path::{Path, PathBuf};
pub(super) use std::sync::Arc;
pub(super) use std::time::{Duration, SystemTime};

pub(super) use axum::http::header::AUTHORIZATION;
pub(super) use axum::http::{HeaderMap, HeaderValue};
pub(super) use base64::Engine;
pub(super) use base64::engine::general_purpose::URL_SAFE_NO_PAD;
pub(super) use jsonwebtoken::jwk::{Jwk, JwkSet};
pub(super) use jsonwebtoken::{Algorithm, EncodingKey, Header};
pub(super) use serde_json::{Value, json};
pub(super) use tollgate_core::FakeClock;

use super::*;

//   openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out rsa.pem
//   openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ec.pem
//   openssl pkey -in KEY.pem -pubout
// They sign nothing but these tests.

pub(super) const RSA_A_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQClbgkH3lUCA+1Z
f62w4z8Ir14JXlew2B2RyyTfKgbG5smARNsjiBtnV/If/JmbXkneRI+9920fcbED
+mJkXKjk0QLiUi3SjJjagsYTUAZDml9zWd6vqlnZ+tZb3kaAYgdSgibWKhOJZYEQ
9aAw5Dxz8KQUM2WRRqg9KLhr0zE+amF57z4jtoLPo944OiFenxne5PzKZeC4VXgy
Pw3ut61JDDVNacl2UpgSqHBS4wQo59DaCEq6QKydDDk0vMDVsaR1QntvTDaI05ii
/DRto/BLmvHKaZpWGcuAN9gbPDdZWF6JV+GaCaZQUN4wHDZOPu6+6VKAejC5e7g9
Tju7Gj6xAgMBAAECggEAD52OpCvAPfe1bpqPAHC++TimiX9aizKnPeUdVqRurdVI
pX86aUT2gz+Jtyu+qywQEHdL0zx5FDwE39GBeqRFfA3fthHYSfTkE9I+1MFbygNX
KboMu2u63gjftZ3KbWFze/4VoOcpX3GRqJJq+9p7e102e8KrPnabOGSw3dq6XgAB
R8uxzqg36n1Y1BpA5iuoUwaZIzkfYYdWxTlcEzBKBt8HPdGCjyXa26W5SjOK80KI
0ZrLcLXLnHr3Crpmxqqom83whcox0zN43OfJg/uQwU4mpfK9rENmc4IVOgEjkiJs
99e5IWSdC9F8BuIelpIQLlMQNnlV/7k2a+idI61BkQKBgQDZ62QIgx9f6oH9hKV7
3UNfgWbQE8lqQJmqmtmmLl1KvJ6C4GkZZjKroo2qiQeZIUugzjLQ7q5spEUyvrLA
z5PvmUn2WYupNELJl0YKSuyIBnkIOummnMS2m31jTABpJHzSLcKJ6kpb6LAeVvnm
rGsXfGLnIgvf2Tqoi5U7yfnrOQKBgQDCVoYYM08+AyzZ/US3h8Urdxnrdg4AJmif
f91xPx9ViZ9hwfsTP9TbMRt35nA4yiiIJJisWoQYIU7cbfjOP65l32nx67WUwJzD
+ymyQt3x5D18Lv2yZvKqhksBLIj9hqOduiTWCBaBhKqiwxTnibdWwJ3XExfBi/CR
LyPWBSjXOQKBgE7iszeRn83s6lmHpxALrNPp1/oC76qS8A2eOKO7rPHdDdR6wBD9
ueH/2iCdsi5wqxvvCN4xSNrzLEmOVs8NVZQqfWe8Sp5Z2MN5C1W2gaFMFowwJ1y0
61DfQKitXoixOK4s+ntKYNichwS0n4otaCb8VCEvZfUGggF5ZfBa0SmhAoGAa7iY
NbvjNcV+zApmV7ELas9m76yNkCm6Hoc60PYjQT+6t+5VZNMiAqnSxwBVvjTYiLZ4
Zjj6NYHo+6h9nJ2R5ugTCsUT7rNhcgS7lRMZgWZ5ameFuqjz4+/yjWEJQjaqZNh0
aKstBnfqObQW10zv8kdsdnYf2ene3CscGxrbC4kCgYBqjSW74JqUIxlAjc02JA/H
Sl7asjSGsfSV1IK0U6e6jfBghejurqSHvyUHR8PH6YMpcYfX0+Ldwc7iFLeto5Zx
7orRubFYIn4kmUUw0X3cXvUDKcR04DTTSEJSZUrHNlFLvvFLfOVfChlfrXl7udFr
2UxEQ0n68K51K6WKSXVZFA==
-----END PRIVATE KEY-----
";

pub(super) const RSA_A_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEApW4JB95VAgPtWX+tsOM/
CK9eCV5XsNgdkcsk3yoGxubJgETbI4gbZ1fyH/yZm15J3kSPvfdtH3GxA/piZFyo
5NEC4lIt0oyY2oLGE1AGQ5pfc1ner6pZ2frWW95GgGIHUoIm1ioTiWWBEPWgMOQ8
c/CkFDNlkUaoPSi4a9MxPmphee8+I7aCz6PeODohXp8Z3uT8ymXguFV4Mj8N7ret
SQw1TWnJdlKYEqhwUuMEKOfQ2ghKukCsnQw5NLzA1bGkdUJ7b0w2iNOYovw0baPw
S5rxymmaVhnLgDfYGzw3WVheiVfhmgmmUFDeMBw2Tj7uvulSgHowuXu4PU47uxo+
sQIDAQAB
-----END PUBLIC KEY-----
";

pub(super) const RSA_B_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQCe48/omV3H8dYD
bJGFUBB2xXCJaWz8h/9Bhs/jSkxPa/aGunEUvGBmlij6DoLP6xt/ud3PeCXRXBji
Khki5loVYnq6QML7sP4j0zeR2vaVacQxARf5SqwYgCmPhwDNhoygSs479k2Xt6vk
fWKEMPVWxoD1mXYUCddwQ1xSllxRDHoUqRO+mVGoUT+ArXFxQ0y+hK/5Tmwtj0I7
nJorEm2ZCkEB9s8KEMYcvN4JC9gBIL69CQx0S0Mop3mZ8RlavBUu8Vr9KjSevNqZ
hHN/RKss98DGpGJE9jm/nwuYJ234MrRDOMgLNnlF/j2lo3ysn/5hcaJngzoSdjhC
BrAVooj5AgMBAAECggEAE4uPCPwKtPyK+L9bdER5zf5yHjklgrgA/pDElF9QnUl4
2TBoliYpDp2Em2P7E/QGHTNiNXIAZu1XE0Ud8/TVmoFTewNZ6OeoD4SdNpgykoUg
8O1DQ3N70YS8eA8hmmaleFdTYL1m5JWfs7r3yi6Sk3LWLMAMriDay1DB89fSsdZu
/ifOtqCuSz2p5IWQYXOsdeo0/7cX2qqmvj1pjdrkBQJTqs6TNTzw/L1uBRfPVsrY
K9PIrLfOGCsmBgwbSuPNlIQ+oyZnq3IIF9VAQEQpWspM9J43UgIH21XOEyx2s+kj
1QrbMV+PkDF2cqfKtuSlHkxr2IvuK4VTH+UvrhqXPQKBgQDdPMcCE9vYsiLzb4eA
wOcv0pQlEZS6prqhi8bYUv2iPOi6wAG9y/6AvT4I0CVlMCD9CEeDwaZYPysuIUlS
3mAbC4rsuCMacLZTvFPkaqleZj2XpSlLRVFfWJ+nFnbOU/LsVCH9/BmQExh1+7Ej
CUtcrgV5aOYYjD6pg+dK71QqFQKBgQC32x7YFuaQ2gwf5+p1XD9QZsUpA+eoDjOV
6t7OUrx65WuQNWP6kUW7Bu8FymgQ8c/Y/iqyu7oMbBf3kZQuAcAoJBaiPWe89coE
Qqzic9GKlrV4EW5jzHOtUpUALX2Y7/c6rrEqifr9pBI5cBj33eQdolI8UYZlQEbs
Hm7sP+JQVQKBgGuZXaizA9+Wc8011w9VwprNreOBc3Z8FJTxKFqZsmWvffkl3TLz
/embIIqkwSs/hyvJVQ7NphuRTWz4H3NAWDmPGZgbzmbTnrmHBL446frReu9AEp9b
LUJUFgHruQiMZ79tA8NFUyFxSBpJuVMy+AYxVNRBoncZ7nf/gQQ+9g4pAoGBAKFS
uni/d2ZIfXUNiPObks6Yro0zqPQUKf10zjXZ8Rog7kXmIyj8iWP3TIoXNUMQ+uCa
/JpCEJjPzCPl8FCCJrrSF64aFUl/ndgpLQuytn1Vijulh+g3wJSnrqguQlOM07EB
EeGSmtIuQfN2QeJUJ9I82M2mdzems9SBS7EuyQTVAoGBAJPaOaxY/dbCHO7SZsU3
fvbXxf5Kfx1kvrQVcFy8dsFv1FwZLDg0MelvkKpnnJkQSM1qM6oc1qq2Gau50CMO
WMW2mp5ePyKQNMBXxbpmKpl8OaBJDjPzmImUh9n47eoUmSlRDcWbF1Ujv/C4V8kL
ub8XOClerQC7VDtQxk08CEbR
-----END PRIVATE KEY-----
";

pub(super) const EC_A_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg7E6l+szeNMvAHXLV
ahn5eCblNNER1K5BeonG6il6nYmhRANCAATPjeIs2kViTzdwUtyEjBCQ8GnbYCxN
ilDVbjxfpIsyUpG3IuCpangLYJqrESe/x5Ao/21xBRNBIUrhe7ejgyEn
-----END PRIVATE KEY-----
";

pub(super) const EC_A_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEz43iLNpFYk83cFLchIwQkPBp22As
TYpQ1W48X6SLMlKRtyLgqWp4C2CaqxEnv8eQKP9tcQUTQSFK4Xu3o4MhJw==
-----END PUBLIC KEY-----
";

pub(super) const EC_B_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgieU5mqy/hc7pYgln
XUhcV3Qbs7OgimtXUfVYJluY6RmhRANCAARBTQ1IZeiCWb2hrfKrsL4r1NlJ98J0
ks8PgldkcU9+N61NsEaD8S1xOZdGAtdR4csp/uUBb9HgPZx2ULbbSLZV
-----END PRIVATE KEY-----
";

/// RSA 1024: too small.
pub(super) const RSA_1024_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQCtrHEvFcSHmshy7nyDR4/Wjf9l
Qy/SoyoE+PE6YB+RNJnK0Kxr46ao7iNI+VVIQ+IyjDi88V4bFVTq+w+IjIBQ554N
DJkERGzzgsoj7pajE6ZUOFodUq0jgnv3ytfV7WFwWEAyFJE6WtcWME/WSJ9SeS5j
dk2cIg2qIiRjCmBoOQIDAQAB
-----END PUBLIC KEY-----
";

/// EC P-384: not ES256.
pub(super) const EC_P384_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEMOwIzXnYNn1mvwLiRnAlCSvr1xIt2jl5
IifMeaYYG2ZQ/vk+46q15N695vwLgKpjOmFWNGLVvZEbbOSHvORpSGsgE9Wc/YPf
Ji9YF+U2Y4eLQi7F4x1G89R/3SZLShCg
-----END PUBLIC KEY-----
";

pub(super) const NOW_MS: u64 = 1_700_000_000_000;
pub(super) const NOW_S: i64 = 1_700_000_000;
pub(super) const SECRET: &str = "test-secret-0123456789abcdef0123456789";
pub(super) const ISSUER: &str = "https://issuer.test";
pub(super) const AUDIENCE: &str = "tollgate";

/// A directory removed when dropped.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("tollgate-identity-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    pub(super) fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("write temp file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Unpadded base64url, as JWTs and JWKs are written.
pub(super) fn b64url(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

pub(super) fn hs256_config() -> IdentityConfig {
    IdentityConfig {
        algorithm: Some("HS256".into()),
        secret: Some(SECRET.into()),
        issuer: Some(ISSUER.into()),
        audience: Some(AUDIENCE.into()),
        ..IdentityConfig::new(IdentityMode::Jwt)
    }
}

pub(super) fn build(cfg: &IdentityConfig, dir: &Path, clock: &FakeClock) -> Verifier {
    match Verifier::from_config(cfg, dir, Arc::new(clock.clone())) {
        Ok(v) => v,
        Err(errors) => panic!("config refused: {errors:?}"),
    }
}

pub(super) fn config_errors(cfg: &IdentityConfig, dir: &Path) -> Vec<FieldError> {
    match Verifier::from_config(cfg, dir, Arc::new(FakeClock::new(NOW_MS))) {
        Ok(v) => panic!("config accepted: {v:?}"),
        Err(errors) => errors,
    }
}

pub(super) fn has_error(errors: &[FieldError], path: &str, needle: &str) -> bool {
    errors
        .iter()
        .any(|e| e.path == path && e.reason.contains(needle))
}

/// Standard claims for alice, expiring `exp_in_s` from now.
pub(super) fn claims(exp_in_s: i64) -> Value {
    json!({ "sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "iat": NOW_S, "exp": NOW_S + exp_in_s })
}

pub(super) fn sign(alg: Algorithm, key: &EncodingKey, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).expect("sign")
}

pub(super) fn hs(claims: &Value) -> String {
    sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(SECRET.as_bytes()),
        None,
        claims,
    )
}

pub(super) fn rsa_key(pem: &str) -> EncodingKey {
    EncodingKey::from_rsa_pem(pem.as_bytes()).expect("rsa pem")
}

pub(super) fn ec_key(pem: &str) -> EncodingKey {
    EncodingKey::from_ec_pem(pem.as_bytes()).expect("ec pem")
}

pub(super) fn bearer(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).expect("header value"),
    );
    headers
}

pub(super) fn jwk(key: &EncodingKey, alg: Algorithm, kid: &str) -> Jwk {
    let mut jwk = Jwk::from_encoding_key(key, alg).expect("jwk");
    jwk.common.key_id = Some(kid.to_owned());
    jwk
}

pub(super) fn jwks_json(keys: Vec<Jwk>) -> String {
    serde_json::to_string(&JwkSet { keys }).expect("jwks json")
}

/// Forces a distinct modification time, so a rewrite within one mtime
/// tick is still seen.
pub(super) fn touch(path: &Path, secs: u64) {
    let file = std::fs::File::options()
        .write(true)
        .open(path)
        .expect("open");
    file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
        .expect("set mtime");
}

pub(super) fn hs_verifier() -> (Verifier, FakeClock) {
    let clock = FakeClock::new(NOW_MS);
    (build(&hs256_config(), Path::new("."), &clock), clock)
}

#[test]
fn verifier_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Verifier>();
    assert_send_sync::<AuthError>();
}

#[test]
fn mint_verify_round_trip_hs256() {
    let (v, clock) = hs_verifier();
    assert!(v.can_mint());
    let token = v.mint("alice", 60).unwrap();
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
    // The claims carry the configured issuer and audience, times from the clock.
    let payload = token.split('.').nth(1).unwrap();
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    assert_eq!(claims["iss"], ISSUER);
    assert_eq!(claims["aud"], AUDIENCE);
    assert_eq!(claims["iat"], NOW_S);
    assert_eq!(claims["exp"], NOW_S + 60);
    // It expires after ttl + leeway.
    clock.advance(89_999);
    assert!(v.verify(&bearer(&token)).is_ok());
    clock.advance(1);
    assert_eq!(v.verify(&bearer(&token)), Err(AuthError::Expired));

    assert!(matches!(v.mint("", 60), Err(MintError::InvalidUser(_))));
    assert!(matches!(
        v.mint(&"x".repeat(513), 60),
        Err(MintError::InvalidUser(_))
    ));
    assert!(matches!(v.mint("alice", 0), Err(MintError::InvalidTtl)));
    assert!(matches!(
        v.mint("alice", u64::MAX),
        Err(MintError::InvalidTtl)
    ));
}

#[test]
fn dev_mode_uses_the_well_known_secret() {
    let clock = FakeClock::new(NOW_MS);
    let v = build(&IdentityConfig::dev(), Path::new("."), &clock);
    assert_eq!(v.mode(), IdentityMode::Dev);
    assert!(
        v.describe()
            .starts_with("dev (HS256 with the well-known dev secret: NOT for production")
    );
    let token = v.mint("alice", 60).unwrap();
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
    // Anyone who knows the public secret can mint: that is what dev means.
    let c = json!({ "sub": "eve", "exp": NOW_S + 60 });
    let token = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(DEV_SECRET.as_bytes()),
        None,
        &c,
    );
    assert_eq!(v.verify(&bearer(&token)), Ok("eve".to_owned()));
    // But not with the algorithm unconfigured: still HS256 only.
    let rs = sign(Algorithm::RS256, &rsa_key(RSA_A_PRIVATE), None, &c);
    assert_eq!(v.verify(&bearer(&rs)), Err(AuthError::AlgorithmNotAllowed));
}

#[test]
fn debug_output_never_shows_the_secret() {
    let cfg = hs256_config();
    let shown = format!("{cfg:?}");
    assert!(
        !shown.contains(SECRET) && shown.contains("[redacted]"),
        "{shown}"
    );
    let (v, _) = hs_verifier();
    assert!(!format!("{v:?}").contains(SECRET));
}

#[test]
fn messages_are_client_safe_sentences() {
    let all = [
        AuthError::MissingCredentials,
        AuthError::NotBearer,
        AuthError::Malformed("the bearer token is empty"),
        AuthError::AlgorithmNotAllowed,
        AuthError::UnknownKey,
        AuthError::BadSignature,
        AuthError::MissingExpiry,
        AuthError::Expired,
        AuthError::NotYetValid,
        AuthError::WrongIssuer,
        AuthError::WrongAudience,
        AuthError::MissingUserClaim("sub".into()),
        AuthError::InvalidUserId("it is empty"),
        AuthError::MissingTrustedHeader,
        AuthError::Unverifiable,
    ];
    let mut codes: Vec<&str> = all.iter().map(AuthError::code).collect();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), all.len());
    for e in &all {
        let m = e.message();
        assert!(
            !m.is_empty() && !m.contains(SECRET) && !m.contains("BEGIN"),
            "{m}"
        );
    }
}
