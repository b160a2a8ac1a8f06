//! OpenTelemetry traces (`[telemetry]`): a span per decision of the HTTP
//! and gRPC APIs (`tollgate.admit`, `tollgate.reserve`) and of Envoy's
//! rate-limit service (`tollgate.rls`, one per descriptor) with its operation,
//! limit, outcome, plan and wait, child of the caller's W3C `traceparent`
//! (HTTP header or gRPC metadata), sampled at `sample_ratio` (a sampled
//! parent is followed), exported over OTLP/gRPC in batches. No user id
//! unless `include_user_id = true`; never a token.
//!
//! Without `[telemetry] otlp_endpoint` nothing is built: no tracer, no
//! exporter thread, and a decision costs one `Option` check.

use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use serde::{Deserialize, Serialize};
use tollgate_core::plan::FieldError;

use crate::audit::TraceParent;

/// `[telemetry]` as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/gRPC collector, `http://host:4317` (or `https://`).
    /// Required in the table.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// Share of traces sampled, 0 to 1 (default 0.01); a caller's sampled
    /// `traceparent` is followed whatever the ratio.
    #[serde(default)]
    pub sample_ratio: Option<f64>,
    /// The `service.name` resource attribute (default `"tollgate"`).
    #[serde(default)]
    pub service_name: Option<String>,
    /// Put the user id on spans (`tollgate.user`; default false: spans
    /// carry no user id).
    #[serde(default)]
    pub include_user_id: Option<bool>,
}

/// Validated `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetrySettings {
    /// The collector.
    pub endpoint: String,
    /// Share of root traces sampled.
    pub sample_ratio: f64,
    /// `service.name`.
    pub service_name: String,
    /// Spans carry the user id.
    pub include_user_id: bool,
}

/// Default `sample_ratio`: one decision in a hundred.
pub const DEFAULT_SAMPLE_RATIO: f64 = 0.01;

impl TelemetryConfig {
    /// Checks `[telemetry]`.
    ///
    /// # Errors
    ///
    /// Each problem with its field path.
    pub fn validate(&self) -> Result<TelemetrySettings, Vec<FieldError>> {
        let mut errors = Vec::new();
        let mut err = |path: &str, reason: String| {
            errors.push(FieldError {
                path: format!("telemetry.{path}"),
                reason,
            });
        };
        let endpoint = match self.otlp_endpoint.as_deref() {
            None => {
                err(
                    "otlp_endpoint",
                    "is required: the OTLP/gRPC collector, e.g. \"http://127.0.0.1:4317\"".into(),
                );
                None
            }
            Some(e) => match e.parse::<axum::http::Uri>() {
                Ok(u)
                    if matches!(u.scheme_str(), Some("http" | "https"))
                        && u.authority().is_some() =>
                {
                    Some(e.to_owned())
                }
                _ => {
                    err(
                        "otlp_endpoint",
                        format!("must be an http:// or https:// URL with a host (got {e:?})"),
                    );
                    None
                }
            },
        };
        let ratio = self.sample_ratio.unwrap_or(DEFAULT_SAMPLE_RATIO);
        if !(0.0..=1.0).contains(&ratio) {
            err(
                "sample_ratio",
                format!("must be between 0 and 1 (got {ratio})"),
            );
        }
        let name = self
            .service_name
            .clone()
            .unwrap_or_else(|| "tollgate".into());
        if name.is_empty() || name.len() > 256 {
            err("service_name", "must be 1 to 256 bytes".into());
        }
        match endpoint {
            Some(endpoint) if errors.is_empty() => Ok(TelemetrySettings {
                endpoint,
                sample_ratio: ratio,
                service_name: name,
                include_user_id: self.include_user_id.unwrap_or(false),
            }),
            _ => Err(errors),
        }
    }
}

/// A running exporter of decision spans.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: opentelemetry_sdk::trace::SdkTracer,
    include_user_id: bool,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

/// One decision, as a span.
#[derive(Debug, Clone, Copy)]
pub struct DecisionSpan<'a> {
    /// `admit` or `reserve`.
    pub op: &'static str,
    /// The refusing limit, or `none`.
    pub limit: &'a str,
    /// `allowed`, `waited`, `denied` or `shadow_denied`.
    pub outcome: &'a str,
    /// The user's plan.
    pub plan: &'a str,
    /// The wait granted, ms.
    pub wait_ms: u64,
    /// The user, if the decision has one (on the span only with
    /// `include_user_id`).
    pub user: Option<&'a str>,
    /// The request's start and the decision's end, ms since the epoch.
    pub started_ms: u64,
    /// When the decision was answered, ms since the epoch.
    pub ended_ms: u64,
}

fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

impl Telemetry {
    /// Builds the OTLP/gRPC exporter (within a tokio runtime: its channel
    /// runs there) and the batching tracer.
    ///
    /// # Errors
    ///
    /// The exporter cannot be built (a malformed endpoint).
    pub fn start(s: &TelemetrySettings) -> Result<Self, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&s.endpoint)
            .build()
            .map_err(|e| e.to_string())?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                s.sample_ratio,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(s.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("tollgate");
        Ok(Self {
            provider,
            tracer,
            include_user_id: s.include_user_id,
        })
    }

    /// Records one decision's span, child of `parent` if the request named
    /// one.
    pub fn decision(&self, d: &DecisionSpan<'_>, parent: Option<&TraceParent>) {
        let cx = match parent.and_then(remote) {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::new(),
        };
        let mut attributes = vec![
            KeyValue::new("tollgate.op", d.op),
            KeyValue::new("tollgate.limit", d.limit.to_owned()),
            KeyValue::new("tollgate.outcome", d.outcome.to_owned()),
            KeyValue::new("tollgate.plan", d.plan.to_owned()),
            KeyValue::new(
                "tollgate.wait_ms",
                i64::try_from(d.wait_ms).unwrap_or(i64::MAX),
            ),
        ];
        if self.include_user_id
            && let Some(u) = d.user
        {
            attributes.push(KeyValue::new("tollgate.user", u.to_owned()));
        }
        let mut span = self
            .tracer
            .span_builder(match d.op {
                "admit" => "tollgate.admit",
                "reserve" => "tollgate.reserve",
                "rls" => "tollgate.rls",
                _ => "tollgate.decision",
            })
            .with_kind(SpanKind::Server)
            .with_start_time(at(d.started_ms))
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &cx);
        span.end_with_timestamp(at(d.ended_ms.max(d.started_ms)));
    }

    /// Exports what is buffered and stops (blocks: call it off the
    /// runtime's threads).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "telemetry: shutdown");
        }
    }
}

/// The caller's span as a remote parent.
fn remote(p: &TraceParent) -> Option<SpanContext> {
    let trace = TraceId::from_hex(&p.trace_id).ok()?;
    let span = SpanId::from_hex(&p.span_id).ok()?;
    let flags = if p.sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    Some(SpanContext::new(
        trace,
        span,
        flags,
        true,
        TraceState::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_validated_with_their_paths() {
        let ok = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:4317".into()),
            ..TelemetryConfig::default()
        }
        .validate()
        .unwrap();
        assert_eq!(ok.sample_ratio, DEFAULT_SAMPLE_RATIO);
        assert_eq!(ok.service_name, "tollgate");
        assert!(!ok.include_user_id);
        let errs = |c: TelemetryConfig| -> Vec<String> {
            c.validate()
                .unwrap_err()
                .iter()
                .map(|e| format!("{}: {}", e.path, e.reason))
                .collect()
        };
        assert_eq!(
            errs(TelemetryConfig {
                otlp_endpoint: Some("127.0.0.1:4317".into()),
                sample_ratio: Some(1.5),
                service_name: Some(String::new()),
                include_user_id: None,
            }),
            [
                "telemetry.otlp_endpoint: must be an http:// or https:// URL with a host (got \"127.0.0.1:4317\")",
                "telemetry.sample_ratio: must be between 0 and 1 (got 1.5)",
                "telemetry.service_name: must be 1 to 256 bytes",
            ]
        );
        assert_eq!(
            errs(TelemetryConfig::default()),
            [
                "telemetry.otlp_endpoint: is required: the OTLP/gRPC collector, e.g. \"http://127.0.0.1:4317\""
            ]
        );
    }
}
