//! The Lua scripts, one per operation, each with the shared prelude.
//!
//! `redis::Script` calls them by EVALSHA and loads them again (SCRIPT LOAD,
//! to every primary in Cluster) when a restarted or failed-over server
//! answers NOSCRIPT. Each script's KEYS/ARGV contract is documented in its
//! header under `scripts/`.

use redis::Script;

const PRELUDE: &str = include_str!("../scripts/prelude.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
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
    pub(crate) reset_user: Script,
    pub(crate) reconcile: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            admit_turn: script(include_str!("../scripts/admit_turn.lua")),
            release_run: script(include_str!("../scripts/release_run.lua")),
            renew_run: script(include_str!("../scripts/renew_run.lua")),
            reserve_tokens: script(include_str!("../scripts/reserve_tokens.lua")),
            settle: script(include_str!("../scripts/settle.lua")),
            take_many: script(include_str!("../scripts/take_many.lua")),
            take_one: script(include_str!("../scripts/take_one.lua")),
            extend_cooldown: script(include_str!("../scripts/extend_cooldown.lua")),
            aimd: script(include_str!("../scripts/aimd.lua")),
            clear_provider: script(include_str!("../scripts/clear_provider.lua")),
            claim_session: script(include_str!("../scripts/claim_session.lua")),
            session: script(include_str!("../scripts/session.lua")),
            user_state: script(include_str!("../scripts/user_state.lua")),
            reset_user: script(include_str!("../scripts/reset_user.lua")),
            reconcile: script(include_str!("../scripts/reconcile.lua")),
        }
    }
}
