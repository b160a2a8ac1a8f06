//! The attacks of docs/security.md that concern identity and privilege,
//! each tried over real sockets against `tollgate serve` on loopback (HTTP
//! and gRPC), or against `tollgate check-config` for configs the server must
//! refuse to run. Every test is one row of that table.

use std::net::SocketAddr;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_server::config::Config;
use tollgate_server::grpc::proto;
use tollgate_server::grpc::proto::tollgate_client::TollgateClient;
use tollgate_testkit::T0;
use tonic::{Code, Request};

use common::{AUDIENCE, ISSUER, Resp, TempDir, send_with, service_token, valid_token};

mod common;

const SECRET: &str = "tollgate-security-test-secret-0123456789";
const ADMIN: &str = "security-admin-token-0123456789";

/// A jwt config with one plan, provider `openai:gpt-4o` with a `batch`
/// tenant share, and `extra_identity` lines in `[identity]`.
fn config_text(extra_identity: &str) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
admin_token = "{ADMIN}"
default_plan = "p"

[identity]
mode = "jwt"
algorithm = "HS256"
secret = "{SECRET}"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
{extra_identity}

[plans.p]
turns = {{ amount = 20, period_ms = 60000, burst = 5 }}
tokens = {{ amount = 60000, period_ms = 60000 }}
concurrent_runs = 2

[providers."openai:gpt-4o"]
requests = {{ amount = 600, period_ms = 60000, burst = 60 }}
policy = "reject"

[providers."openai:gpt-4o".tenants.batch]
share = 0.1
"#
    )
}

/// A server on fake time with HTTP, gRPC and (optionally) the operator's
/// port each on its own loopback listener.
struct Server {
    http: SocketAddr,
    grpc: SocketAddr,
    admin: Option<SocketAddr>,
    web: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tollgate_server::StartError>>,
}

impl Server {
    async fn start(toml: &str, admin_apart: bool) -> Self {
        let config = Config::parse(toml, "test", std::path::Path::new(".")).expect("valid config");
        let s = common::serve_loopback(config, admin_apart).await;
        Self {
            http: s.http,
            grpc: s.grpc,
            admin: s.admin,
            web: reqwest::Client::new(),
            stop: s.stop,
            task: s.task,
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        auth: Option<&str>,
        body: Option<Value>,
    ) -> Resp {
        self.send_to(self.http, method, path, auth, body).await
    }

    async fn send_to(
        &self,
        addr: SocketAddr,
        method: Method,
        path: &str,
        auth: Option<&str>,
        body: Option<Value>,
    ) -> Resp {
        let body = body.map(|b| b.to_string());
        send_with(
            &self.web,
            method,
            &format!("http://{addr}{path}"),
            auth,
            body.as_deref(),
        )
        .await
    }

    async fn grpc(&self) -> TollgateClient<tonic::transport::Channel> {
        TollgateClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect")
    }

    async fn stop(mut self) {
        common::shutdown(self.stop.take(), self.task).await;
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn with_auth<T>(auth: &str, message: T) -> Request<T> {
    let mut r = Request::new(message);
    r.metadata_mut()
        .insert("authorization", auth.parse().expect("ascii"));
    r
}

/// An HS256 token with `claims` over the standard ones.
fn token_with_claims(user: &str, extra: Value) -> String {
    let mut claims = json!({
        "sub": user, "iss": ISSUER, "aud": AUDIENCE,
        "iat": T0 / 1_000, "exp": T0 / 1_000 + 3_600,
    });
    for (k, v) in extra.as_object().expect("object") {
        claims[k] = v.clone();
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .expect("sign")
}

const THROTTLE: &str = r#"{"model":"gpt-4o","status":429,"headers":{"retry-after":"999999999"}}"#;

/// Attack: a user with a valid token reports a 429 to freeze the fleet's
/// provider. Now: 403 `forbidden` over HTTP and PERMISSION_DENIED over
/// gRPC, and the provider's permits stay granted; a service credential
/// with the feedback scope is accepted.
#[tokio::test]
async fn a_user_token_cannot_report_provider_answers() {
    let srv = Server::start(&config_text(""), false).await;
    let user = bearer(&valid_token("mallory", SECRET));
    let path = "/v1/providers/openai/feedback";
    let r = srv
        .send(
            Method::POST,
            path,
            Some(&user),
            Some(serde_json::from_str(THROTTLE).unwrap()),
        )
        .await;
    r.refused(403, "forbidden");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("tollgate:feedback")
    );
    let status = srv
        .grpc()
        .await
        .provider_feedback(with_auth(
            &user,
            proto::ProviderFeedbackRequest {
                provider: "openai".into(),
                model: "gpt-4o".into(),
                status: 429,
                headers: [("retry-after".to_owned(), "999999999".to_owned())].into(),
                body: None,
            },
        ))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    // Nothing changed for anyone.
    let permit = json!({"model": "gpt-4o", "tokens": 0});
    let r = srv
        .send(
            Method::POST,
            "/v1/providers/openai/permits",
            Some(&user),
            Some(permit.clone()),
        )
        .await;
    assert_eq!(r.ok()["wait_ms"], 0);
    // The services that call providers may.
    let svc = bearer(&service_token("gateway", SECRET));
    let r = srv
        .send(
            Method::POST,
            path,
            Some(&svc),
            Some(json!({"model":"gpt-4o","status":200,"headers":{}})),
        )
        .await;
    assert_eq!(r.ok()["class"], "success");
    srv.stop().await;
}

/// Attack: a user names another tenant in a provider permit to spend its
/// share. Now, with `tenant_claim`: a body tenant other than the verified
/// one is 403 `forbidden` (HTTP and gRPC); one's own, or none, is served.
#[tokio::test]
async fn a_permit_cannot_spend_another_tenants_share() {
    let srv = Server::start(&config_text(r#"tenant_claim = "org""#), false).await;
    let acme = bearer(&token_with_claims("ann", json!({"org": "acme"})));
    let path = "/v1/providers/openai/permits";
    let r = srv
        .send(
            Method::POST,
            path,
            Some(&acme),
            Some(json!({"model": "gpt-4o", "tokens": 0, "tenant": "batch"})),
        )
        .await;
    r.refused(403, "forbidden");
    let status = srv
        .grpc()
        .await
        .provider_permit(with_auth(
            &acme,
            proto::ProviderPermitRequest {
                provider: "openai".into(),
                model: "gpt-4o".into(),
                tenant: Some("batch".into()),
                ..Default::default()
            },
        ))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    for body in [
        json!({"model": "gpt-4o", "tokens": 0, "tenant": "acme"}),
        json!({"model": "gpt-4o", "tokens": 0}),
    ] {
        let r = srv.send(Method::POST, path, Some(&acme), Some(body)).await;
        assert_eq!(r.ok()["wait_ms"], 0);
    }
    // The batch tenant's share (6 of 60) is its own: a batch credential
    // spends it, and the seventh call is refused.
    let batch = bearer(&token_with_claims("bot", json!({"org": "batch"})));
    for _ in 0..6 {
        let r = srv
            .send(
                Method::POST,
                path,
                Some(&batch),
                Some(json!({"model": "gpt-4o", "tokens": 0})),
            )
            .await;
        r.ok();
    }
    let r = srv
        .send(
            Method::POST,
            path,
            Some(&batch),
            Some(json!({"model": "gpt-4o", "tokens": 0})),
        )
        .await;
    r.refused(429, "provider_rate");
    srv.stop().await;
}

fn trusted_config(proxies: &str) -> String {
    config_text("").replace(
        &format!(
            "mode = \"jwt\"\nalgorithm = \"HS256\"\nsecret = \"{SECRET}\"\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\""
        ),
        &format!("mode = \"trusted_header\"\ntrusted_proxies = {proxies}"),
    )
}

/// Attack: any peer sends `x-tollgate-user: victim` to a trusted_header
/// server. Now: believed only from `trusted_proxies`; from another peer,
/// 401 over HTTP and UNAUTHENTICATED over gRPC, and nothing is charged.
#[tokio::test]
async fn the_trusted_header_is_refused_from_an_untrusted_peer() {
    let srv = Server::start(&trusted_config(r#"["10.9.9.9/32"]"#), false).await;
    let mut req = srv.web.post(format!("http://{}/v1/runs", srv.http));
    req = req
        .header("x-tollgate-user", "victim")
        .json(&json!({"invocation_id": "r1"}));
    let resp = req.send().await.expect("send");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"], "unauthorized");
    let mut r = Request::new(proto::AdmitRunRequest {
        invocation_id: "r1".into(),
        ..Default::default()
    });
    r.metadata_mut()
        .insert("x-tollgate-user", "victim".parse().unwrap());
    let status = srv.grpc().await.admit_run(r).await.expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    srv.stop().await;

    // From a trusted proxy (loopback here) the same request is the user's.
    let srv = Server::start(&trusted_config(r#"["127.0.0.0/8"]"#), false).await;
    let resp = srv
        .web
        .post(format!("http://{}/v1/runs", srv.http))
        .header("x-tollgate-user", "victim")
        .json(&json!({"invocation_id": "r1"}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    srv.stop().await;
}

/// Attack: scrape `/metrics` or probe `/admin/*` on the port users reach.
/// Now, with `admin_listen`: both are 404 on the public port and served on
/// the operator's port (admin still behind its token).
#[tokio::test]
async fn the_operators_routes_leave_the_public_port() {
    let srv = Server::start(&config_text(""), true).await;
    let admin = srv.admin.expect("operator port");
    let auth = bearer(ADMIN);
    for path in ["/metrics", "/admin/top"] {
        let r = srv.send(Method::GET, path, Some(&auth), None).await;
        r.refused(404, "not_found");
    }
    let r = srv
        .send_to(admin, Method::GET, "/metrics", None, None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = srv
        .send_to(admin, Method::GET, "/admin/top", Some(&auth), None)
        .await;
    assert_eq!(r.ok()["users"], json!([]));
    let r = srv
        .send_to(admin, Method::GET, "/admin/top", None, None)
        .await;
    r.refused(401, "unauthorized");
    // The API is not on the operator's port.
    let r = srv
        .send_to(
            admin,
            Method::POST,
            "/v1/runs",
            Some(&bearer(&valid_token("u", SECRET))),
            Some(json!({"invocation_id": "x"})),
        )
        .await;
    r.refused(404, "not_found");
    let r = srv
        .send(
            Method::POST,
            "/v1/runs",
            Some(&bearer(&valid_token("u", SECRET))),
            Some(json!({"invocation_id": "x"})),
        )
        .await;
    r.ok();
    srv.stop().await;
}

/// `tollgate check-config` on `text`: exit code and stderr.
fn check_config(text: &str) -> (Option<i32>, String) {
    let dir = TempDir::new();
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, text).expect("write config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check-config")
        .arg(&path)
        .output()
        .expect("run tollgate");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Attack: run dev mode (anyone can mint a token for anyone) on a public
/// address. Now: refused by `check-config` (exit 64) and at start.
#[test]
fn dev_mode_on_a_public_address_is_refused() {
    let text =
        "listen = \"0.0.0.0:8787\"\ngrpc_listen = \"[::]:8788\"\n[identity]\nmode = \"dev\"\n";
    let (code, stderr) = check_config(text);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("listen: 0.0.0.0:8787 is not a loopback address"),
        "{stderr}"
    );
    assert!(
        stderr.contains("grpc_listen: [::]:8788 is not a loopback address"),
        "{stderr}"
    );
    let (code, stderr) = check_config("listen = \"127.0.0.1:8787\"\n[identity]\nmode = \"dev\"\n");
    assert_eq!(code, Some(0), "{stderr}");
}

/// Attack: a token minted for another service (another `aud`) is accepted
/// because the audience is not checked. Now: jwt mode without `audience`
/// is refused unless the operator writes `audience_check = false`.
#[test]
fn jwt_mode_without_an_audience_is_refused() {
    let text = config_text("").replace(&format!("audience = \"{AUDIENCE}\"\n"), "");
    let (code, stderr) = check_config(&text);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("identity.audience: required in jwt mode"),
        "{stderr}"
    );
    let off = text.replace("[identity]\n", "[identity]\naudience_check = false\n");
    let (code, stderr) = check_config(&off);
    assert_eq!(code, Some(0), "{stderr}");
}

/// Attack: trusted_header mode with no proxy list believes any peer. Now:
/// `trusted_proxies` is required.
#[test]
fn trusted_header_mode_without_proxies_is_refused() {
    let text = trusted_config("[]").replace("trusted_proxies = []\n", "");
    let (code, stderr) = check_config(&text);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("identity.trusted_proxies: required"),
        "{stderr}"
    );
}
