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
fn private_keys_are_recognised_by_their_pem_label() {
    assert!(holds_private_key(RSA_A_PRIVATE.as_bytes()));
    assert!(holds_private_key(EC_A_PRIVATE.as_bytes()));
    let both = format!("{RSA_A_PUBLIC}{EC_A_PRIVATE}");
    assert!(holds_private_key(both.as_bytes()));
    assert!(!holds_private_key(RSA_A_PUBLIC.as_bytes()));
    assert!(!holds_private_key(b"not a key"));
}
