//! Key material: reading key files (bounded), public keys in PEM and JWK
//! form, and the checks a key must pass before it verifies anything.
//!
//! Nothing here parses by hand: PEM files and JWKs become keys through
//! [`jsonwebtoken`]'s own key constructors (which read PEM with the `pem`
//! crate), the PKCS#1 `RSAPublicKey` is read by `pkcs1` (through `rsa`), RSA
//! key sizes and exponents are checked by `rsa`, P-256 points by `p256`, and
//! base64url by `base64`.

use std::io::Read;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::DecodingKey;
use jsonwebtoken::jwk::{Jwk, RSAKeyParameters};
use rsa::BigUint;

/// The largest key file (PEM, secret or JWKS) that is read, bytes.
const MAX_KEY_FILE_BYTES: u64 = 1 << 20;

/// The smallest accepted RSA modulus, bits. The largest is the `rsa` crate's
/// [`rsa::RsaPublicKey::MAX_SIZE`] (4096), which its verifier enforces too.
const MIN_RSA_BITS: usize = 2_048;

/// Reads a key file of at most [`MAX_KEY_FILE_BYTES`].
pub(super) fn read_capped(path: &Path) -> Result<Vec<u8>, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(format!("{} is larger than 1 MiB", path.display()));
    }
    Ok(bytes)
}

/// The public key of `alg` (RS256 or ES256) in the PEM file at `path`, read
/// by [`jsonwebtoken`]'s own constructors and checked: an RSA key by
/// [`check_rsa_public`], an EC key by [`check_ec_public`]. A file that
/// mentions a private key anywhere (`PRIVATE KEY`, `RSA PRIVATE KEY`, …, even
/// in a block that does not parse) is refused: it should not be on the
/// server at all.
pub(super) fn load_public_key(
    path: &Path,
    alg: jsonwebtoken::Algorithm,
) -> Result<DecodingKey, String> {
    let pem = read_capped(path)?;
    let shown = path.display();
    if pem.windows(11).any(|w| w == b"PRIVATE KEY") {
        return Err(format!(
            "{shown} holds a private key; give the public key only \
             (openssl pkey -in private.pem -pubout -out public.pem)"
        ));
    }
    match alg {
        jsonwebtoken::Algorithm::RS256 => {
            let key = DecodingKey::from_rsa_pem(&pem).map_err(|_| {
                format!("{shown} is not an RSA public key in PEM (-----BEGIN PUBLIC KEY-----)")
            })?;
            let (n, e) = rsa_public_der(key.as_bytes())
                .ok_or_else(|| format!("{shown} is not an RSA public key"))?;
            check_rsa_public(n, e).map_err(|r| format!("{shown}: {r}"))?;
            Ok(key)
        }
        jsonwebtoken::Algorithm::ES256 => {
            let key = DecodingKey::from_ec_pem(&pem).map_err(|_| {
                format!("{shown} is not an EC public key in PEM (-----BEGIN PUBLIC KEY-----)")
            })?;
            check_ec_public(&key).map_err(|r| format!("{shown}: {r}"))?;
            Ok(key)
        }
        _ => Err("unsupported algorithm".to_owned()),
    }
}

/// `(n, e)` of a PKCS#1 `RSAPublicKey` in DER (what
/// [`DecodingKey::from_rsa_pem`] holds), leading zeros stripped.
pub(super) fn rsa_public_der(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let key = rsa::pkcs1::RsaPublicKey::try_from(der).ok()?;
    Some((key.modulus.as_bytes(), key.public_exponent.as_bytes()))
}

/// An RSA public key is 2048 to 4096 bits (the backend refuses larger ones at
/// verification time) with a sane odd exponent: the `rsa` crate's own checks
/// (odd exponent from 3 to 2^33 - 1, odd modulus larger than it) plus the
/// minimum size.
pub(super) fn check_rsa_public(n: &[u8], e: &[u8]) -> Result<(), String> {
    let (n, e) = (BigUint::from_bytes_be(n), BigUint::from_bytes_be(e));
    let bits = n.bits();
    if !(MIN_RSA_BITS..=rsa::RsaPublicKey::MAX_SIZE).contains(&bits) {
        return Err(format!(
            "the RSA modulus is {bits} bits; 2048 to 4096 bits are accepted"
        ));
    }
    match rsa::RsaPublicKey::new(n, e) {
        Ok(_) => Ok(()),
        Err(rsa::Error::InvalidModulus) => Err("the RSA modulus is not valid".to_owned()),
        Err(_) => Err("the RSA public exponent is not valid".to_owned()),
    }
}

/// An EC key is a point on P-256 (what ES256 verifies with), as the `p256`
/// crate reads it from the key's SEC1 bytes.
pub(super) fn check_ec_public(key: &DecodingKey) -> Result<(), String> {
    p256::PublicKey::from_sec1_bytes(key.as_bytes())
        .map(|_| ())
        .map_err(|_| "not a valid P-256 (ES256) public key".to_owned())
}

/// The verifying key of an RSA JWK (`rsa` is its parameters), checked by
/// [`check_rsa_public`].
pub(super) fn rsa_jwk_key(jwk: &Jwk, rsa: &RSAKeyParameters) -> Result<DecodingKey, String> {
    let n = URL_SAFE_NO_PAD
        .decode(&rsa.n)
        .map_err(|_| "n is not base64url".to_owned())?;
    let e = URL_SAFE_NO_PAD
        .decode(&rsa.e)
        .map_err(|_| "e is not base64url".to_owned())?;
    check_rsa_public(&n, &e)?;
    DecodingKey::from_jwk(jwk).map_err(|_| "invalid RSA components".to_owned())
}

/// The verifying key of an EC JWK, checked by [`check_ec_public`].
pub(super) fn ec_jwk_key(jwk: &Jwk) -> Result<DecodingKey, String> {
    let key = DecodingKey::from_jwk(jwk).map_err(|_| "x or y is not base64url".to_owned())?;
    check_ec_public(&key)?;
    Ok(key)
}

#[cfg(test)]
mod tests;
