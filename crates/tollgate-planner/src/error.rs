//! [`PlanError`]: why a planning command could not answer.

use std::fmt;
use std::io;
use std::path::PathBuf;

use tollgate_core::plan::FieldError;

/// Why a planning command could not answer.
///
/// Malformed input names its line and field
/// (`trace.jsonl: line 17: field "user": missing`); a bad config lists every
/// problem with its field path. [`exit_code`](Self::exit_code) maps each
/// kind to a `sysexits.h` status for the CLI.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A file could not be read or written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// `"read"` or `"write"`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A line of a JSON-lines input is malformed.
    #[error("{source_name}: line {line}: {}", FieldReason(field.as_deref(), reason))]
    Line {
        /// The input's name (its path, or what the caller called it).
        source_name: String,
        /// The line number, from 1.
        line: u64,
        /// The field at fault, if one is (`headers.retry-after` for a
        /// nested one).
        field: Option<String>,
        /// What is wrong.
        reason: String,
    },
    /// The config file is not valid: every problem, each with its field
    /// path (`plans.support.turns.amount: must be at least 1 (got 0)`).
    #[error("{source_name} is not a valid config:{}", List(errors))]
    Config {
        /// The config's name (its path).
        source_name: String,
        /// Each problem.
        errors: Vec<FieldError>,
    },
    /// An argument is out of range (`--per-replica must be at least 1`).
    #[error("{field}: {reason}")]
    Input {
        /// The argument, as the CLI names it (`--arrival-rate`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The chart could not be drawn.
    #[error("cannot draw the chart: {0}")]
    Chart(String),
    /// The replay could not decide (a bug: the in-memory store never fails).
    #[error("replay failed: {0}")]
    Replay(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl PlanError {
    /// The process exit status for this error (`sysexits.h`): 64
    /// (`EX_USAGE`) for a bad argument or config, as `tollgate check-config`;
    /// 65 (`EX_DATAERR`) for a malformed input line; 66 (`EX_NOINPUT`) for
    /// an input that cannot be read; 73 (`EX_CANTCREAT`) for an output that
    /// cannot be written; 70 (`EX_SOFTWARE`) otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            PlanError::Input { .. } | PlanError::Config { .. } => 64,
            PlanError::Line { .. } => 65,
            PlanError::Io { action: "read", .. } => 66,
            PlanError::Io { .. } => 73,
            PlanError::Chart(_) | PlanError::Replay(_) => 70,
        }
    }

    pub(crate) fn line(
        source_name: &str,
        line: u64,
        field: Option<&str>,
        reason: impl Into<String>,
    ) -> Self {
        PlanError::Line {
            source_name: source_name.to_owned(),
            line,
            field: field.map(str::to_owned),
            reason: reason.into(),
        }
    }

    pub(crate) fn input(field: &str, reason: impl Into<String>) -> Self {
        PlanError::Input {
            field: field.to_owned(),
            reason: reason.into(),
        }
    }

    pub(crate) fn read(path: impl Into<PathBuf>, source: io::Error) -> Self {
        PlanError::Io {
            action: "read",
            path: path.into(),
            source,
        }
    }

    pub(crate) fn write(path: impl Into<PathBuf>, source: io::Error) -> Self {
        PlanError::Io {
            action: "write",
            path: path.into(),
            source,
        }
    }
}

struct FieldReason<'a>(Option<&'a str>, &'a str);

impl fmt::Display for FieldReason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(field) => write!(f, "field {field:?}: {}", self.1),
            None => f.write_str(self.1),
        }
    }
}

struct List<'a>(&'a [FieldError]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in self.0 {
            write!(f, "\n  - {e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_line_and_field() {
        let e = PlanError::line("t.jsonl", 17, Some("user"), "missing");
        assert_eq!(e.to_string(), r#"t.jsonl: line 17: field "user": missing"#);
        assert_eq!(e.exit_code(), 65);
        let e = PlanError::line("t.jsonl", 3, None, "not JSON");
        assert_eq!(e.to_string(), "t.jsonl: line 3: not JSON");
        let e = PlanError::Config {
            source_name: "c.toml".into(),
            errors: vec![FieldError {
                path: "plans.a.turns.amount".into(),
                reason: "must be at least 1 (got 0)".into(),
            }],
        };
        assert_eq!(
            e.to_string(),
            "c.toml is not a valid config:\n  - plans.a.turns.amount: must be at least 1 (got 0)"
        );
        assert_eq!(e.exit_code(), 64);
        let e = PlanError::read("x", io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(e.exit_code(), 66);
        assert!(e.to_string().starts_with("cannot read x: "));
    }
}
