//! Tests of the verified-token cache: hits skip verification (counted by
//! [`Verifier::token_cache_stats`]), time is checked on every hit, key
//! rotation drops entries, the capacity holds, only exact tokens hit and
//! only successes are cached.

use super::{Cached, TokenCache};
use crate::identity::tests::*;
use crate::identity::*;

fn stats(v: &Verifier) -> TokenCacheStats {
    v.token_cache_stats()
        .expect("jwt and dev modes have a token cache")
}

#[test]
fn a_hit_skips_verification() {
    let (v, _clock) = hs_verifier();
    let token = hs(&claims(60));
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
    assert_eq!(
        stats(&v),
        TokenCacheStats {
            entries: 1,
            hits: 0,
            verifications: 1
        }
    );
    for _ in 0..3 {
        assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
    }
    assert_eq!(
        stats(&v),
        TokenCacheStats {
            entries: 1,
            hits: 3,
            verifications: 1
        }
    );
}

#[test]
fn a_hit_keeps_scopes_and_tenant() {
    let clock = FakeClock::new(NOW_MS);
    let cfg = IdentityConfig {
        tenant_claim: Some("org".into()),
        ..hs256_config()
    };
    let v = build(&cfg, Path::new("."), &clock);
    let mut c = claims(60);
    c["scope"] = json!("read tollgate:feedback");
    c["org"] = json!("acme");
    let token = hs(&c);
    let first = v.identify(&bearer(&token), None).unwrap();
    let second = v.identify(&bearer(&token), None).unwrap();
    assert_eq!(first, second);
    assert!(second.feedback);
    assert_eq!(second.tenant.as_deref(), Some("acme"));
    assert_eq!(stats(&v).hits, 1);
}

#[test]
fn an_expired_token_is_refused_on_a_hit() {
    let (v, clock) = hs_verifier();
    let token = hs(&claims(60));
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
    // exp is now + 60 s and the leeway 30 s: valid until 89.999 s.
    clock.advance(89_999);
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
    clock.advance(1);
    assert_eq!(v.verify(&bearer(&token)), Err(AuthError::Expired));
    let s = stats(&v);
    assert_eq!(
        (s.hits, s.verifications),
        (2, 1),
        "the refusal came from the cache"
    );
    // Still refused, whether from the cache or verified again.
    clock.advance(3_600_000);
    assert_eq!(v.verify(&bearer(&token)), Err(AuthError::Expired));
}

#[test]
fn nbf_is_checked_on_a_hit() {
    let (v, clock) = hs_verifier();
    let mut c = claims(600);
    c["nbf"] = json!(NOW_S + 20);
    let token = hs(&c);
    // nbf is 20 s ahead, within the 30 s leeway: valid and cached.
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
    // The wall clock steps back 11 s: nbf is now 31 s ahead.
    clock.set(NOW_MS - 11_000);
    assert_eq!(v.verify(&bearer(&token)), Err(AuthError::NotYetValid));
    assert_eq!(stats(&v).verifications, 1, "refused from the cache");
    clock.set(NOW_MS);
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
}

#[test]
fn a_token_differing_in_one_byte_is_not_a_hit() {
    let (v, _clock) = hs_verifier();
    let token = hs(&claims(60));
    assert_eq!(v.verify(&bearer(&token)), Ok("alice".to_owned()));
    // Every position of the token, changed to another base64url letter.
    for i in 0..token.len() {
        let mut bytes = token.clone().into_bytes();
        if bytes[i] == b'.' {
            continue;
        }
        bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(bytes).unwrap();
        let before = stats(&v);
        let result = v.verify(&bearer(&altered));
        let after = stats(&v);
        assert_ne!(result, Ok("alice".to_owned()), "byte {i}: {altered}");
        assert_eq!(
            after.hits, before.hits,
            "byte {i} was answered from the cache"
        );
        assert_eq!(after.verifications, before.verifications + 1);
    }
    // Refusals are never cached: the original is the only entry.
    assert_eq!(stats(&v).entries, 1);
}

#[test]
fn a_refused_token_is_verified_every_time() {
    let (v, _clock) = hs_verifier();
    let forged = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(b"another-secret-0123456789abcdef0123"),
        None,
        &claims(60),
    );
    for _ in 0..3 {
        assert_eq!(v.verify(&bearer(&forged)), Err(AuthError::BadSignature));
    }
    let s = stats(&v);
    assert_eq!((s.entries, s.hits, s.verifications), (0, 0, 3));
}

#[test]
fn jwks_rotation_drops_cached_tokens() {
    let dir = TempDir::new("cache-rotation");
    let old = rsa_key(RSA_A_PRIVATE);
    let new = ec_key(EC_B_PRIVATE);
    let path = dir.write(
        "jwks.json",
        &jwks_json(vec![jwk(&old, Algorithm::RS256, "2024")]),
    );
    touch(&path, 1_000_000);
    let clock = FakeClock::new(NOW_MS);
    let cfg = IdentityConfig {
        jwks_file: Some(path.clone()),
        issuer: Some(ISSUER.into()),
        audience: Some(AUDIENCE.into()),
        ..IdentityConfig::new(IdentityMode::Jwt)
    };
    let v = build(&cfg, Path::new("."), &clock);
    let old_token = sign(Algorithm::RS256, &old, Some("2024"), &claims(600));
    assert_eq!(v.verify(&bearer(&old_token)), Ok("alice".to_owned()));
    assert_eq!(v.verify(&bearer(&old_token)), Ok("alice".to_owned()));
    assert_eq!(stats(&v).hits, 1);

    // The file now holds only the new key: the cached token is refused.
    std::fs::write(&path, jwks_json(vec![jwk(&new, Algorithm::ES256, "2025")])).unwrap();
    touch(&path, 2_000_000);
    clock.advance(1_001);
    assert_eq!(v.verify(&bearer(&old_token)), Err(AuthError::UnknownKey));
    let s = stats(&v);
    assert_eq!((s.hits, s.verifications), (1, 2));
    assert_eq!(s.entries, 0, "every entry of the old keys is dropped");

    // The same key rewritten (a new reading, same keys) also starts over.
    let new_token = sign(Algorithm::ES256, &new, Some("2025"), &claims(600));
    assert_eq!(v.verify(&bearer(&new_token)), Ok("alice".to_owned()));
    assert_eq!(stats(&v).entries, 1);
    std::fs::write(&path, jwks_json(vec![jwk(&new, Algorithm::ES256, "2025")])).unwrap();
    touch(&path, 3_000_000);
    clock.advance(1_001);
    assert_eq!(v.verify(&bearer(&new_token)), Ok("alice".to_owned()));
    assert_eq!(
        stats(&v).verifications,
        4,
        "verified again after the reload"
    );
}

#[test]
fn an_insert_verified_with_older_keys_is_not_kept() {
    let cache = TokenCache::new(64);
    let cached = |user: &str| Cached {
        identity: Identity {
            user: tollgate_core::IdBuf::new(user).unwrap(),
            feedback: false,
            tenant: None,
        },
        exp_s: 100,
        nbf_s: None,
    };
    let a = super::digest("a");
    let b = super::digest("b");
    cache.insert(a, 0, cached("a"));
    // The keys changed (epoch 1) while `b` was being verified with epoch 0.
    assert!(cache.get(&a, 1).is_none());
    cache.insert(b, 0, cached("b"));
    assert!(cache.get(&b, 1).is_none());
    assert!(cache.get(&b, 0).is_none(), "an older epoch never hits");
    cache.insert(b, 1, cached("b"));
    assert_eq!(cache.get(&b, 1).unwrap().identity.user, "b");
}

#[test]
fn the_capacity_holds_under_many_distinct_tokens() {
    let (v, _clock) = hs_verifier();
    let n = TOKEN_CACHE_CAPACITY + TOKEN_CACHE_CAPACITY / 4;
    for i in 0..n {
        let mut c = claims(600);
        c["sub"] = json!(format!("u{i}"));
        assert_eq!(v.verify(&bearer(&hs(&c))), Ok(format!("u{i}")));
        if i % 4_096 == 0 {
            assert!(stats(&v).entries <= TOKEN_CACHE_CAPACITY);
        }
    }
    let s = stats(&v);
    assert_eq!(s.verifications, n as u64);
    assert!(s.entries <= TOKEN_CACHE_CAPACITY, "{s:?}");
    assert!(s.entries > TOKEN_CACHE_CAPACITY / 2, "{s:?}");
}

#[test]
fn the_clock_spares_entries_that_were_hit() {
    // 16 shards of 16 entries: the 8 hot ones never fill a shard.
    let cache = TokenCache::new(256);
    let cached = Cached {
        identity: Identity {
            user: tollgate_core::IdBuf::new("u").unwrap(),
            feedback: false,
            tenant: None,
        },
        exp_s: 100,
        nbf_s: None,
    };
    let hot: Vec<_> = (0..8).map(|i| super::digest(&format!("hot{i}"))).collect();
    for d in &hot {
        cache.insert(*d, 0, cached.clone());
    }
    for i in 0..10_000 {
        for d in &hot {
            // Evicted hot entries come back; then they stay.
            if cache.get(d, 0).is_none() {
                cache.insert(*d, 0, cached.clone());
            }
        }
        cache.insert(super::digest(&format!("cold{i}")), 0, cached.clone());
        assert!(cache.stats().entries <= 256);
    }
    let kept = hot.iter().filter(|d| cache.get(d, 0).is_some()).count();
    assert_eq!(kept, hot.len(), "entries hit at every turn survive");
}
