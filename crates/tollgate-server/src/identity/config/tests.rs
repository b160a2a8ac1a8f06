//! Tests of `[identity]` validation: every problem with its field path.

use crate::identity::tests::*;
use crate::identity::*;

#[test]
fn secret_file_is_read_and_trimmed() {
    let dir = TempDir::new("secret-file");
    dir.write("secret", &format!("{SECRET}\n"));
    let clock = FakeClock::new(NOW_MS);
    let cfg = IdentityConfig {
        secret: None,
        secret_file: Some("secret".into()),
        ..hs256_config()
    };
    let v = build(&cfg, &dir.0, &clock);
    assert_eq!(v.verify(&bearer(&hs(&claims(60)))), Ok("alice".to_owned()));
    assert!(!v.describe().contains(SECRET));
    assert!(v.describe().contains("secret"));
}

#[test]
fn config_errors_name_their_field() {
    let dir = TempDir::new("config-errors");
    let jwt = || IdentityConfig::new(IdentityMode::Jwt);

    let e = config_errors(&jwt(), &dir.0);
    assert!(has_error(&e, "identity.algorithm", "required"), "{e:?}");

    let cfg = IdentityConfig {
        algorithm: Some("HS256".into()),
        ..jwt()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.secret", "required with HS256"),
        "{e:?}"
    );

    let cfg = IdentityConfig {
        secret_file: Some("secret".into()),
        ..hs256_config()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(has_error(&e, "identity.secret_file", "not both"), "{e:?}");

    let cfg = IdentityConfig {
        secret: Some("short".into()),
        ..hs256_config()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(has_error(&e, "identity.secret", "at least 32"), "{e:?}");

    for alg in ["HS512", "none", "rs256", ""] {
        let cfg = IdentityConfig {
            algorithm: Some(alg.into()),
            ..hs256_config()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.algorithm", "unsupported algorithm"),
            "{e:?}"
        );
    }

    let cfg = IdentityConfig {
        algorithm: Some("RS256".into()),
        ..jwt()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.public_key_file", "required with RS256"),
        "{e:?}"
    );

    let cfg = IdentityConfig {
        algorithm: Some("RS256".into()),
        public_key_file: Some("missing.pem".into()),
        audience: Some(AUDIENCE.into()),
        ..jwt()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.public_key_file", "cannot read"),
        "{e:?}"
    );
    assert!(
        e[0].reason
            .contains(&dir.0.join("missing.pem").display().to_string()),
        "{e:?}"
    );

    dir.write("garbage.pem", "not a key");
    dir.write("private.pem", RSA_A_PRIVATE);
    dir.write("small.pem", RSA_1024_PUBLIC);
    dir.write("ec.pem", EC_A_PUBLIC);
    dir.write("p384.pem", EC_P384_PUBLIC);
    dir.write("rsa.pem", RSA_A_PUBLIC);
    for (alg, file, needle) in [
        ("RS256", "garbage.pem", "not an RSA public key"),
        ("RS256", "private.pem", "private key"),
        ("RS256", "small.pem", "1024 bits"),
        ("RS256", "ec.pem", "not an RSA public key"),
        ("ES256", "rsa.pem", "not an EC public key"),
        ("ES256", "p384.pem", "P-256"),
        ("ES256", "garbage.pem", "not an EC public key"),
    ] {
        let cfg = IdentityConfig {
            algorithm: Some(alg.into()),
            public_key_file: Some(file.into()),
            ..jwt()
        };
        let e = config_errors(&cfg, &dir.0);
        assert!(
            has_error(&e, "identity.public_key_file", needle),
            "{alg} {file}: {e:?}"
        );
    }

    let cfg = IdentityConfig {
        algorithm: Some("RS256".into()),
        secret: Some(SECRET.into()),
        public_key_file: Some("rsa.pem".into()),
        jwks_file: Some("jwks.json".into()),
        ..jwt()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(has_error(&e, "identity.secret", "only with HS256"), "{e:?}");
    assert!(has_error(&e, "identity.jwks_file", "not both"), "{e:?}");

    let cfg = IdentityConfig {
        public_key_file: Some("rsa.pem".into()),
        ..hs256_config()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.public_key_file", "not used with HS256"),
        "{e:?}"
    );
}

#[test]
fn mode_specific_config_errors() {
    let dir = TempDir::new("mode-errors");
    let cfg = IdentityConfig {
        header: Some("bad header".into()),
        secret: Some(SECRET.into()),
        issuer: Some(ISSUER.into()),
        ..IdentityConfig::new(IdentityMode::TrustedHeader)
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(
        has_error(&e, "identity.header", "not a valid HTTP header name"),
        "{e:?}"
    );
    assert!(has_error(&e, "identity.secret", "trusted_header"), "{e:?}");
    assert!(has_error(&e, "identity.issuer", "trusted_header"), "{e:?}");

    let cfg = IdentityConfig {
        header: Some(String::new()),
        ..IdentityConfig::new(IdentityMode::TrustedHeader)
    };
    assert!(has_error(
        &config_errors(&cfg, &dir.0),
        "identity.header",
        "empty"
    ));

    let cfg = IdentityConfig {
        secret: Some(SECRET.into()),
        algorithm: Some("RS256".into()),
        header: Some("x-user".into()),
        ..IdentityConfig::dev()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(has_error(&e, "identity.secret", "dev mode"), "{e:?}");
    assert!(has_error(&e, "identity.algorithm", "HS256 only"), "{e:?}");
    assert!(has_error(&e, "identity.header", "trusted_header"), "{e:?}");

    let cfg = IdentityConfig {
        header: Some("x-user".into()),
        leeway_s: Some(3_600),
        issuer: Some(String::new()),
        audience: Some(String::new()),
        user_claim: Some("exp".into()),
        ..hs256_config()
    };
    let e = config_errors(&cfg, &dir.0);
    assert!(has_error(&e, "identity.header", "jwt mode"), "{e:?}");
    assert!(has_error(&e, "identity.leeway_s", "at most 300"), "{e:?}");
    assert!(has_error(&e, "identity.issuer", "empty"), "{e:?}");
    assert!(has_error(&e, "identity.audience", "empty"), "{e:?}");
    assert!(
        has_error(&e, "identity.user_claim", "registered claim"),
        "{e:?}"
    );
    assert_eq!(e.len(), 5, "every problem is listed: {e:?}");
}

#[test]
fn config_parses_from_toml() {
    let cfg: IdentityConfig = toml::from_str(
        r#"
        mode = "jwt"
        algorithm = "RS256"
        public_key_file = "keys/idp.pem"
        issuer = "https://idp.example.com"
        audience = "tollgate"
        leeway_s = 10
        user_claim = "email"
        "#,
    )
    .unwrap();
    assert_eq!(cfg.mode, IdentityMode::Jwt);
    assert_eq!(
        cfg.public_key_file.as_deref(),
        Some(Path::new("keys/idp.pem"))
    );
    let cfg: IdentityConfig = toml::from_str(r#"mode = "trusted_header""#).unwrap();
    assert_eq!(cfg.mode, IdentityMode::TrustedHeader);
    assert!(toml::from_str::<IdentityConfig>(r#"mode = "none""#).is_err());
    assert!(toml::from_str::<IdentityConfig>("mode = \"dev\"\nsecrets = \"x\"").is_err());
}
