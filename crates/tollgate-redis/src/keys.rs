//! Key layout. Every key of one user carries the hash tag `{user}`, every key
//! of one session `{session}`, so each operation's keys share one Cluster
//! slot and one script can touch them all.
//!
//! Ids are escaped (`%`, `{`, `}`, `:` as `%25`, `%7B`, `%7D`, `%3A`) so no
//! id can close a hash tag early or make two different (user, invocation)
//! pairs name the same key.

use std::fmt::Write;

use tollgate_core::store::grouped::split_grouped;

/// Escapes `%`, `{`, `}` and `:` in an id.
pub(crate) fn esc(id: &str) -> std::borrow::Cow<'_, str> {
    if !id.contains(['%', '{', '}', ':']) {
        return id.into();
    }
    let mut out = String::with_capacity(id.len() + 8);
    for c in id.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
    out.into()
}

/// The keys of one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionKeys {
    /// Lease hash `{h, x, f, e}` (holder, its expiry, latest fence,
    /// retention end).
    pub(crate) lease: String,
    /// Records list.
    pub(crate) records: String,
    /// Ids of the events appended by `session_append`.
    pub(crate) ids: String,
}

/// Builds keys under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    fn user(&self, kind: &str, user: &str) -> String {
        format!("{}:{kind}:{{{}}}", self.prefix, esc(user))
    }

    /// The turn bucket of a user: a packed string (`bucket_load` in
    /// scripts/prelude.lua). Named `turn2` since it stopped being a hash
    /// under `turn`, so replicas of either layout never read the other's
    /// type during a rolling upgrade (docs/spec.md §6).
    pub(crate) fn turn(&self, user: &str) -> String {
        self.user("turn2", user)
    }

    /// The token bucket and tokens per minute of a user: a packed string
    /// (`tok_load` in scripts/prelude.lua). Named `tok2` since it stopped
    /// being a hash under `tok` (docs/spec.md §6).
    pub(crate) fn tokens(&self, user: &str) -> String {
        self.user("tok2", user)
    }

    /// The spend per budget window of a user: a packed string
    /// (`spend_load` in scripts/prelude.lua).
    pub(crate) fn spend(&self, user: &str) -> String {
        self.user("bud", user)
    }

    /// The request ids of a user's recent budget top-ups: a sorted set,
    /// each id scored by when it was applied (scripts/budget_spent.lua).
    pub(crate) fn top_ups(&self, user: &str) -> String {
        self.user("topup", user)
    }

    /// The run lease set of a user.
    pub(crate) fn leases(&self, user: &str) -> String {
        self.user("lease", user)
    }

    /// The last reconciliation batch applied per replica, of a user.
    pub(crate) fn reconciled(&self, user: &str) -> String {
        self.user("rec", user)
    }

    /// The token bucket hash of a user as replicas before the packed layout
    /// kept it (its fields `um`, `uc`, `up` count tokens per minute): only
    /// `user_state` reads it, so during a rolling upgrade the user view
    /// counts the old replicas' tokens too (docs/spec.md §6).
    pub(crate) fn tokens_hash(&self, user: &str) -> String {
        self.user("tok", user)
    }

    /// A run's model-call counter and open reservations.
    pub(crate) fn invocation(&self, user: &str, invocation: &str) -> String {
        let mut k = self.invocation_prefix(user);
        let _ = write!(k, "{}", esc(invocation));
        k
    }

    /// The common prefix of a user's run records (the reserve script builds
    /// the key of a run it evicts from it; same slot).
    pub(crate) fn invocation_prefix(&self, user: &str) -> String {
        let mut k = self.user("inv", user);
        k.push(':');
        k
    }

    /// The index of a user's run records, by last activity.
    pub(crate) fn runs(&self, user: &str) -> String {
        self.user("invs", user)
    }

    /// The claims of a user's live sessions (a sorted set: session id, the
    /// claim's end), in the user's slot.
    pub(crate) fn session_claims(&self, user: &str) -> String {
        self.user("sess", user)
    }

    /// A session's lease hash, records list and event-id set. A grouped
    /// name (`tollgate_core::store::grouped`) is tagged by its group and
    /// named by the rest, so every name of one group shares one slot; any
    /// other name is its own tag (the key ends at the tag, so the two
    /// forms never meet).
    pub(crate) fn session(&self, session: &str) -> SessionKeys {
        let p = &self.prefix;
        let (tag, rest) = match split_grouped(session) {
            Some((group, rest)) => (esc(group), Some(esc(rest))),
            None => (esc(session), None),
        };
        let key = |kind: &str| match &rest {
            Some(rest) => format!("{p}:{kind}:{{{tag}}}:{rest}"),
            None => format!("{p}:{kind}:{{{tag}}}"),
        };
        SessionKeys {
            lease: key("sl"),
            records: key("sr"),
            ids: key("si"),
        }
    }

    /// A named cooldown or AIMD state; the caller's key keeps its own hash
    /// tag.
    pub(crate) fn named(&self, key: &str) -> String {
        format!("{}:k:{key}", self.prefix)
    }

    /// A named bucket: a packed string (`bucket_load` in
    /// scripts/prelude.lua), the caller's key keeping its own hash tag.
    /// Under `k2` since it stopped being a hash under `k` (as
    /// [`Keys::turn`]; docs/spec.md §6), which also keeps a bucket and a
    /// cooldown of one name apart.
    pub(crate) fn named_bucket(&self, key: &str) -> String {
        format!("{}:k2:{key}", self.prefix)
    }

    /// The sorted set of tokens per user for one minute (all minutes share
    /// the tag `{top}`, so the two read together live in one slot).
    pub(crate) fn top(&self, minute: u64) -> String {
        format!("{}:top:{{top}}:{minute}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_keys_share_one_tag_and_ids_cannot_collide() {
        let k = Keys::new("tg");
        assert_eq!(k.turn("u42"), "tg:turn2:{u42}");
        assert_eq!(k.tokens("u42"), "tg:tok2:{u42}");
        assert_eq!(k.leases("u42"), "tg:lease:{u42}");
        assert_eq!(k.invocation("u42", "inv-1"), "tg:inv:{u42}:inv-1");
        assert_eq!(k.session_claims("u42"), "tg:sess:{u42}");
        assert_eq!(k.turn("a}b{c"), "tg:turn2:{a%7Db%7Bc}");
        assert_ne!(
            k.invocation("u", "x:y"),
            k.invocation("u:x", "y"),
            "escaping keeps pairs apart"
        );
        assert_eq!(esc("100%"), "100%25");
        let s1 = k.session("s1");
        assert_eq!(
            (s1.lease.as_str(), s1.records.as_str(), s1.ids.as_str()),
            ("tg:sl:{s1}", "tg:sr:{s1}", "tg:si:{s1}")
        );
        // A grouped name: tagged by its group, named by the rest.
        let name = tollgate_core::store::grouped::grouped_name("adk:a}p", "s:2:u1/x");
        let g = k.session(&name);
        assert_eq!(g.lease, "tg:sl:{adk%3Aa%7Dp}:s%3A2%3Au1/x");
        assert_eq!(g.records, "tg:sr:{adk%3Aa%7Dp}:s%3A2%3Au1/x");
        assert_eq!(g.ids, "tg:si:{adk%3Aa%7Dp}:s%3A2%3Au1/x");
        assert_ne!(k.session("g").lease, k.session("@1:g/").lease);
    }

    #[test]
    fn session_keys_are_one_escaped_tag() {
        use tollgate_core::session::{SessionKey, session_key};
        let k = Keys::new("tg");
        assert_eq!(
            k.session(&session_key("bob", "chat")).lease,
            "tg:sl:{s1%3A3%3Abob/chat}"
        );
        // Ids that would close a tag or split the key stay inside one tag,
        // and two sessions the length prefix tells apart stay apart.
        let odd = k.session(&session_key("a}{:b", "c/d"));
        assert_eq!(odd.lease, "tg:sl:{s1%3A5%3Aa%7D%7B%3Ab/c/d}");
        assert_ne!(
            k.session(&session_key("a/b", "c")).lease,
            k.session(&session_key("a", "b/c")).lease
        );
        // Scoped to a group (the adk crate's app): tagged by the group.
        let scoped = k.session(&SessionKey::scoped("adk:a}p", "u1", "x").to_string());
        assert_eq!(scoped.lease, "tg:sl:{adk%3Aa%7Dp}:s1%3A2%3Au1/x");
        assert_eq!(scoped.records, "tg:sr:{adk%3Aa%7Dp}:s1%3A2%3Au1/x");
        assert_eq!(k.named("{openai:gpt-4o}:cd"), "tg:k:{openai:gpt-4o}:cd");
        assert_eq!(
            k.named_bucket("{openai:gpt-4o}:rpm"),
            "tg:k2:{openai:gpt-4o}:rpm"
        );
    }
}
