//! `tollgate simulate` reads the server's config file for its limits and
//! ignores the server-only settings (`tollgate-planner/src/config.rs`): every
//! top-level key the server accepts must be accepted there too, or a valid
//! server file would be refused by the planner.

use tollgate_planner::Limits;
use tollgate_server::config::{DEFAULT_CONFIG, FileConfig};

#[test]
fn the_planner_accepts_every_top_level_key_of_the_server_config() {
    let file: FileConfig = toml::from_str(DEFAULT_CONFIG).unwrap();
    // Every field, `None` ones included (as null), by its TOML name.
    let json = serde_json::to_value(&file).unwrap();
    let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
    assert!(keys.len() >= 15, "{keys:?}");
    // The keys the planner reads as limits (typed, as the server does).
    let limits_keys = [
        "default_plan",
        "plans",
        "users",
        "overrides",
        "providers",
        "currency",
        "prices",
        "budgets",
    ];
    let mut text = String::from(
        "default_plan = \"p\"\n\
         currency = \"USD\"\n\
         [plans.p]\n\
         turns = { amount = 1, period_ms = 1000 }\n\
         tokens = { amount = 1, period_ms = 1000 }\n\
         concurrent_runs = 1\n\
         [prices.\"openai:gpt-4o\"]\n\
         input = \"2.50\"\n\
         output = \"10.00\"\n\
         [budgets]\n\
         time_zone = \"Europe/Paris\"\n",
    );
    for key in limits_keys {
        assert!(keys.iter().any(|k| *k == key), "{key} not in {keys:?}");
    }
    // Server-only keys as tables, each after the limits so it is top-level.
    for key in keys.iter().filter(|k| !limits_keys.contains(&k.as_str())) {
        text.push_str(&format!("[{key}]\nx = 1\n"));
    }
    if let Err(e) = Limits::parse(&text, "server.toml") {
        panic!("a server key is refused by the planner: {e}\n{text}");
    }
    // A key the server does not know is still an error.
    let typo = format!("{text}[identiy]\nx = 1\n");
    assert!(Limits::parse(&typo, "server.toml").is_err());
}
