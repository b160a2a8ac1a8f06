//! Operations over a real socket: Prometheus metrics (and no user id in any
//! label), admin endpoints behind the admin token (the provider routes
//! included; off with no token), and hot reload of plans
//! by file change (in-place edit and atomic rename), by `POST /admin/reload`
//! (an invalid file is rejected and the old config keeps serving) and by
//! SIGHUP.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate_core::FakeClock;
use tollgate_server::config::Config;
use tollgate_testkit::T0;
use tollgate_testkit::redis::wait_until;

use common::metric;

mod common;

const ADMIN: &str = "admin-token-0123456789abcdef";

fn config(burst: u32, shadow: bool) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
admin_token = "{ADMIN}"
default_plan = "std"

[identity]
mode = "dev"

[plans.std]
turns = {{ amount = 20, period_ms = 60000, burst = {burst} }}
tokens = {{ amount = 60000, period_ms = 60000 }}
concurrent_runs = 10
max_wait_ms = 0
shadow = {shadow}
"#
    )
}

struct Server {
    url: String,
    clock: FakeClock,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    client: reqwest::Client,
    dir: PathBuf,
}

impl Server {
    /// Serves `text`, written to a file so reloads can reread it.
    async fn start(name: &str, text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tollgate-ops-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tollgate.toml");
        std::fs::write(&file, text).unwrap();
        let cfg = Config::load(&file).expect("valid config");
        let clock = FakeClock::new(T0);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let c = clock.clone();
        let task = tokio::spawn(async move {
            tollgate_server::serve(cfg, listener, Some(Arc::new(c)), |_| {}, async {
                let _ = rx.await;
            })
            .await
            .expect("serve");
        });
        Self {
            url,
            clock,
            stop: Some(tx),
            task,
            client: reqwest::Client::new(),
            dir,
        }
    }

    fn file(&self) -> PathBuf {
        self.dir.join("tollgate.toml")
    }

    fn token(&self, user: &str) -> String {
        self.token_with(json!({"sub": user, "exp": T0 / 1000 + 3_600}))
    }

    /// A token of a service that reports provider answers (the feedback
    /// scope).
    fn service_token(&self, user: &str) -> String {
        self.token_with(
            json!({"sub": user, "exp": T0 / 1000 + 3_600, "scope": "tollgate:feedback"}),
        )
    }

    fn token_with(&self, claims: serde_json::Value) -> String {
        // Dev mode: HS256 with the well-known secret; exp from the fake clock.
        jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(
                tollgate_server::identity::DEV_SECRET.as_bytes(),
            ),
        )
        .unwrap()
    }

    async fn admit(&self, user: &str, inv: &str) -> StatusCode {
        self.client
            .post(format!("{}/v1/runs", self.url))
            .bearer_auth(self.token(user))
            .json(&json!({"invocation_id": inv}))
            .send()
            .await
            .unwrap()
            .status()
    }

    async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut req = self.client.request(method, format!("{}{path}", self.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn metrics_count_decisions_by_limit_outcome_and_plan_without_user_ids() {
    let s = Server::start("metrics", &config(2, false)).await;
    let user = "user-with-a-very-distinctive-id-42";
    for inv in ["a", "b", "c"] {
        s.admit(user, inv).await;
    }
    let text = s.metrics().await;
    assert_eq!(
        metric(
            &text,
            r#"tollgate_decisions_total{op="admit",limit="none",outcome="allowed",plan="std"}"#
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            r#"tollgate_decisions_total{op="admit",limit="turn_rate",outcome="denied",plan="std"}"#
        ),
        Some(1.0)
    );
    assert_eq!(metric(&text, "tollgate_turns_in_flight "), Some(2.0));
    for name in [
        "tollgate_token_wait_seconds",
        "tollgate_store_errors_total",
        "tollgate_leases_reclaimed_total",
        "tollgate_fence_rejected_total",
        "tollgate_requests_in_flight",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    assert!(!text.contains(user), "a user id leaked into a label");
    assert!(!text.contains("distinctive"));
    // A stale fence and a reclaimed lease are counted.
    let r = s
        .client
        .post(format!("{}/v1/sessions/s1/fence", s.url))
        .bearer_auth(s.token(user))
        .json(&json!({"fence": 9}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    s.clock.advance(120_000);
    s.admit(user, "d").await;
    let text = s.metrics().await;
    assert_eq!(metric(&text, "tollgate_fence_rejected_total "), Some(1.0));
    assert_eq!(metric(&text, "tollgate_leases_reclaimed_total "), Some(2.0));
    assert!(!text.contains(user));
    s.stop().await;
}

impl Server {
    /// `DELETE /v1/runs/{inv}` or `POST /v1/runs/{inv}/renew`.
    async fn run_op(&self, user: &str, inv: &str, renew: bool) -> StatusCode {
        let req = if renew {
            self.client
                .post(format!("{}/v1/runs/{inv}/renew", self.url))
        } else {
            self.client.delete(format!("{}/v1/runs/{inv}", self.url))
        };
        req.bearer_auth(self.token(user))
            .send()
            .await
            .unwrap()
            .status()
    }

    async fn turns_in_flight(&self) -> Option<f64> {
        metric(&self.metrics().await, "tollgate_turns_in_flight ")
    }
}

/// Issue #17: a run admitted and abandoned (never released) stops counting
/// in `tollgate_turns_in_flight` when its lease expires, as the store
/// reclaims it; a retried admission (a refresh) counts once.
#[tokio::test]
async fn abandoned_runs_stop_counting_in_flight_when_their_leases_expire() {
    let s = Server::start("abandoned", &config(10, false)).await;
    for inv in ["a", "b", "c"] {
        assert_eq!(s.admit("alice", inv).await, StatusCode::OK);
    }
    assert_eq!(s.turns_in_flight().await, Some(3.0));
    assert_eq!(s.run_op("alice", "a", false).await, StatusCode::OK);
    assert_eq!(s.turns_in_flight().await, Some(2.0));
    // A retry of an admission refreshes the lease: still one run.
    s.clock.advance(1_000);
    assert_eq!(s.admit("alice", "b").await, StatusCode::OK);
    assert_eq!(s.turns_in_flight().await, Some(2.0));
    // b and c are abandoned. The default lease TTL is 120 s: c's lease
    // (admitted at 0) ends at 120 s, b's (refreshed at 1 s) at 121 s.
    s.clock.advance(119_000);
    assert_eq!(s.turns_in_flight().await, Some(1.0));
    s.clock.advance(1_000);
    assert_eq!(s.turns_in_flight().await, Some(0.0));
    // The store agrees: both leases are gone.
    assert_eq!(s.run_op("alice", "b", true).await, StatusCode::NOT_FOUND);
    assert_eq!(s.turns_in_flight().await, Some(0.0));
    s.stop().await;
}

/// Renewals keep a run counted past its first lease; a lost lease (renewed
/// too late) stops counting; a run admitted by another user with the same
/// invocation id is another run.
#[tokio::test]
async fn renewed_runs_stay_counted_in_flight() {
    let s = Server::start("renewed", &config(10, false)).await;
    assert_eq!(s.admit("alice", "r").await, StatusCode::OK);
    assert_eq!(s.admit("bob", "r").await, StatusCode::OK);
    assert_eq!(s.turns_in_flight().await, Some(2.0));
    // Alice renews every 40 s (ttl/3) for 4 minutes; Bob abandons his run.
    for _ in 0..6 {
        s.clock.advance(40_000);
        assert_eq!(s.run_op("alice", "r", true).await, StatusCode::OK);
    }
    assert_eq!(s.turns_in_flight().await, Some(1.0));
    // A renewal after the lease expired is lost, and the run not counted.
    s.clock.advance(120_000);
    assert_eq!(s.turns_in_flight().await, Some(0.0));
    assert_eq!(s.run_op("alice", "r", true).await, StatusCode::NOT_FOUND);
    assert_eq!(s.turns_in_flight().await, Some(0.0));
    // A release of a run the store no longer holds changes nothing.
    assert_eq!(s.run_op("bob", "r", false).await, StatusCode::OK);
    assert_eq!(s.turns_in_flight().await, Some(0.0));
    s.stop().await;
}

#[tokio::test]
async fn shadow_mode_is_visible_in_metrics_and_the_response() {
    let s = Server::start("shadow", &config(1, true)).await;
    assert_eq!(s.admit("u", "a").await, StatusCode::OK);
    let r = s
        .client
        .post(format!("{}/v1/runs", s.url))
        .bearer_auth(s.token("u"))
        .json(&json!({"invocation_id": "b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "shadow mode never refuses");
    assert_eq!(
        r.headers().get("x-tollgate-shadow-denied").unwrap(),
        "turn_rate"
    );
    let text = s.metrics().await;
    assert_eq!(
        metric(
            &text,
            r#"tollgate_decisions_total{op="admit",limit="turn_rate",outcome="shadow_denied",plan="std"}"#
        ),
        Some(1.0),
        "{text}"
    );
    s.stop().await;
}

#[tokio::test]
async fn admin_endpoints_need_the_admin_token() {
    let s = Server::start("admin", &config(5, false)).await;
    for inv in ["r1", "r2"] {
        assert_eq!(s.admit("alice", inv).await, StatusCode::OK);
    }
    let r = s
        .client
        .post(format!("{}/v1/tokens/reserve", s.url))
        .bearer_auth(s.token("alice"))
        .json(&json!({"invocation_id": "r1", "estimate": 7000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    use reqwest::Method;
    // No token, a wrong one, and a user's JWT are all refused.
    let alice = s.token("alice");
    for t in [None, Some("nope"), Some(alice.as_str())] {
        let (st, body) = s.admin(Method::GET, "/admin/users/alice", t).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{t:?}");
        assert_eq!(body["error"], "unauthorized");
    }
    let (st, v) = s
        .admin(Method::GET, "/admin/users/alice", Some(ADMIN))
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["plan"], "std");
    assert_eq!(v["turns_available"], 3);
    assert_eq!(v["tokens_available"], 53_000);
    assert_eq!(v["leases"].as_array().unwrap().len(), 2);
    let (st, v) = s.admin(Method::GET, "/admin/top?n=5", Some(ADMIN)).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["users"][0]["user"], "alice");
    assert_eq!(v["users"][0]["tokens_last_minute"], 7_000);
    let (st, v) = s
        .admin(Method::DELETE, "/admin/users/alice/leases/r1", Some(ADMIN))
        .await;
    assert_eq!((st, v["released"].clone()), (StatusCode::OK, json!(true)));
    let (_, v) = s
        .admin(Method::DELETE, "/admin/users/alice/leases/r1", Some(ADMIN))
        .await;
    assert_eq!(v["released"], false);
    let (st, v) = s
        .admin(Method::POST, "/admin/users/alice/reset", Some(ADMIN))
        .await;
    assert_eq!((st, v["reset"].clone()), (StatusCode::OK, json!(true)));
    let (_, v) = s
        .admin(Method::GET, "/admin/users/alice", Some(ADMIN))
        .await;
    assert_eq!(v["turns_available"], 5);
    assert_eq!(v["tokens_available"], 60_000);
    assert_eq!(v["leases"].as_array().unwrap().len(), 1);
    s.stop().await;
}

/// The provider admin routes are behind the admin token like the others:
/// no token, a wrong one or a user's JWT is 401 (and a refused clear
/// clears nothing); with no `admin_token` configured they are 404.
#[tokio::test]
async fn admin_provider_routes_need_the_admin_token() {
    use reqwest::Method;
    let provider = r#"
[providers."openai:gpt-4o"]
requests = { amount = 600, period_ms = 60000 }
"#;
    let s = Server::start(
        "admin-providers",
        &format!("{}{provider}", config(5, false)),
    )
    .await;
    let r = s
        .client
        .post(format!("{}/v1/providers/openai/feedback", s.url))
        .bearer_auth(s.service_token("gateway"))
        .json(&json!({"model": "gpt-4o", "status": 429, "headers": {"retry-after": "30"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let routes = [
        (Method::GET, "/admin/providers"),
        (Method::GET, "/admin/providers/openai/gpt-4o"),
        (Method::POST, "/admin/providers/openai/gpt-4o/clear"),
    ];
    let alice = s.token("alice");
    for (method, path) in &routes {
        for t in [None, Some("nope"), Some(alice.as_str())] {
            let (st, body) = s.admin(method.clone(), path, t).await;
            assert_eq!(st, StatusCode::UNAUTHORIZED, "{method} {path} {t:?}");
            assert_eq!(body["error"], "unauthorized");
        }
    }
    let (st, v) = s
        .admin(Method::GET, "/admin/providers/openai/gpt-4o", Some(ADMIN))
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v["cooldown_until_ms"],
        T0 + 30_000,
        "the refused clears cleared nothing"
    );
    let (st, v) = s
        .admin(
            Method::POST,
            "/admin/providers/openai/gpt-4o/clear",
            Some(ADMIN),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["cleared"]["cooldown_until_ms"], T0 + 30_000);
    s.stop().await;

    let off = config(5, false).replace(&format!("admin_token = \"{ADMIN}\"\n"), "");
    assert!(!off.contains("admin_token"));
    let s = Server::start("admin-providers-off", &format!("{off}{provider}")).await;
    for (method, path) in &routes {
        for t in [None, Some(ADMIN)] {
            let (st, body) = s.admin(method.clone(), path, t).await;
            assert_eq!(st, StatusCode::NOT_FOUND, "{method} {path} {t:?}");
            assert_eq!(body["error"], "not_found");
        }
    }
    s.stop().await;
}

async fn plan_burst(s: &Server) -> i64 {
    // A fresh user's turns_available is the plan's burst.
    let (_, v) = s
        .admin(reqwest::Method::GET, "/admin/users/fresh-user", Some(ADMIN))
        .await;
    v["turns_available"].as_i64().unwrap()
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn reload_on_file_change_in_place_and_by_rename() {
    let s = Server::start("watch", &config(5, false)).await;
    assert_eq!(plan_burst(&s).await, 5);
    // In-place edit.
    std::fs::write(s.file(), config(7, false)).unwrap();
    assert!(wait_until(10, || async { plan_burst(&s).await == 7 }).await);
    // Atomic write + rename.
    write_atomically(&s.file(), &config(9, false));
    assert!(wait_until(10, || async { plan_burst(&s).await == 9 }).await);
    let text = s.metrics().await;
    assert!(metric(&text, r#"tollgate_config_reloads_total{result="ok"}"#).unwrap() >= 2.0);
    s.stop().await;
}

#[tokio::test]
async fn admin_reload_rejects_an_invalid_file_and_keeps_serving() {
    let s = Server::start("reload", &config(5, false)).await;
    use reqwest::Method;
    // Broken file: the watcher and the endpoint both reject it.
    write_atomically(
        &s.file(),
        &config(5, false).replace("burst = 5", "burst = 0"),
    );
    let (st, v) = s.admin(Method::POST, "/admin/reload", Some(ADMIN)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"], "invalid_config");
    assert_eq!(v["errors"][0]["path"], "plans.std.turns.burst");
    assert_eq!(plan_burst(&s).await, 5, "the old config keeps serving");
    assert_eq!(s.admit("u", "x").await, StatusCode::OK);
    let text = s.metrics().await;
    assert!(metric(&text, r#"tollgate_config_reloads_total{result="error"}"#).unwrap() >= 1.0);
    // A good file, reloaded on demand.
    write_atomically(&s.file(), &config(3, false));
    let (st, v) = s.admin(Method::POST, "/admin/reload", Some(ADMIN)).await;
    assert_eq!((st, v["reloaded"].clone()), (StatusCode::OK, json!(true)));
    assert_eq!(v["needs_restart"], json!([]), "{v}");
    assert_eq!(plan_burst(&s).await, 3);
    let (st, _) = s.admin(Method::POST, "/admin/reload", None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    s.stop().await;
}

/// A config with `budget` as plan "std"'s budgets (UTC windows).
fn budgeted(budget: &str) -> String {
    format!(
        "currency = \"USD\"\n{}\n[prices.\"openai:gpt-4o\"]\ninput = \"2.50\"\noutput = \"10.00\"\n\n\
         [budgets]\ntime_zone = \"UTC\"\n\n[plans.std.budgets]\n{budget}\n",
        config(5, false)
    )
}

impl Server {
    /// Reserves `estimate` tokens for `user`'s run `inv`.
    async fn reserve(&self, user: &str, inv: &str, estimate: u64) -> (StatusCode, Value) {
        let r = self
            .client
            .post(format!("{}/v1/tokens/reserve", self.url))
            .bearer_auth(self.token(user))
            .json(&json!({"invocation_id": inv, "estimate": estimate, "model": "openai:gpt-4o"}))
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap())
    }
}

/// A reload that lowers a budget applies at the next request: what was
/// spent stays and is checked against the new limit. T0 is
/// 2023-11-14 22:13:20 UTC, so the day resets at 2023-11-15 00:00 UTC.
#[tokio::test]
async fn a_reload_lowering_a_budget_applies_at_once() {
    use reqwest::Method;
    let midnight = 1_700_006_400_000;
    let s = Server::start("budget", &budgeted("daily = { tokens = 10000 }")).await;
    assert_eq!(s.admit("bea", "r1").await, StatusCode::OK);
    let (st, v) = s.reserve("bea", "r1", 4_000).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, u) = s.admin(Method::GET, "/admin/users/bea", Some(ADMIN)).await;
    assert_eq!(
        u["budgets"],
        json!([{"window": "daily", "unit": "tokens", "limit": 10_000, "granted": 0, "spent": 4_000, "resets_at_ms": midnight}])
    );
    // 4,000 + 2,000 fits 10,000, not 5,000.
    write_atomically(&s.file(), &budgeted("daily = { tokens = 5000 }"));
    let (st, v) = s.admin(Method::POST, "/admin/reload", Some(ADMIN)).await;
    assert_eq!(
        (st, v["reloaded"].clone()),
        (StatusCode::OK, json!(true)),
        "{v}"
    );
    assert_eq!(v["needs_restart"], json!([]), "{v}");
    let (st, v) = s.reserve("bea", "r1", 2_000).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"], "budget_exhausted");
    assert_eq!(v["limit"], "budget_daily");
    assert_eq!(v["resets_at_ms"], midnight);
    assert_eq!(v["retry_after_ms"], midnight - T0);
    let (_, u) = s.admin(Method::GET, "/admin/users/bea", Some(ADMIN)).await;
    assert_eq!(u["budgets"][0]["limit"], 5_000);
    assert_eq!(
        u["budgets"][0]["spent"], 4_000,
        "the refusal charged nothing"
    );
    let (st, v) = s.reserve("bea", "r1", 1_000).await;
    assert_eq!(st, StatusCode::OK, "what is left of the lower budget: {v}");
    // Removing the budget lifts it at once too.
    write_atomically(&s.file(), &config(5, false));
    let (st, _) = s.admin(Method::POST, "/admin/reload", Some(ADMIN)).await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = s.reserve("bea", "r1", 2_000).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, u) = s.admin(Method::GET, "/admin/users/bea", Some(ADMIN)).await;
    assert_eq!(u["budgets"], json!([]));
    s.stop().await;
}

/// A reload tells the truth: settings it cannot apply are named, the rest
/// still applies, and the running values stay.
#[tokio::test]
async fn reload_names_the_changes_that_need_a_restart() {
    let s = Server::start("restart", &config(5, false)).await;
    use reqwest::Method;
    let changed = config(2, false)
        .replace(ADMIN, "another-admin-token-0123456789")
        .replace("mode = \"dev\"", "mode = \"dev\"\nleeway_s = 10")
        .replace("default_plan", "max_in_flight = 7\ndefault_plan");
    write_atomically(&s.file(), &changed);
    let (st, v) = s.admin(Method::POST, "/admin/reload", Some(ADMIN)).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["reloaded"], json!(true));
    assert_eq!(
        v["needs_restart"],
        json!(["admin_token", "max_in_flight", "identity"]),
        "{v}"
    );
    // The plan change applied; the old admin token still works.
    assert_eq!(plan_burst(&s).await, 2);
    // Back to the running values: nothing needs a restart.
    write_atomically(&s.file(), &config(5, false));
    let (_, v) = s.admin(Method::POST, "/admin/reload", Some(ADMIN)).await;
    assert_eq!(v["needs_restart"], json!([]), "{v}");
    s.stop().await;
}

#[test]
fn sighup_reloads_the_config_of_a_running_server() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Command, Stdio};

    let dir = std::env::temp_dir().join(format!("tollgate-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tollgate.toml");
    std::fs::write(&file, config(5, false)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config"])
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first
        .trim_start_matches("tollgate listening on http://")
        .to_owned();
    // The rest of stdout (the logs) is read on a thread.
    let (log_tx, log_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if log_tx.send(line).is_err() {
                break;
            }
        }
    });
    let burst = || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "GET /admin/users/fresh HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN}\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let body = resp.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["turns_available"].as_i64()
    };
    assert_eq!(burst(), Some(5));
    std::fs::write(&file, config(6, false)).unwrap();
    assert!(
        Command::new("kill")
            .args(["-HUP", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    // The log shows the reload came from SIGHUP (the file watcher, which
    // may also notice the change, logs differently).
    let mut hup = false;
    let mut swapped = false;
    while let Ok(line) = log_rx.recv_timeout(std::time::Duration::from_secs(10)) {
        if line.contains("SIGHUP: reloading the config") {
            hup = true;
        } else if hup && line.contains("config reloaded") {
            // Logged after the swap that SIGHUP triggered.
            swapped = true;
            break;
        }
    }
    let ok = swapped && burst() == Some(6);
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(hup, "no SIGHUP reload was logged");
    assert!(ok, "the reload did not land");
}

/// Log lines, captured for the test's thread (a current-thread runtime:
/// the server's tasks run on it).
#[derive(Clone, Default)]
struct Captured(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self, containing: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock())
            .lines()
            .filter(|l| l.contains(containing))
            .map(str::to_owned)
            .collect()
    }
}

/// Budget alerts (80 % and 100 %, once per window, counted without a user
/// id and logged with it), an operator's top-up and reset (logged), their
/// refusals, and shadow mode over a spent budget.
#[tokio::test]
async fn budget_alerts_top_ups_resets_and_shadow_mode() {
    use reqwest::Method;
    let logs = Captured::default();
    let w = logs.clone();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish(),
    );
    let s = Server::start("budget-alerts", &budgeted("daily = { tokens = 10000 }")).await;
    let alerts = |percent: u8| {
        let s = &s;
        async move {
            metric(
                &s.metrics().await,
                &format!(
                    r#"tollgate_budget_alerts_total{{window="daily",percent="{percent}",plan="std"}}"#
                ),
            )
        }
    };
    assert_eq!(s.admit("cid", "r1").await, StatusCode::OK);
    assert_eq!(s.reserve("cid", "r1", 7_999).await.0, StatusCode::OK);
    assert_eq!(alerts(80).await, None, "79.99 %");
    assert_eq!(s.reserve("cid", "r1", 1).await.0, StatusCode::OK);
    assert_eq!(alerts(80).await, Some(1.0));
    assert_eq!(s.reserve("cid", "r1", 2_000).await.0, StatusCode::OK);
    assert_eq!(alerts(100).await, Some(1.0));
    let logged = logs.lines("budget alert");
    assert_eq!(logged.len(), 2, "{logged:#?}");
    assert!(
        logged[0].contains("user=\"cid\"") && logged[0].contains("percent=80"),
        "{logged:#?}"
    );
    let (st, v) = s.reserve("cid", "r1", 1).await;
    assert_eq!(
        (st, v["limit"].clone()),
        (StatusCode::TOO_MANY_REQUESTS, json!("budget_daily"))
    );
    let text = s.metrics().await;
    assert_eq!(
        metric(
            &text,
            r#"tollgate_decisions_total{op="reserve",limit="budget_daily",outcome="denied",plan="std"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains("cid"), "no user id in a label");

    // A top-up of 500 tokens for today: 500 more fit, not 501.
    let top_up = |body: Value| {
        let s = &s;
        async move {
            let r = s
                .client
                .post(format!("{}/admin/users/cid/budgets/daily/top_up", s.url))
                .bearer_auth(ADMIN)
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        }
    };
    // Sent twice with one request id (a retry after a lost answer): one
    // grant, both answers the budgets after it.
    for _ in 0..2 {
        let (st, v) = top_up(json!({"tokens": 500, "request_id": "grant-1"})).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["budgets"][0]["granted"], 500);
        assert_eq!(v["budgets"][0]["spent"], 10_000);
    }
    assert_eq!(
        s.reserve("cid", "r1", 501).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(s.reserve("cid", "r1", 500).await.0, StatusCode::OK);
    let logged = logs.lines("admin: budget window topped up");
    assert_eq!(logged.len(), 2, "{logged:?}");
    assert!(logged[0].contains("grant-1"), "{logged:?}");
    // Wrong shapes and windows are the client's mistake.
    for (body, field) in [
        (json!({"cost": "1.00"}), "tokens"),
        (json!({"tokens": 0}), "amount"),
        (json!({"tokens": 1, "cost": "1"}), "tokens"),
        (json!({"tokenz": 1}), "body"),
        (json!({"tokens": 1, "request_id": ""}), "request_id"),
        (json!({"tokens": 1, "request_id": "a\nb"}), "request_id"),
        (json!({"tokens": 1, "request_id": 7}), "body"),
    ] {
        let (st, v) = top_up(body.clone()).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(v["field"], field, "{body}: {v}");
    }
    for path in ["budgets/weekly/reset", "budgets/yearly/reset"] {
        let (st, v) = s
            .admin(
                Method::POST,
                &format!("/admin/users/cid/{path}"),
                Some(ADMIN),
            )
            .await;
        assert_eq!(
            (st, v["field"].clone()),
            (StatusCode::BAD_REQUEST, json!("window")),
            "{path}: {v}"
        );
    }
    let (st, _) = s
        .admin(Method::POST, "/admin/users/cid/budgets/daily/reset", None)
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    // A reset: the day starts afresh, and its 80 % can be reached again.
    let (st, v) = s
        .admin(
            Method::POST,
            "/admin/users/cid/budgets/daily/reset",
            Some(ADMIN),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["budgets"][0]["spent"].clone(),
            v["budgets"][0]["granted"].clone()
        ),
        (json!(0), json!(0))
    );
    assert_eq!(logs.lines("admin: budget window reset").len(), 1);
    assert_eq!(s.reserve("cid", "r1", 8_000).await.0, StatusCode::OK);
    assert_eq!(alerts(80).await, Some(2.0));
    s.stop().await;

    // Shadow mode: a spent budget is reported, not enforced.
    let text = budgeted("daily = { tokens = 10000 }").replace("shadow = false", "shadow = true");
    let s = Server::start("budget-shadow", &text).await;
    assert_eq!(s.admit("cid", "r1").await, StatusCode::OK);
    assert_eq!(s.reserve("cid", "r1", 10_000).await.0, StatusCode::OK);
    let r = s
        .client
        .post(format!("{}/v1/tokens/reserve", s.url))
        .bearer_auth(s.token("cid"))
        .json(&json!({"invocation_id": "r1", "estimate": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "shadow mode never refuses");
    assert_eq!(
        r.headers().get("x-tollgate-shadow-denied").unwrap(),
        "budget_daily"
    );
    let text = s.metrics().await;
    assert_eq!(
        metric(
            &text,
            r#"tollgate_decisions_total{op="reserve",limit="budget_daily",outcome="shadow_denied",plan="std"}"#
        ),
        Some(1.0),
        "{text}"
    );
    let (_, u) = s.admin(Method::GET, "/admin/users/cid", Some(ADMIN)).await;
    assert_eq!(
        u["budgets"][0]["spent"], 10_000,
        "a shadow reservation charges nothing"
    );
    s.stop().await;
}
