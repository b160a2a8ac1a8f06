//! The shipped Grafana dashboard (`deploy/grafana/tollgate.json`) and
//! Prometheus rules (`deploy/prometheus/tollgate.rules.yml`) against real
//! series: a `tollgate serve` on a Redis of its own (`fail_open`) gets
//! traffic that touches every metric they use — decisions allowed, waited
//! and denied, a budget alert, provider permits (per tenant too), a 429 and
//! an exhaustion reported, a stale fence, a refused reload, then Redis stopped (fallback
//! decisions, the breaker open, a journalled close) — and is scraped. Every
//! PromQL expression of both files is parsed (promql-parser), and every
//! series name and label it selects on must be in the scrape (recording
//! rules' `tollgate:` names must be recorded by the rules file).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate_server::config::Config;
use tollgate_testkit::redis::{RedisServer, unique_prefix};

const ADMIN: &str = "admin-token-0123456789abcdef";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every PromQL expression of the dashboard's panels (row panels' too),
/// and the metric of its `label_values(metric, label)` variables.
fn dashboard_exprs() -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(root().join("deploy/grafana/tollgate.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    fn panels(v: &Value, out: &mut Vec<String>) {
        for p in v.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push(t["expr"].as_str().expect("a target's expr").to_owned());
            }
            panels(&p["panels"], out);
        }
    }
    panels(&doc["panels"], &mut exprs);
    let mut variables = Vec::new();
    for v in doc["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = v["definition"].as_str() {
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|q| q.split(',').next())
                .expect("label_values(metric, label)");
            variables.push(inner.trim().to_owned());
        }
    }
    (exprs, variables)
}

/// The rules file's `expr:` values (one line, or a `|` block) and the
/// names its `record:` rules define. The file is ours, written in just
/// these two shapes; the count below guards the reader.
fn rule_exprs() -> (Vec<String>, BTreeSet<String>) {
    let text =
        std::fs::read_to_string(root().join("deploy/prometheus/tollgate.rules.yml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (mut exprs, mut recorded) = (Vec::new(), BTreeSet::new());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- record: ") {
            recorded.insert(name.trim().to_owned());
        }
        if let Some(rest) = trimmed.strip_prefix("expr: ") {
            if rest.trim() == "|" {
                let indent = line.len() - trimmed.len();
                let mut block = String::new();
                i += 1;
                while i < lines.len() {
                    let l = lines[i];
                    if !l.trim().is_empty() && l.len() - l.trim_start().len() <= indent {
                        break;
                    }
                    block.push_str(l.trim());
                    block.push(' ');
                    i += 1;
                }
                exprs.push(block);
                continue;
            }
            exprs.push(rest.trim().to_owned());
        }
        i += 1;
    }
    (exprs, recorded)
}

/// The series an expression selects: (name, label names matched).
#[derive(Default)]
struct Selected(Vec<(String, Vec<String>)>);

impl ExprVisitor for Selected {
    type Error = String;
    fn pre_visit(&mut self, e: &Expr) -> Result<bool, String> {
        let vs = match e {
            Expr::VectorSelector(vs) => vs,
            Expr::MatrixSelector(ms) => &ms.vs,
            _ => return Ok(true),
        };
        let name = vs.name.clone().ok_or("a selector without a metric name")?;
        let labels = vs
            .matchers
            .matchers
            .iter()
            .map(|m| m.name.clone())
            .filter(|n| n != "__name__")
            .collect();
        self.0.push((name, labels));
        Ok(true)
    }
}

fn token(user: &str, scope: Option<&str>) -> String {
    // The server runs on the system clock here (Redis's TIME too).
    let now = tollgate_core::Clock::now_ms(&tollgate_core::SystemClock) / 1_000;
    let mut claims = json!({"sub": user, "exp": now + 3_600});
    if let Some(s) = scope {
        claims["scope"] = json!(s);
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(tollgate_server::identity::DEV_SECRET.as_bytes()),
    )
    .unwrap()
}

fn config(redis: &str, turns_burst: u32) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
admin_token = "{ADMIN}"
default_plan = "std"

[store]
kind = "redis"
url = "{redis}"
key_prefix = "{prefix}"
failure = "fail_open"
op_timeout_ms = 300
connect_timeout_ms = 300

[store.breaker]
consecutive_failures = 1
open_ms = 600000

[identity]
mode = "dev"

[budgets]
alert_percent = [1]

[plans.std]
turns = {{ amount = 20, period_ms = 60000, burst = {turns_burst} }}
tokens = {{ amount = 1000, period_ms = 60000 }}
concurrent_runs = 10
max_wait_ms = 60000

[plans.std.budgets]
daily = {{ tokens = 100000 }}
on_outage = "fallback"

[providers."openai:gpt-4o"]
requests = {{ amount = 600, period_ms = 60000, burst = 10 }}
tokens = {{ amount = 90000, period_ms = 60000 }}

[providers."openai:o3"]
requests = {{ amount = 60, period_ms = 60000 }}

[providers."openai:gpt-4o-mini"]
requests = {{ amount = 6, period_ms = 60000, burst = 2 }}
policy = "reject"

[providers."openai:gpt-4o-mini".tenants.a]
weight = 3

[providers."openai:gpt-4o-mini".tenants.b]
weight = 1
"#,
        prefix = unique_prefix()
    )
}

struct Sidecar {
    url: String,
    web: reqwest::Client,
}

impl Sidecar {
    async fn post(&self, path: &str, bearer: &str, body: Value) -> (u16, Value) {
        let r = self
            .web
            .post(format!("{}{path}", self.url))
            .bearer_auth(bearer)
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test]
async fn every_series_of_the_dashboard_and_the_rules_exists() {
    let mut redis = RedisServer::start().expect("redis-server");
    let dir = std::env::temp_dir().join(format!("tollgate-dash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tollgate.toml");
    std::fs::write(&file, config(&redis.url(), 2)).unwrap();
    let cfg = Config::load(&file).expect("valid config");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(tollgate_server::serve(cfg, listener, None, |_| {}, async {
        let _ = stopped.await;
    }));
    let s = Sidecar {
        url,
        web: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
    };
    let (ann, gateway) = (token("ann", None), token("gw", Some("tollgate:feedback")));

    // Turns: two admitted, the third refused (burst 2).
    for (inv, want) in [("t1", 200), ("t2", 200), ("t3", 429)] {
        let (st, b) = s
            .post("/v1/runs", &ann, json!({"invocation_id": inv}))
            .await;
        assert_eq!(st, want, "{inv}: {b}");
    }
    // Tokens: the whole bucket, then a reservation that waits; the first
    // charge crosses the budget's 1 % alert.
    let (st, first) = s
        .post(
            "/v1/tokens/reserve",
            &ann,
            json!({"invocation_id": "t1", "estimate": 1000}),
        )
        .await;
    assert_eq!(st, 200, "{first}");
    let (st, waited) = s
        .post(
            "/v1/tokens/reserve",
            &ann,
            json!({"invocation_id": "t1", "estimate": 500}),
        )
        .await;
    assert_eq!(st, 200, "{waited}");
    assert!(waited["wait_ms"].as_u64().unwrap() > 0, "{waited}");
    let (st, _) = s
        .post(
            "/v1/tokens/settle",
            &ann,
            json!({"reservation_id": first["reservation_id"], "actual": 900}),
        )
        .await;
    assert_eq!(st, 200);
    // Providers: a permit, a 429 (a cooldown), a permit refused for it, and
    // an exhaustion of another key.
    let permit = json!({"model": "gpt-4o", "tokens": 100});
    assert_eq!(
        s.post("/v1/providers/openai/permits", &ann, permit.clone())
            .await
            .0,
        200
    );
    let (st, b) = s
        .post(
            "/v1/providers/openai/feedback",
            &gateway,
            json!({"model": "gpt-4o", "status": 429, "headers": {"retry-after": "30"}}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(
        s.post("/v1/providers/openai/permits", &ann, permit).await.0,
        429
    );
    let quota = r#"{"error": {"message": "You exceeded your current quota", "type": "insufficient_quota", "code": "insufficient_quota"}}"#;
    let (st, b) = s
        .post(
            "/v1/providers/openai/feedback",
            &gateway,
            json!({"model": "o3", "status": 429, "headers": {}, "body": quota}),
        )
        .await;
    assert_eq!((st, b["class"].clone()), (200, json!("exhausted")), "{b}");
    // Fair sharing: tenants a and b (weighted) and one not configured
    // (`other`), granted and refused.
    let mut refused = 0;
    for tenant in ["a", "b", "c", "a", "b"] {
        let body = json!({"model": "gpt-4o-mini", "tokens": 1, "tenant": tenant});
        let (st, b) = s.post("/v1/providers/openai/permits", &ann, body).await;
        assert!(st == 200 || st == 429, "{st} {b}");
        refused += usize::from(st == 429);
    }
    assert!(refused > 0, "a pool of burst 2 refuses some of five");
    // A session's stale fence.
    let lease = json!({"holder": "h1", "ttl_ms": 60_000});
    assert_eq!(s.post("/v1/sessions/s1/lease", &ann, lease).await.0, 200);
    let (st, b) = s
        .post("/v1/sessions/s1/fence", &ann, json!({"fence": 0}))
        .await;
    assert_eq!(st, 409, "{b}");
    // A refused reload.
    std::fs::write(&file, config(&redis.url(), 0)).unwrap();
    assert_eq!(s.post("/admin/reload", ADMIN, json!({})).await.0, 400);
    // Redis stops: the fallback decides, the breaker opens, a close waits.
    redis.stop();
    let (st, b) = s
        .post(
            "/v1/runs",
            &token("bob", None),
            json!({"invocation_id": "b1"}),
        )
        .await;
    assert_eq!(st, 200, "decided by the fallback: {b}");
    let (st, b) = s
        .post(
            "/v1/tokens/settle",
            &ann,
            json!({"reservation_id": waited["reservation_id"], "actual": 10}),
        )
        .await;
    assert_eq!((st, b["pending"].clone()), (200, json!(true)), "{b}");

    let text = s
        .web
        .get(format!("{}/metrics", s.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // Per tenant: the configured ones by name, the rest as `other`; the
    // weights of the configured ones.
    for want in [
        r#"tollgate_provider_tenant_permits_total{provider="openai",model="gpt-4o-mini",tenant="a",outcome="granted"} 1"#,
        r#"tollgate_provider_tenant_permits_total{provider="openai",model="gpt-4o-mini",tenant="other",outcome="refused"} 1"#,
        r#"tollgate_provider_tenant_weight{provider="openai",model="gpt-4o-mini",tenant="a"} 3"#,
        r#"tollgate_provider_tenant_weight{provider="openai",model="gpt-4o-mini",tenant="b"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == want), "no {want} in\n{text}");
    }
    assert!(
        !text.contains(r#"tenant="c""#),
        "an unconfigured tenant's name"
    );
    // Series name → the label names its samples carry.
    let mut series: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap();
        let labels = series.entry(line[..name_end].to_owned()).or_default();
        if let Some(body) = line[name_end..].strip_prefix('{') {
            let body = &body[..body.rfind('}').unwrap()];
            // Label values here never hold `,` or `=`.
            for pair in body.split(',') {
                labels.insert(pair.split('=').next().unwrap().to_owned());
            }
        }
    }

    let (dash, variables) = dashboard_exprs();
    let (rules, recorded) = rule_exprs();
    assert_eq!((dash.len(), rules.len(), recorded.len()), (29, 22, 8));
    let mut checked = BTreeSet::new();
    let mut missing = Vec::new();
    for (source, e) in dash
        .iter()
        .map(|e| ("dashboard", e))
        .chain(rules.iter().map(|e| ("rules", e)))
    {
        let expr = parser::parse(e).unwrap_or_else(|err| panic!("{source}: {e}: {err}"));
        let mut sel = Selected::default();
        walk_expr(&mut sel, &expr).unwrap_or_else(|err| panic!("{source}: {e}: {err}"));
        for (name, labels) in sel.0 {
            if name.starts_with("tollgate:") {
                assert!(recorded.contains(&name), "{source}: {name} is not recorded");
                continue;
            }
            checked.insert(name.clone());
            match series.get(&name) {
                None => missing.push(format!("{source}: {name} (in {e})")),
                Some(have) => {
                    for l in labels.iter().filter(|l| *l != "instance") {
                        if !have.contains(l) {
                            missing.push(format!("{source}: {name} has no label {l} (in {e})"));
                        }
                    }
                }
            }
        }
    }
    for v in &variables {
        checked.insert(v.clone());
        if !series.contains_key(v) {
            missing.push(format!("dashboard variable: {v}"));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}\n\nscrape:\n{text}");
    // Each series the dashboard and rules use, with a sample in the scrape.
    assert!(checked.len() >= 20, "{checked:?}");
    eprintln!(
        "{} expressions ({} dashboard, {} rules), {} series names, all in the scrape",
        dash.len() + rules.len(),
        dash.len(),
        rules.len(),
        checked.len()
    );

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    let _ = std::fs::remove_dir_all(&dir);
}
