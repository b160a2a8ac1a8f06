//! A JWKS file as a key source: its RS256/ES256 signing keys by `kid`,
//! reread when the file changes (checked at most once per
//! [`JWKS_CHECK_INTERVAL_MS`] of the clock), keeping the previous keys when a
//! rewrite is invalid or the file vanishes. The file is read through
//! [`read_capped`] (at most 1 MiB); each key is parsed as a
//! [`jsonwebtoken::jwk::Jwk`] and checked by [`super::keys`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, KeyOperations, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::{Mutex, RwLock};
use serde::Deserialize;
use serde_json::Value;

use super::JWKS_CHECK_INTERVAL_MS;
use super::jwt::alg_name;
use super::keys::{ec_jwk_key, read_capped, rsa_jwk_key};

/// The keys of a JWKS file, reread when it changes.
pub(super) struct JwksSource {
    path: PathBuf,
    /// The configured `algorithm`, if any: only keys of it are used.
    only: Option<Algorithm>,
    keys: RwLock<Arc<KeySet>>,
    stamp: Mutex<Option<FileStamp>>,
    last_check_ms: AtomicU64,
}

/// One reading of the file: its usable keys.
pub(super) struct KeySet {
    keys: Vec<JwksKey>,
    skipped: usize,
    /// Which reading this is: 0 at load, one more at each reload that
    /// changed the keys (the token cache's epoch).
    pub(super) generation: u64,
}

/// One usable key: its `kid`, the algorithm it verifies, the key.
pub(super) struct JwksKey {
    kid: Option<String>,
    pub(super) alg: Algorithm,
    pub(super) key: DecodingKey,
}

/// What tells a changed file: modification time, length and (on Unix) inode,
/// so an atomic rename is seen even within one mtime tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp_of(path: &Path) -> std::io::Result<FileStamp> {
    let meta = std::fs::metadata(path)?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Ok(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode,
    })
}

impl KeySet {
    /// The key for `kid`; a token without a `kid` may use the only key.
    pub(super) fn find(&self, kid: Option<&str>) -> Option<&JwksKey> {
        match kid {
            Some(kid) => self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            None if self.keys.len() == 1 => self.keys.first(),
            None => None,
        }
    }
}

impl JwksSource {
    pub(super) fn load(
        path: PathBuf,
        only: Option<Algorithm>,
        now_ms: u64,
    ) -> Result<Self, Vec<String>> {
        let stamp = stamp_of(&path).ok();
        let set = load_jwks(&path, only)?;
        Ok(Self {
            path,
            only,
            keys: RwLock::new(Arc::new(set)),
            stamp: Mutex::new(stamp),
            last_check_ms: AtomicU64::new(now_ms),
        })
    }

    pub(super) fn algorithms(&self) -> &'static [Algorithm] {
        match self.only {
            Some(Algorithm::RS256) => &[Algorithm::RS256],
            Some(Algorithm::ES256) => &[Algorithm::ES256],
            _ => &[Algorithm::RS256, Algorithm::ES256],
        }
    }

    /// The current keys, rereading the file first if it is time to check and
    /// it changed. Only one caller checks at a time; the others use the keys
    /// they find. A file that fails to load keeps the previous keys.
    pub(super) fn current(&self, now_ms: u64) -> Arc<KeySet> {
        let last = self.last_check_ms.load(Ordering::Acquire);
        let due = now_ms < last || now_ms - last >= JWKS_CHECK_INTERVAL_MS;
        if due
            && self
                .last_check_ms
                .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.reload_if_changed();
        }
        self.keys.read().clone()
    }

    fn reload_if_changed(&self) {
        let mut seen = self.stamp.lock();
        let stamp = match stamp_of(&self.path) {
            Ok(stamp) => stamp,
            Err(e) => {
                if seen.take().is_some() {
                    tracing::warn!(path = %self.path.display(), error = %e,
                        "cannot read the JWKS file; keeping its previous keys");
                }
                return;
            }
        };
        if *seen == Some(stamp) {
            return;
        }
        // Recorded before reading: a write after this point changes the
        // stamp again and is picked up at the next check.
        *seen = Some(stamp);
        match load_jwks(&self.path, self.only) {
            Ok(mut set) => {
                tracing::info!(path = %self.path.display(), keys = set.keys.len(),
                    skipped = set.skipped, "reloaded the JWKS file");
                let mut keys = self.keys.write();
                // New keys: tokens verified with the old ones are verified
                // again (the token cache drops them).
                set.generation = keys.generation.wrapping_add(1);
                *keys = Arc::new(set);
            }
            Err(problems) => {
                tracing::warn!(path = %self.path.display(), problems = %problems.join("; "),
                    "the changed JWKS file is invalid; keeping its previous keys");
            }
        }
    }

    pub(super) fn describe(&self) -> String {
        let set = self.keys.read().clone();
        let mut algs: Vec<&str> = set.keys.iter().map(|k| alg_name(k.alg)).collect();
        algs.sort_unstable();
        algs.dedup();
        let skipped = if set.skipped > 0 {
            format!(", {} unusable skipped", set.skipped)
        } else {
            String::new()
        };
        format!(
            "JWKS {}: {} key(s) ({}{skipped}), reread when it changes",
            self.path.display(),
            set.keys.len(),
            algs.join(", ")
        )
    }
}

/// Reads a JWKS: every usable RS256/ES256 signing key, skipping keys of other
/// types or uses (an identity provider's JWKS may hold encryption keys). A
/// usable key that is broken, a duplicate `kid`, or no usable key at all
/// rejects the file.
fn load_jwks(path: &Path, only: Option<Algorithm>) -> Result<KeySet, Vec<String>> {
    let bytes = read_capped(path).map_err(|e| vec![e])?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| vec![format!("{} is not valid JSON: {e}", path.display())])?;
    let Some(Value::Array(raw_keys)) = value.get("keys") else {
        return Err(vec![format!(
            "{} is not a JWKS: expected an object with a \"keys\" array",
            path.display()
        )]);
    };
    let mut problems = Vec::new();
    let mut skipped_reasons = Vec::new();
    let mut keys: Vec<JwksKey> = Vec::new();
    for (i, raw) in raw_keys.iter().enumerate() {
        let label = match raw.get("kid").and_then(Value::as_str) {
            Some(kid) => format!("keys[{i}] (kid {kid:?})"),
            None => format!("keys[{i}]"),
        };
        match jwks_key(raw, only) {
            Ok(key) => {
                if key.kid.is_some() && keys.iter().any(|k| k.kid == key.kid) {
                    problems.push(format!("{label}: duplicate kid"));
                } else {
                    keys.push(key);
                }
            }
            Err(Usable::Skip(reason)) => skipped_reasons.push(format!("{label}: {reason}")),
            Err(Usable::Broken(reason)) => problems.push(format!("{label}: {reason}")),
        }
    }
    if !skipped_reasons.is_empty() {
        tracing::warn!(path = %path.display(), skipped = %skipped_reasons.join("; "),
            "JWKS keys that cannot verify RS256/ES256 tokens are ignored");
    }
    if keys.is_empty() && problems.is_empty() {
        let wanted = match only {
            Some(alg) => alg_name(alg),
            None => "RS256 or ES256",
        };
        let mut reason = format!("{} has no usable {wanted} signing key", path.display());
        if !skipped_reasons.is_empty() {
            reason.push_str(&format!(" (skipped: {})", skipped_reasons.join("; ")));
        }
        problems.push(reason);
    }
    if problems.is_empty() {
        Ok(KeySet {
            keys,
            skipped: skipped_reasons.len(),
            generation: 0,
        })
    } else {
        Err(problems)
    }
}

enum Usable {
    /// Not a key this server uses (another type, algorithm or use).
    Skip(String),
    /// A key this server would use, but it is broken.
    Broken(String),
}

fn jwks_key(raw: &Value, only: Option<Algorithm>) -> Result<JwksKey, Usable> {
    let jwk = Jwk::deserialize(raw)
        .map_err(|_| Usable::Skip("not an RSA or EC public key in JWK form".to_owned()))?;
    if let Some(public_use) = &jwk.common.public_key_use
        && *public_use != PublicKeyUse::Signature
    {
        return Err(Usable::Skip(
            "not a signing key (use is not \"sig\")".to_owned(),
        ));
    }
    if let Some(ops) = &jwk.common.key_operations
        && !ops.contains(&KeyOperations::Verify)
    {
        return Err(Usable::Skip(
            "key_ops does not include \"verify\"".to_owned(),
        ));
    }
    let declared = jwk.common.key_algorithm;
    let (alg, key) = match &jwk.algorithm {
        AlgorithmParameters::RSA(rsa) => {
            if !matches!(declared, None | Some(KeyAlgorithm::RS256)) {
                return Err(Usable::Skip(format!(
                    "an RSA key for {}, not RS256",
                    declared.map_or_else(String::new, |a| a.to_string())
                )));
            }
            let key = rsa_jwk_key(&jwk, rsa).map_err(Usable::Broken)?;
            (Algorithm::RS256, key)
        }
        AlgorithmParameters::EllipticCurve(ec) => {
            if ec.curve != EllipticCurve::P256 {
                return Err(Usable::Skip(
                    "an EC key on another curve than P-256 (ES256)".to_owned(),
                ));
            }
            if !matches!(declared, None | Some(KeyAlgorithm::ES256)) {
                return Err(Usable::Skip(
                    "a P-256 key not declared for ES256".to_owned(),
                ));
            }
            let key = ec_jwk_key(&jwk).map_err(Usable::Broken)?;
            (Algorithm::ES256, key)
        }
        AlgorithmParameters::OctetKey(_) => {
            return Err(Usable::Skip(
                "a symmetric (oct) key: HMAC tokens are never accepted with a JWKS".to_owned(),
            ));
        }
        AlgorithmParameters::OctetKeyPair(_) => {
            return Err(Usable::Skip("an OKP (EdDSA) key: not supported".to_owned()));
        }
    };
    if only.is_some_and(|o| o != alg) {
        return Err(Usable::Skip(format!(
            "an {} key, but identity.algorithm restricts keys to {}",
            alg_name(alg),
            only.map_or("", alg_name)
        )));
    }
    Ok(JwksKey {
        kid: jwk.common.key_id.clone(),
        alg,
        key,
    })
}

#[cfg(test)]
mod tests;
