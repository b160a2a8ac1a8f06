//! Grouped session writes (SPEC §4): several session logs of one *group*
//! written in one atomic step, fenced by one session's lease.
//!
//! A session name `@{len(group)}:{group}/{rest}` (a non-empty group, its
//! length in bytes, in canonical decimal) belongs to `group`; every other
//! name is a group of its own. Stores keep the names of one group together
//! (Redis: one hash tag, so one Cluster slot), which is what lets
//! [`Store::session_create`], [`Store::session_append`] and
//! [`Store::session_delete`] write a session and *logs* of its group (other
//! names of the group, whose leases they do not check) in one step. The
//! sidecar's session names (`s1:…`, [`crate::session`]) never start with
//! `@` and are never grouped.
//!
//! [`Store::session_create`]: super::Store::session_create
//! [`Store::session_append`]: super::Store::session_append
//! [`Store::session_delete`]: super::Store::session_delete

use crate::error::{StoreError, StoreErrorKind};

/// The session name of `rest` in `group` (`@{len(group)}:{group}/{rest}`).
/// `group` must not be empty (an empty group names no group).
pub fn grouped_name(group: &str, rest: &str) -> String {
    format!("@{}:{group}/{rest}", group.len())
}

/// The group and the rest of a grouped session name; `None` if `name` is
/// not one (it is then a group of its own).
pub fn split_grouped(name: &str) -> Option<(&str, &str)> {
    let (digits, tail) = name.strip_prefix('@')?.split_once(':')?;
    let len: usize = digits.parse().ok()?;
    if len == 0 || len.to_string() != digits {
        return None;
    }
    let group = tail.get(..len)?;
    let rest = tail.get(len..)?.strip_prefix('/')?;
    Some((group, rest))
}

/// The group of a session name: its group if it is grouped
/// ([`split_grouped`]), else the name itself.
pub fn session_group(name: &str) -> &str {
    split_grouped(name).map_or(name, |(group, _)| group)
}

/// A write to a log of the writing session's group, made in the same step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogWrite<'a> {
    /// The log: a session name of the writing session's group, not the
    /// session itself. Its lease (if any) is not checked.
    pub log: &'a str,
    /// The record appended to it; `None` appends nothing and only refreshes
    /// its retention (as every operation on a session does), so logs that
    /// are read with a session live as long as it is written.
    pub record: Option<&'a [u8]>,
}

/// Creates a session ([`Store::session_create`](super::Store::session_create)).
#[derive(Debug, Clone, Copy)]
pub struct SessionCreate<'a> {
    /// The session.
    pub session: &'a str,
    /// Its record 0.
    pub record: &'a [u8],
    /// Logs of its group written with it.
    pub logs: &'a [LogWrite<'a>],
}

/// The answer to a session create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionCreated {
    /// Created, with this new fencing number (held by no one: any earlier
    /// holder's number is stale from now on).
    Created {
        /// The number the create issued.
        fence: u64,
    },
    /// The session has records already: nothing written.
    Exists,
    /// A holder holds the session's lease live: nothing written.
    Busy {
        /// Its remaining TTL, ms (at least 1).
        retry_after_ms: u64,
    },
}

/// Appends an event to a session
/// ([`Store::session_append`](super::Store::session_append)).
#[derive(Debug, Clone, Copy)]
pub struct SessionAppend<'a> {
    /// The session.
    pub session: &'a str,
    /// The writer's fencing number: must be the session's latest.
    pub fence: u64,
    /// The event's id: an append whose id the session holds already writes
    /// nothing. `None` (or an empty id): appended every time.
    pub id: Option<&'a str>,
    /// The record appended to the session.
    pub record: &'a [u8],
    /// Logs of its group written with it.
    pub logs: &'a [LogWrite<'a>],
}

/// The answer to a session append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAppended {
    /// Appended at position `index` (from 0), the logs written.
    Appended {
        /// The record's position.
        index: u64,
    },
    /// The session holds this event id already: nothing written.
    Repeated,
    /// The fence is not the session's latest issued number: nothing written.
    Stale {
        /// The latest issued number.
        latest: u64,
    },
    /// The session has no records (never created, deleted, or expired):
    /// nothing written.
    Missing,
}

/// Deletes a session's records
/// ([`Store::session_delete`](super::Store::session_delete)).
#[derive(Debug, Clone, Copy)]
pub struct SessionDelete<'a> {
    /// The session.
    pub session: &'a str,
    /// Logs of its group written with the delete, if the session had
    /// records.
    pub logs: &'a [LogWrite<'a>],
}

/// `Ok` if every log is another name of `session`'s group; a
/// [`StoreErrorKind::Protocol`] error (a caller's bug: no store can make
/// such a write atomic) otherwise. Every store checks this before writing.
///
/// # Errors
///
/// A log in another group, or the session itself named as a log.
pub fn check_group(session: &str, logs: &[LogWrite<'_>]) -> Result<(), StoreError> {
    let group = session_group(session);
    for l in logs {
        if l.log == session {
            return Err(StoreError::new(
                StoreErrorKind::Protocol,
                format!("a session write names its own session {session} as a log"),
            ));
        }
        if split_grouped(l.log).is_none() || session_group(l.log) != group {
            return Err(StoreError::new(
                StoreErrorKind::Protocol,
                format!(
                    "log {} is not in the group of session {session}: one step cannot write both",
                    l.log
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_names_parse_back_and_others_are_their_own_group() {
        for (group, rest) in [("g", "s1"), ("adk:a/b", "s:2:u1/x"), ("{x}", "")] {
            let name = grouped_name(group, rest);
            assert_eq!(split_grouped(&name), Some((group, rest)), "{name}");
            assert_eq!(session_group(&name), group);
        }
        for plain in [
            "",
            "sess",
            "3:bob/s1",
            "s1:3:bob/s1",
            "@",
            "@0:/x",
            "@03:abc/x",
            "@3:ab",
            "@3:abcx",
            "@x:abc/",
        ] {
            assert_eq!(split_grouped(plain), None, "{plain}");
            assert_eq!(session_group(plain), plain);
        }
    }

    #[test]
    fn logs_must_share_the_sessions_group() {
        let s = grouped_name("g", "s");
        let ok = grouped_name("g", "log");
        let other = grouped_name("h", "log");
        let log = |log| LogWrite { log, record: None };
        assert!(check_group(&s, &[log(&ok)]).is_ok());
        assert!(check_group(&s, &[]).is_ok());
        assert!(check_group("plain", &[]).is_ok());
        for bad in [&other, &s, "g"] {
            let e = check_group(&s, &[log(&ok), log(bad)]).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Protocol, "{bad}");
        }
        assert!(check_group("plain", &[log("plain2")]).is_err());
    }
}
