//! `rediss://` against a real TLS `redis-server`, with a CA made here by
//! `openssl`: the store connects and decides through TLS when told to trust
//! that CA, and refuses a server it cannot verify.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tollgate_core::lease::{Admit, TurnParams};
use tollgate_core::store::TurnRequest;
use tollgate_core::{BucketSpec, Store};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_testkit::redis::{RedisServer, free_port, unique_prefix};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1 signed by it.
fn make_certs(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "1"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=tollgate-test-ca",
    ]);
    openssl(dir, &ca);
    let mut csr = vec!["req", "-nodes"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    openssl(dir, &csr);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "san.ext",
        ],
    );
}

fn admit(user: &str) -> TurnRequest<'_> {
    TurnRequest {
        user,
        invocation_id: "r1",
        params: TurnParams {
            turns: BucketSpec::new(10, 1_000, 10).unwrap(),
            max_runs: 2,
            lease_ttl_ms: 60_000,
            concurrency_retry_ms: 1_000,
        },
        budgets: &[],
    }
}

#[tokio::test]
async fn rediss_with_a_private_ca() {
    let dir = std::env::temp_dir().join(format!("tollgate-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    make_certs(&dir);
    let tls_port = free_port(false).unwrap();
    let file = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let _server = RedisServer::start_with_args(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &file("server.crt"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.crt"),
        "--tls-auth-clients",
        "no",
    ])
    .expect("redis-server with TLS");
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();

    let store = RedisStore::connect(
        RedisConfig::standalone(&url)
            .with_key_prefix(unique_prefix())
            .with_op_timeout(Duration::from_secs(2))
            .with_tls_ca_pem(ca),
    )
    .await
    .expect("connect over TLS");
    let out = store.admit_turn(admit("u1")).await.expect("admit over TLS");
    assert!(matches!(out.admit, Admit::Admitted { .. }));

    // Without the CA, the server's certificate cannot be verified.
    let untrusted = RedisStore::connect(
        RedisConfig::standalone(&url)
            .with_key_prefix(unique_prefix())
            .with_op_timeout(Duration::from_secs(2)),
    )
    .await
    .expect("lazy connect");
    assert!(untrusted.admit_turn(admit("u2")).await.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
