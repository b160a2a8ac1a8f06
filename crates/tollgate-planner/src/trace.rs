//! The trace format: one JSON object per line (docs/planning.md).

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;

use crate::PlanError;
use crate::jsonl;

/// One line as written; which fields are required depends on `event`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent<'a> {
    t_ms: Option<u64>,
    #[serde(borrow)]
    event: Option<Cow<'a, str>>,
    #[serde(borrow)]
    user: Option<Cow<'a, str>>,
    #[serde(borrow)]
    session: Option<Cow<'a, str>>,
    #[serde(borrow)]
    invocation: Option<Cow<'a, str>>,
    estimate: Option<u64>,
    actual: Option<u64>,
    duration_ms: Option<u64>,
    #[serde(borrow)]
    provider: Option<Cow<'a, str>>,
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tenant: Option<Cow<'a, str>>,
    tokens: Option<u64>,
    status: Option<u16>,
    headers: Option<BTreeMap<String, String>>,
    body: Option<String>,
}

/// A provider key named by an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProviderRef<'a> {
    pub(crate) provider: Cow<'a, str>,
    pub(crate) model: Cow<'a, str>,
    pub(crate) tenant: Option<Cow<'a, str>>,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event<'a> {
    /// A turn asks for admission (and its session's lease, if named).
    TurnStart {
        user: Cow<'a, str>,
        invocation: Cow<'a, str>,
        session: Option<Cow<'a, str>>,
    },
    /// A model call of a running turn.
    ModelCall {
        user: Cow<'a, str>,
        invocation: Cow<'a, str>,
        estimate: Option<u64>,
        actual: Option<u64>,
        duration_ms: u64,
        provider: Option<ProviderRef<'a>>,
    },
    /// The turn finished: its leases are released.
    TurnEnd {
        user: Cow<'a, str>,
        invocation: Cow<'a, str>,
    },
    /// The client vanished: the turn stops renewing and never releases.
    TurnAbandon {
        user: Cow<'a, str>,
        invocation: Cow<'a, str>,
    },
    /// A provider permit outside any user's turn.
    ProviderCall {
        provider: ProviderRef<'a>,
        tokens: u64,
    },
    /// A provider's answer.
    ProviderResponse {
        provider: ProviderRef<'a>,
        status: u16,
        headers: BTreeMap<String, String>,
        body: Option<String>,
    },
}

/// The event kinds, as written.
const KINDS: &str =
    "turn_start, model_call, turn_end, turn_abandon, provider_call, provider_response";

/// Parses one line.
pub(crate) fn parse_line<'a>(
    source_name: &str,
    line: u64,
    text: &'a str,
) -> Result<(u64, Event<'a>), PlanError> {
    let raw: RawEvent<'a> = jsonl::parse(source_name, line, text)?;
    let err = |field: &str, reason: &str| PlanError::line(source_name, line, Some(field), reason);
    let t_ms = raw.t_ms.ok_or_else(|| err("t_ms", "missing"))?;
    let kind = raw
        .event
        .as_deref()
        .ok_or_else(|| err("event", "missing"))?;
    let allowed: &[&str] = match kind {
        "turn_start" => &["user", "invocation", "session"],
        "model_call" => &[
            "user",
            "invocation",
            "estimate",
            "actual",
            "duration_ms",
            "provider",
            "model",
            "tenant",
        ],
        "turn_end" | "turn_abandon" => &["user", "invocation"],
        "provider_call" => &["provider", "model", "tenant", "tokens"],
        "provider_response" => &["provider", "model", "status", "headers", "body"],
        other => {
            return Err(err(
                "event",
                &format!("unknown event {other:?} (expected one of {KINDS})"),
            ));
        }
    };
    let present = [
        ("user", raw.user.is_some()),
        ("session", raw.session.is_some()),
        ("invocation", raw.invocation.is_some()),
        ("estimate", raw.estimate.is_some()),
        ("actual", raw.actual.is_some()),
        ("duration_ms", raw.duration_ms.is_some()),
        ("provider", raw.provider.is_some()),
        ("model", raw.model.is_some()),
        ("tenant", raw.tenant.is_some()),
        ("tokens", raw.tokens.is_some()),
        ("status", raw.status.is_some()),
        ("headers", raw.headers.is_some()),
        ("body", raw.body.is_some()),
    ];
    if let Some((name, _)) = present
        .iter()
        .find(|(name, set)| *set && !allowed.contains(name))
    {
        return Err(err(name, &format!("not a field of {kind} events")));
    }
    let need = |v: Option<Cow<'a, str>>, name: &str| -> Result<Cow<'a, str>, PlanError> {
        match v {
            Some(s) if s.is_empty() => Err(err(name, "must not be empty")),
            Some(s) => Ok(s),
            None => Err(err(name, "missing")),
        }
    };
    let provider_ref = |raw_provider: Option<Cow<'a, str>>,
                        raw_model: Option<Cow<'a, str>>,
                        tenant: Option<Cow<'a, str>>|
     -> Result<ProviderRef<'a>, PlanError> {
        Ok(ProviderRef {
            provider: need(raw_provider, "provider")?,
            model: need(raw_model, "model")?,
            tenant,
        })
    };
    let event = match kind {
        "turn_start" => Event::TurnStart {
            user: need(raw.user, "user")?,
            invocation: need(raw.invocation, "invocation")?,
            session: match raw.session {
                Some(s) if s.is_empty() => return Err(err("session", "must not be empty")),
                s => s,
            },
        },
        "model_call" => {
            let provider = match (raw.provider.is_some(), raw.model.is_some()) {
                (false, false) if raw.tenant.is_some() => {
                    return Err(err("tenant", "needs provider and model"));
                }
                (false, false) => None,
                _ => Some(provider_ref(raw.provider, raw.model, raw.tenant)?),
            };
            Event::ModelCall {
                user: need(raw.user, "user")?,
                invocation: need(raw.invocation, "invocation")?,
                estimate: match raw.estimate {
                    Some(0) => return Err(err("estimate", "must be at least 1")),
                    e => e,
                },
                actual: raw.actual,
                duration_ms: raw.duration_ms.unwrap_or(0),
                provider,
            }
        }
        "turn_end" => Event::TurnEnd {
            user: need(raw.user, "user")?,
            invocation: need(raw.invocation, "invocation")?,
        },
        "turn_abandon" => Event::TurnAbandon {
            user: need(raw.user, "user")?,
            invocation: need(raw.invocation, "invocation")?,
        },
        "provider_call" => Event::ProviderCall {
            provider: provider_ref(raw.provider, raw.model, raw.tenant)?,
            tokens: raw.tokens.unwrap_or(0),
        },
        _ => Event::ProviderResponse {
            provider: provider_ref(raw.provider, raw.model, None)?,
            status: raw.status.ok_or_else(|| err("status", "missing"))?,
            headers: raw.headers.unwrap_or_default(),
            body: raw.body,
        },
    };
    Ok((t_ms, event))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<(u64, Event<'_>), String> {
        parse_line("t.jsonl", 17, text).map_err(|e| e.to_string())
    }

    #[test]
    fn parses_every_kind() {
        let (t, e) = parse(
            r#"{"t_ms": 0, "user": "u1", "session": "s1", "event": "turn_start", "invocation": "i1"}"#,
        )
        .unwrap();
        assert_eq!(t, 0);
        assert!(matches!(e, Event::TurnStart { session: Some(s), .. } if s == "s1"));
        let (_, e) = parse(
            r#"{"t_ms": 10, "user":"u1", "event": "model_call", "invocation":"i1", "estimate": 6000, "actual": 5400}"#,
        )
        .unwrap();
        assert!(matches!(
            e,
            Event::ModelCall {
                estimate: Some(6_000),
                actual: Some(5_400),
                provider: None,
                ..
            }
        ));
        let (_, e) = parse(
            r#"{"t_ms": 30, "event":"provider_response", "provider":"openai", "model":"gpt-4o", "status":429, "headers":{"retry-after":"2"}}"#,
        )
        .unwrap();
        assert!(
            matches!(e, Event::ProviderResponse { status: 429, ref headers, .. } if headers["retry-after"] == "2")
        );
        let (_, e) = parse(
            r#"{"t_ms": 30, "event":"provider_call", "provider":"openai", "model":"gpt-4o"}"#,
        )
        .unwrap();
        assert!(matches!(e, Event::ProviderCall { tokens: 0, .. }));
        assert!(
            parse(r#"{"t_ms": 1, "event":"turn_abandon", "user":"u", "invocation":"i"}"#).is_ok()
        );
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let cases = [
            (
                r#"{"t_ms": 0, "event": "turn_start", "invocation": "i1"}"#,
                r#"t.jsonl: line 17: field "user": missing"#,
            ),
            (
                r#"{"event": "turn_end", "user": "u", "invocation": "i1"}"#,
                r#"t.jsonl: line 17: field "t_ms": missing"#,
            ),
            (
                r#"{"t_ms": 0, "event": "turn_begin"}"#,
                r#"t.jsonl: line 17: field "event": unknown event "turn_begin" (expected one of turn_start, model_call, turn_end, turn_abandon, provider_call, provider_response)"#,
            ),
            (
                r#"{"t_ms": 0, "event": "turn_end", "user": "u", "invocation": "i", "estimate": 5}"#,
                r#"t.jsonl: line 17: field "estimate": not a field of turn_end events"#,
            ),
            (
                r#"{"t_ms": 0, "event": "model_call", "user": "u", "invocation": "i", "provider": "openai"}"#,
                r#"t.jsonl: line 17: field "model": missing"#,
            ),
            (
                r#"{"t_ms": 0, "event": "model_call", "user": "u", "invocation": "i", "estimate": 0}"#,
                r#"t.jsonl: line 17: field "estimate": must be at least 1"#,
            ),
            (
                r#"{"t_ms": -5, "event": "turn_end"}"#,
                r#"t.jsonl: line 17: field "t_ms": invalid value: integer `-5`, expected u64"#,
            ),
            (
                r#"{"t_ms": 0, "event": "turn_start", "user": "", "invocation": "i"}"#,
                r#"t.jsonl: line 17: field "user": must not be empty"#,
            ),
            (
                r#"{"t_ms": 0, "event": "provider_response", "provider": "p", "model": "m"}"#,
                r#"t.jsonl: line 17: field "status": missing"#,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text).unwrap_err(), want, "{text}");
        }
    }
}
