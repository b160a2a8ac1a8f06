//! Tests of key material and its checks.

use rsa::BigUint;

use super::*;
use crate::identity::tests::*;

#[test]
fn rsa_public_key_parsing() {
    let key = DecodingKey::from_rsa_pem(RSA_A_PUBLIC.as_bytes()).unwrap();
    let (n, e) = rsa_public_der(key.as_bytes()).unwrap();
    assert_eq!(BigUint::from_bytes_be(n).bits(), 2_048);
    assert_eq!(e, [1, 0, 1]);
    assert!(check_rsa_public(n, e).is_ok());
    assert!(check_rsa_public(n, &[1]).is_err());
    assert!(check_rsa_public(n, &[1, 0, 0]).is_err());
    assert!(rsa_public_der(&[0x30, 0x03, 0x02, 0x01]).is_none());
    assert!(rsa_public_der(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
    assert!(rsa_public_der(&[]).is_none());
}

#[test]
fn rsa_key_sizes_and_exponents() {
    let key = DecodingKey::from_rsa_pem(RSA_A_PUBLIC.as_bytes()).unwrap();
    let (n, _) = rsa_public_der(key.as_bytes()).unwrap();
    // The smallest and largest sane exponents; even ones never.
    assert!(check_rsa_public(n, &[3]).is_ok());
    assert!(check_rsa_public(n, &[1, 0xff, 0xff, 0xff, 0xff]).is_ok());
    assert!(check_rsa_public(n, &[2, 0, 0, 0, 1]).is_err());
    assert!(check_rsa_public(n, &[2]).is_err());
    // Leading zero bytes do not count towards the size.
    let mut padded = vec![0; 4];
    padded.extend_from_slice(n);
    assert!(check_rsa_public(&padded, &[1, 0, 1]).is_ok());
    // 1024 and 4104 bits are outside 2048..=4096.
    let small = check_rsa_public(&[0xff; 128], &[1, 0, 1]).unwrap_err();
    assert!(small.contains("1024 bits"), "{small}");
    let large = check_rsa_public(&[0xff; 513], &[1, 0, 1]).unwrap_err();
    assert!(large.contains("4104 bits"), "{large}");
}

#[test]
fn ec_keys_are_p256_points() {
    let key = DecodingKey::from_ec_pem(EC_A_PUBLIC.as_bytes()).unwrap();
    assert!(check_ec_public(&key).is_ok());
    // P-384 parses as an EC key, but is not a P-256 point.
    let p384 = DecodingKey::from_ec_pem(EC_P384_PUBLIC.as_bytes()).unwrap();
    assert!(check_ec_public(&p384).unwrap_err().contains("P-256"));
}

#[test]
fn public_key_files_never_hold_a_private_key() {
    let dir = TempDir::new("keys-pem");
    let load = |name: &str, contents: &str, alg| {
        load_public_key(&dir.write(name, contents), alg).map(|_| ())
    };
    assert!(load("rsa.pem", RSA_A_PUBLIC, Algorithm::RS256).is_ok());
    assert!(load("ec.pem", EC_A_PUBLIC, Algorithm::ES256).is_ok());
    for (name, contents) in [
        ("private.pem", RSA_A_PRIVATE.to_owned()),
        ("ec-private.pem", EC_A_PRIVATE.to_owned()),
        // A public key first does not hide a private key after it.
        ("both.pem", format!("{RSA_A_PUBLIC}{EC_A_PRIVATE}")),
        // Nor does a private block that does not parse.
        (
            "broken.pem",
            format!("{RSA_A_PUBLIC}-----BEGIN PRIVATE KEY-----\nAAAA\n"),
        ),
    ] {
        let e = load(name, &contents, Algorithm::RS256).unwrap_err();
        assert!(e.contains("holds a private key"), "{name}: {e}");
    }
    for (name, contents) in [("text.pem", "not a key"), ("empty.pem", "")] {
        let e = load(name, contents, Algorithm::RS256).unwrap_err();
        assert!(e.contains("not an RSA public key in PEM"), "{name}: {e}");
    }
}
