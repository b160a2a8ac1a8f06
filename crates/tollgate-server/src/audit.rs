//! The decision audit log (`[audit]`): one JSON line per denial and per
//! shadow-denial — when, the user, the plan, the operation, the limit, the
//! retry hint and the request's W3C trace id — to a file or stderr.
//!
//! A flood cannot fill a disk or stall a request: lines past
//! `max_lines_per_second` are dropped (counted in
//! `tollgate_audit_dropped_total`, and one line a second says how many), a
//! request only hands its line to a bounded queue (a full queue drops it
//! too), and a file past `max_file_bytes` is rotated: renamed to
//! `<file>.1` (the previous `.1` is replaced), so the log holds at most
//! twice that. `file = "stderr"` hands rotation to the system's log
//! collector instead.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use serde::{Deserialize, Serialize};
use tollgate_core::Clock;
use tollgate_core::plan::FieldError;

/// `[audit]` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// Where: a file path (relative to the config file's directory) or
    /// `"stderr"`. Required.
    #[serde(default)]
    pub file: Option<String>,
    /// Lines written per second at most (default 100; 1 to 100,000).
    #[serde(default)]
    pub max_lines_per_second: Option<u32>,
    /// Size at which the file is rotated, bytes (default 100 MiB; 4 KiB to
    /// 1 TiB). Not with `"stderr"`.
    #[serde(default)]
    pub max_file_bytes: Option<u64>,
}

/// Where audit lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditTarget {
    /// The process's standard error.
    Stderr,
    /// A file, rotated at a size.
    File {
        /// The file.
        path: PathBuf,
        /// Rotated past this many bytes.
        max_bytes: u64,
    },
}

/// Validated `[audit]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSettings {
    /// Where.
    pub target: AuditTarget,
    /// Lines per second at most.
    pub max_lines_per_second: u32,
}

/// Default `max_lines_per_second`.
pub const DEFAULT_LINES_PER_SECOND: u32 = 100;
/// Default `max_file_bytes`: 100 MiB.
pub const DEFAULT_FILE_BYTES: u64 = 100 << 20;
/// Lines waiting for the writer at most; past it a line is dropped.
const QUEUE: usize = 4_096;

impl AuditConfig {
    /// Checks `[audit]` (`None`: no table, no audit log).
    ///
    /// # Errors
    ///
    /// Each problem with its field path.
    pub fn validate(&self, base_dir: &Path) -> Result<AuditSettings, Vec<FieldError>> {
        let mut errors = Vec::new();
        let mut err = |path: &str, reason: String| {
            errors.push(FieldError {
                path: format!("audit.{path}"),
                reason,
            });
        };
        let lines = self
            .max_lines_per_second
            .unwrap_or(DEFAULT_LINES_PER_SECOND);
        if !(1..=100_000).contains(&lines) {
            err(
                "max_lines_per_second",
                format!("must be between 1 and 100000 (got {lines})"),
            );
        }
        let bytes = self.max_file_bytes.unwrap_or(DEFAULT_FILE_BYTES);
        if !(4_096..=1 << 40).contains(&bytes) {
            err(
                "max_file_bytes",
                format!("must be between 4096 and 1099511627776 (got {bytes})"),
            );
        }
        let target = match self.file.as_deref() {
            None | Some("") => {
                err("file", "is required: a path, or \"stderr\"".to_owned());
                None
            }
            Some("stderr") => {
                if self.max_file_bytes.is_some() {
                    err(
                        "max_file_bytes",
                        "applies to a file, not to stderr".to_owned(),
                    );
                }
                Some(AuditTarget::Stderr)
            }
            Some(p) => Some(AuditTarget::File {
                path: base_dir.join(p),
                max_bytes: bytes,
            }),
        };
        match target {
            Some(target) if errors.is_empty() => Ok(AuditSettings {
                target,
                max_lines_per_second: lines,
            }),
            _ => Err(errors),
        }
    }
}

/// One refusal, as an audit line.
#[derive(Debug, Serialize)]
pub struct AuditEntry<'a> {
    /// When, ms since the epoch.
    pub ts_ms: u64,
    /// The verified user (`null`: a rate-limit service decision of a bucket
    /// rule, which has none).
    pub user: Option<&'a str>,
    /// Their plan (a rate-limit service bucket: the rule's name).
    pub plan: &'a str,
    /// `admit`, `reserve`, or `rls` (Envoy's rate-limit service).
    pub op: &'a str,
    /// The refusing limit.
    pub limit: &'a str,
    /// `denied`, or `shadow_denied` (shadow mode let it through).
    pub outcome: &'a str,
    /// The retry hint, ms (`null`: not retryable).
    pub retry_after_ms: Option<u64>,
    /// The request's W3C trace id (its `traceparent`), if it sent one.
    pub trace_id: Option<&'a str>,
}

struct Window {
    second: u64,
    written: u32,
    dropped: u64,
}

/// The audit log of a running server.
pub struct AuditLog {
    tx: SyncSender<Msg>,
    clock: Arc<dyn Clock>,
    max_per_second: u32,
    window: parking_lot::Mutex<Window>,
    dropped: prometheus_client::metrics::counter::Counter,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").finish_non_exhaustive()
    }
}

impl AuditLog {
    /// Opens the target (a file is created if missing, appended to) and
    /// starts the writer thread. `dropped` counts the lines not written.
    ///
    /// # Errors
    ///
    /// The file cannot be opened.
    pub fn start(
        settings: &AuditSettings,
        clock: Arc<dyn Clock>,
        dropped: prometheus_client::metrics::counter::Counter,
    ) -> io::Result<Self> {
        let sink = match &settings.target {
            AuditTarget::Stderr => Sink::Stderr,
            AuditTarget::File { path, max_bytes } => {
                let file = open(path)?;
                let size = file.metadata()?.len();
                Sink::File {
                    path: path.clone(),
                    file: io::BufWriter::new(file),
                    size,
                    max_bytes: *max_bytes,
                }
            }
        };
        let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(QUEUE);
        std::thread::Builder::new()
            .name("tollgate-audit".into())
            .spawn(move || write_lines(sink, &rx))?;
        Ok(Self {
            tx,
            clock,
            max_per_second: settings.max_lines_per_second,
            window: parking_lot::Mutex::new(Window {
                second: 0,
                written: 0,
                dropped: 0,
            }),
            dropped,
        })
    }

    /// Records a refusal, unless this second's lines are spent or the
    /// queue is full (then it is counted as dropped). Never blocks.
    pub fn record(&self, entry: &AuditEntry<'_>) {
        let now = self.clock.now_ms();
        let second = now / 1_000;
        let mut summary = None;
        {
            let mut w = self.window.lock();
            if w.second != second {
                if w.dropped > 0 {
                    summary = Some(w.dropped);
                }
                *w = Window {
                    second,
                    written: 0,
                    dropped: 0,
                };
            }
            if w.written >= self.max_per_second {
                w.dropped += 1;
                drop(w);
                self.dropped.inc();
                return;
            }
            w.written += 1;
        }
        if let Some(n) = summary {
            self.send(dropped_line(now, n));
        }
        if let Ok(line) = serde_json::to_string(entry) {
            self.send(line);
        }
    }

    /// Writes what is queued (and a line for what this second dropped),
    /// flushes the file and waits for it, at most `timeout`: the server
    /// calls it as it stops, so the last refusals are on disk. Blocks: call
    /// it off the runtime's threads.
    pub fn flush(&self, timeout: std::time::Duration) {
        let dropped = std::mem::take(&mut self.window.lock().dropped);
        if dropped > 0 {
            self.send(dropped_line(self.clock.now_ms(), dropped));
        }
        let (done, flushed) = std::sync::mpsc::sync_channel(1);
        if self.tx.send(Msg::Flush(done)).is_ok() {
            let _ = flushed.recv_timeout(timeout);
        }
    }

    fn send(&self, line: String) {
        match self.tx.try_send(Msg::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
        }
    }
}

/// What the writer thread is handed.
enum Msg {
    /// A line to write.
    Line(String),
    /// Flush, then say so.
    Flush(SyncSender<()>),
}

fn dropped_line(now: u64, n: u64) -> String {
    serde_json::json!({
        "ts_ms": now,
        "dropped": n,
        "message": format!("{n} audit lines dropped in the last second with lines: over max_lines_per_second, or the queue full"),
    })
    .to_string()
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

enum Sink {
    Stderr,
    File {
        path: PathBuf,
        file: io::BufWriter<File>,
        size: u64,
        max_bytes: u64,
    },
}

/// The writer thread: one line at a time, flushed whenever the queue is
/// empty; a file past its size is rotated first.
fn write_lines(mut sink: Sink, rx: &Receiver<Msg>) {
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        let mut waiting = Vec::new();
        while let Some(msg) = next {
            match msg {
                Msg::Line(line) => {
                    if let Err(e) = sink.write(&line) {
                        tracing::warn!(error = %e, "audit log write failed");
                    }
                }
                Msg::Flush(done) => waiting.push(done),
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = sink.flush() {
            tracing::warn!(error = %e, "audit log flush failed");
        }
        for done in waiting {
            let _ = done.try_send(());
        }
    }
}

impl Sink {
    fn write(&mut self, line: &str) -> io::Result<()> {
        match self {
            Sink::Stderr => {
                let mut err = io::stderr().lock();
                err.write_all(line.as_bytes())?;
                err.write_all(b"\n")
            }
            Sink::File {
                path,
                file,
                size,
                max_bytes,
            } => {
                let n = line.len() as u64 + 1;
                if *size > 0 && size.saturating_add(n) > *max_bytes {
                    file.flush()?;
                    let mut rotated = path.clone().into_os_string();
                    rotated.push(".1");
                    // Whatever happens, the size restarts: a rotation that
                    // failed is tried again a file's length later, not on
                    // every line.
                    *size = 0;
                    std::fs::rename(&*path, &rotated)?;
                    match open(path) {
                        Ok(f) => *file = io::BufWriter::new(f),
                        Err(e) => {
                            // Keep writing where the lines went so far.
                            let _ = std::fs::rename(&rotated, &*path);
                            return Err(e);
                        }
                    }
                }
                file.write_all(line.as_bytes())?;
                file.write_all(b"\n")?;
                *size += n;
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Stderr => io::stderr().flush(),
            Sink::File { file, .. } => file.flush(),
        }
    }
}

/// A W3C `traceparent`: the caller's trace and span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id, 32 lowercase hex digits.
    pub trace_id: String,
    /// The caller's span id, 16 lowercase hex digits.
    pub span_id: String,
    /// The caller sampled the trace (flag 01).
    pub sampled: bool,
}

/// Reads a `traceparent` header value (`00-<32 hex>-<16 hex>-<2 hex>`):
/// `None` unless it is well formed, with ids not all zeros.
pub fn parse_traceparent(v: &str) -> Option<TraceParent> {
    let mut parts = v.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    let ok = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(span, 16)
        && span.bytes().any(|b| b != b'0')
        && hex(flags, 2)
        && (version != "00" || parts.next().is_none());
    let flags = u8::from_str_radix(flags, 16).ok()?;
    ok.then(|| TraceParent {
        trace_id: trace.to_owned(),
        span_id: span.to_owned(),
        sampled: flags & 1 == 1,
    })
}

/// What the request being served carries for its decision's audit line
/// and span.
#[derive(Debug, Clone, Default)]
pub struct RequestContext {
    /// Its `traceparent`, if well formed.
    pub parent: Option<TraceParent>,
    /// When it started, ms since the epoch (the server's clock).
    pub started_ms: u64,
}

tokio::task_local! {
    /// The request being served (set by the HTTP middleware and the gRPC
    /// call wrapper).
    pub static REQUEST: RequestContext;
}

/// The request being served, if any.
pub fn current() -> Option<RequestContext> {
    REQUEST.try_with(Clone::clone).ok()
}

/// The request context of `headers` (their `traceparent`), started at
/// `started_ms`.
pub fn from_headers(headers: &axum::http::HeaderMap, started_ms: u64) -> RequestContext {
    RequestContext {
        parent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_traceparent),
        started_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_come_from_well_formed_traceparents_only() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        let trace_id = |v: &str| parse_traceparent(v).map(|p| p.trace_id);
        assert_eq!(
            parse_traceparent(&format!("00-{id}-00f067aa0ba902b7-01")),
            Some(TraceParent {
                trace_id: id.into(),
                span_id: "00f067aa0ba902b7".into(),
                sampled: true
            })
        );
        assert!(
            !parse_traceparent(&format!("00-{id}-00f067aa0ba902b7-00"))
                .unwrap()
                .sampled
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(trace_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn settings_are_validated_with_their_paths() {
        let base = Path::new("/etc/tollgate");
        let ok = AuditConfig {
            file: Some("audit.jsonl".into()),
            ..AuditConfig::default()
        }
        .validate(base)
        .unwrap();
        assert_eq!(
            ok.target,
            AuditTarget::File {
                path: base.join("audit.jsonl"),
                max_bytes: DEFAULT_FILE_BYTES
            }
        );
        assert_eq!(ok.max_lines_per_second, DEFAULT_LINES_PER_SECOND);
        let errs = |c: AuditConfig| -> Vec<String> {
            c.validate(base)
                .unwrap_err()
                .iter()
                .map(|e| format!("{}: {}", e.path, e.reason))
                .collect()
        };
        assert_eq!(
            errs(AuditConfig::default()),
            ["audit.file: is required: a path, or \"stderr\""]
        );
        assert_eq!(
            errs(AuditConfig {
                file: Some("stderr".into()),
                max_lines_per_second: Some(0),
                max_file_bytes: Some(1),
            }),
            [
                "audit.max_lines_per_second: must be between 1 and 100000 (got 0)",
                "audit.max_file_bytes: must be between 4096 and 1099511627776 (got 1)",
                "audit.max_file_bytes: applies to a file, not to stderr",
            ]
        );
    }
}
