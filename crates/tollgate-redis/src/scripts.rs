//! The Lua scripts, one per operation, each with the prelude helpers it uses.
//!
//! `redis::Script` calls them by EVALSHA and loads them again (SCRIPT LOAD,
//! to every primary in Cluster) when a restarted or failed-over server
//! answers NOSCRIPT. Each script's KEYS/ARGV contract is documented in its
//! header under `scripts/`.
//!
//! The integer codes the scripts answer are Lua locals of the same names
//! as the constants of [`crate::codes`], composed in like prelude blocks.
//!
//! Redis runs a script's whole text on every call, so each helper the
//! prelude defines is a closure made anew per call (about 3 µs for the whole
//! prelude, measured). A script therefore carries only the prelude blocks
//! whose names its body uses, directly or through another block it carries
//! (blocks are the prelude's paragraphs, kept in their order). Only code
//! counts: a name in a comment (`--` to the end of the line; no script has
//! `--` inside a string) carries nothing.

use redis::Script;

const PRELUDE: &str = include_str!("../scripts/prelude.lua");

/// Every script's name (its file under `scripts/`, without `.lua`) and body.
const BODIES: [(&str, &str); 16] = [
    ("admit_turn", include_str!("../scripts/admit_turn.lua")),
    ("release_run", include_str!("../scripts/release_run.lua")),
    ("renew_run", include_str!("../scripts/renew_run.lua")),
    (
        "reserve_tokens",
        include_str!("../scripts/reserve_tokens.lua"),
    ),
    ("settle", include_str!("../scripts/settle.lua")),
    ("take_many", include_str!("../scripts/take_many.lua")),
    ("take_one", include_str!("../scripts/take_one.lua")),
    (
        "extend_cooldown",
        include_str!("../scripts/extend_cooldown.lua"),
    ),
    ("aimd", include_str!("../scripts/aimd.lua")),
    (
        "clear_provider",
        include_str!("../scripts/clear_provider.lua"),
    ),
    (
        "claim_session",
        include_str!("../scripts/claim_session.lua"),
    ),
    ("session", include_str!("../scripts/session.lua")),
    ("user_state", include_str!("../scripts/user_state.lua")),
    ("budget_spent", include_str!("../scripts/budget_spent.lua")),
    ("reset_user", include_str!("../scripts/reset_user.lua")),
    ("reconcile", include_str!("../scripts/reconcile.lua")),
];

/// Whether `name` occurs in `text` as a whole word.
fn uses(text: &str, name: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name).any(|(i, _)| {
        !text[..i].chars().next_back().is_some_and(word)
            && !text[i + name.len()..].chars().next().is_some_and(word)
    })
}

/// The names a prelude block defines (`local function f(` or `local a, b =`).
fn defines(block: &str) -> Vec<&str> {
    let mut names = Vec::new();
    for line in block.lines() {
        if let Some(rest) = line.strip_prefix("local function ") {
            names.extend(rest.split('(').next().map(str::trim));
        } else if let Some((lhs, _)) = line
            .strip_prefix("local ")
            .and_then(|rest| rest.split_once('='))
        {
            names.extend(lhs.split(',').map(str::trim));
        }
    }
    names
}

/// `text` without its Lua comments (`--` to the end of each line).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.split_once("--").map_or(l, |(c, _)| c))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text loaded for `body`: the prelude blocks it needs, then the body.
fn compose(body: &str) -> String {
    // The reply codes first (src/codes.rs): prelude functions name them.
    let blocks: Vec<(&str, Vec<&str>)> = crate::codes::LUA
        .split("\n\n")
        .filter(|b| !b.is_empty())
        .chain(PRELUDE.split("\n\n"))
        .map(|b| (b, defines(b)))
        .collect();
    let codes: Vec<String> = blocks.iter().map(|(b, _)| code(b)).collect();
    let body_code = code(body);
    let mut need = vec![false; blocks.len()];
    loop {
        let mut changed = false;
        for i in 0..blocks.len() {
            if need[i] {
                continue;
            }
            let used = |n: &&str| {
                uses(&body_code, n)
                    || codes
                        .iter()
                        .zip(&need)
                        .any(|(text, needed)| *needed && uses(text, n))
            };
            if blocks[i].1.iter().any(used) {
                need[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut out = String::new();
    for ((text, _), needed) in blocks.iter().zip(&need) {
        if *needed {
            out.push_str(text);
            out.push_str("\n\n");
        }
    }
    out.push_str(body);
    out
}

/// The Lua text [`RedisStore`](crate::RedisStore) loads for one script,
/// named as its file under `scripts/` without `.lua` (`"admit_turn"`, …):
/// the prelude helpers it uses, then its body. For benchmarks and tools that
/// call a script themselves; `None` for an unknown name.
pub fn lua_source(name: &str) -> Option<String> {
    BODIES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, body)| compose(body))
}

fn script(name: &str) -> Script {
    let text = lua_source(name).unwrap_or_default();
    debug_assert!(!text.is_empty(), "no script {name}");
    Script::new(&text)
}

/// Every script, hashed once.
pub(crate) struct Scripts {
    pub(crate) admit_turn: Script,
    pub(crate) release_run: Script,
    pub(crate) renew_run: Script,
    pub(crate) reserve_tokens: Script,
    pub(crate) settle: Script,
    pub(crate) take_many: Script,
    pub(crate) take_one: Script,
    pub(crate) extend_cooldown: Script,
    pub(crate) aimd: Script,
    pub(crate) clear_provider: Script,
    pub(crate) claim_session: Script,
    pub(crate) session: Script,
    pub(crate) user_state: Script,
    pub(crate) budget_spent: Script,
    pub(crate) reset_user: Script,
    pub(crate) reconcile: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            admit_turn: script("admit_turn"),
            release_run: script("release_run"),
            renew_run: script("renew_run"),
            reserve_tokens: script("reserve_tokens"),
            settle: script("settle"),
            take_many: script("take_many"),
            take_one: script("take_one"),
            extend_cooldown: script("extend_cooldown"),
            aimd: script("aimd"),
            clear_provider: script("clear_provider"),
            claim_session: script("claim_session"),
            session: script("session"),
            user_state: script("user_state"),
            budget_spent: script("budget_spent"),
            reset_user: script("reset_user"),
            reconcile: script("reconcile"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_carries_the_helpers_it_uses_and_no_others() {
        let admit = lua_source("admit_turn").unwrap();
        for used in ["local function now_ms", "local function bucket_save"] {
            assert!(admit.contains(used), "{used}");
        }
        // Through bucket_save → bucket_expiry → ceil_div → floor_div, and
        // the constants refill uses.
        for indirect in ["local function floor_div", "local MAX_SCALED"] {
            assert!(admit.contains(indirect), "{indirect}");
        }
        for unused in ["local function tok_save", "local function track_run"] {
            assert!(!admit.contains(unused), "{unused}");
        }
        // One bucket taken once: the fused helper and what its code uses,
        // not the helpers its comment and the script's header name.
        let take_one = lua_source("take_one").unwrap();
        for used in ["local function take_now", "local function floor_div"] {
            assert!(take_one.contains(used), "{used}");
        }
        for unused in ["local function bucket_load", "local function refill"] {
            assert!(!take_one.contains(unused), "{unused}");
        }
        let reserve = lua_source("reserve_tokens").unwrap();
        assert!(reserve.contains("local function track_run"));
        assert!(lua_source("nope").is_none());
    }

    /// A reply code is a name both sides read (src/codes.rs): every
    /// upper-case name a script's code uses is defined in what is loaded
    /// (a misspelt code would be a nil global in Lua), and the codes the
    /// scripts answer are the Rust constants.
    #[test]
    fn every_code_a_script_names_is_defined_as_in_rust() {
        for (name, _) in BODIES {
            let text = lua_source(name).unwrap();
            // The code without its string literals ('TIME', 'PX', ...).
            let mut quote = None;
            let body: String = code(&text)
                .chars()
                .filter(|&c| match quote {
                    Some(q) if c == q => {
                        quote = None;
                        false
                    }
                    Some(_) => false,
                    None if c == '\'' || c == '"' => {
                        quote = Some(c);
                        false
                    }
                    None => true,
                })
                .collect();
            let names = body
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| {
                    w.len() > 1
                        && w.starts_with(|c: char| c.is_ascii_uppercase())
                        && w.chars()
                            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                });
            for n in names {
                if ["KEYS", "ARGV"].contains(&n) {
                    continue;
                }
                assert!(
                    defines(&text).contains(&n),
                    "{name}.lua uses {n}, which nothing it loads defines"
                );
            }
        }
        let admit = lua_source("admit_turn").unwrap();
        assert!(admit.contains(&format!("local GRANTED = {}\n", crate::codes::GRANTED)));
        assert!(admit.contains(&format!(
            "local ADMIT_CONCURRENCY = {}\n",
            crate::codes::ADMIT_CONCURRENCY
        )));
        assert!(!admit.contains("local RESERVE_TOKEN_RATE"));
    }

    #[test]
    fn every_prelude_helper_is_found_as_a_word() {
        assert!(uses("a = f(x)", "f"));
        assert!(!uses("a = ff(x)", "f"));
        assert!(!uses("a = f_x", "f"));
        assert_eq!(
            defines("-- c\nlocal A, B = 1, 2\nlocal function g(x)\n  local y = 1\nend"),
            vec!["A", "B", "g"]
        );
    }
}
