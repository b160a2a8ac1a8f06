//! `tollgate capacity`: fleet sizing by Little's law, in exact arithmetic.
//!
//! From the arrival rate and mean turn time, the turns in flight
//! (L = λ × W); from the safe in-flight turns per replica, the replicas
//! needed (rounded up) and to deploy (plus spares); from the model calls
//! per turn and tokens per call, the model requests and tokens per minute
//! against the provider quota, and which quota binds first. SPEC §7's
//! example reproduces exactly:
//!
//! ```
//! use tollgate_planner::capacity::{CapacityInput, capacity};
//!
//! let mut input = CapacityInput::new("40", "5.5", "3.2", "6500", 60, 2).unwrap();
//! input.quota_rpm = Some("10000".parse().unwrap());
//! input.quota_tpm = Some("40000000".parse().unwrap());
//! let r = capacity(&input).unwrap();
//! assert_eq!(r.turns_in_flight.to_string(), "220");
//! assert_eq!((r.replicas_needed, r.replicas_deploy), (4, 6));
//! assert_eq!(r.requests_per_min.to_string(), "7680");
//! assert_eq!(r.tokens_per_min.to_string(), "49920000");
//! let tokens = r.tokens_quota.as_ref().unwrap();
//! assert_eq!((tokens.utilization_pct.round(), tokens.over_quota), (125, true));
//! assert_eq!(r.requests_quota.as_ref().unwrap().utilization_pct.round(), 77);
//! assert_eq!(r.binding.as_deref(), Some("tokens"));
//! ```

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::rational::group;
use crate::{PlanError, Rational, RationalError};

/// `tollgate capacity`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityInput {
    /// Turns arriving per second, fleet-wide (`--arrival-rate`).
    pub arrival_rate: Rational,
    /// Mean turn time, seconds (`--mean-turn-s`).
    pub mean_turn_s: Rational,
    /// Mean model calls per turn (`--mean-calls`).
    pub mean_calls: Rational,
    /// 95th percentile of model calls per turn (`--p95-calls`): adds the
    /// load if every turn made that many calls, a pessimistic bound.
    pub p95_calls: Option<Rational>,
    /// Tokens per model call (`--tokens-per-call`), as the quota counts
    /// them (input tokens for an input-token quota).
    pub tokens_per_call: Rational,
    /// Safe in-flight turns per replica (`--per-replica`), e.g. from its
    /// heap budget: the server's `max_in_flight`.
    pub per_replica: u64,
    /// Spare replicas on top of those needed (`--spare`): 2 for N+2.
    pub spare: u64,
    /// The provider's requests-per-minute quota (`--quota-rpm`).
    pub quota_rpm: Option<Rational>,
    /// The provider's tokens-per-minute quota (`--quota-tpm`).
    pub quota_tpm: Option<Rational>,
}

impl CapacityInput {
    /// The required arguments, the decimals as text; no p95, no quota.
    ///
    /// # Errors
    ///
    /// [`PlanError::Input`] naming the flag of a number that does not parse.
    pub fn new(
        arrival_rate: &str,
        mean_turn_s: &str,
        mean_calls: &str,
        tokens_per_call: &str,
        per_replica: u64,
        spare: u64,
    ) -> Result<Self, PlanError> {
        let parse = |flag: &str, v: &str| {
            v.parse::<Rational>()
                .map_err(|e| PlanError::input(flag, e.to_string()))
        };
        Ok(Self {
            arrival_rate: parse("--arrival-rate", arrival_rate)?,
            mean_turn_s: parse("--mean-turn-s", mean_turn_s)?,
            mean_calls: parse("--mean-calls", mean_calls)?,
            p95_calls: None,
            tokens_per_call: parse("--tokens-per-call", tokens_per_call)?,
            per_replica,
            spare,
            quota_rpm: None,
            quota_tpm: None,
        })
    }
}

/// Demand against one quota.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaUse {
    /// `requests` or `tokens`.
    pub name: &'static str,
    /// Demand per minute at the mean.
    pub demand_per_min: Rational,
    /// The quota per minute.
    pub quota_per_min: Rational,
    /// Demand ÷ quota × 100, exact.
    pub utilization_pct: Rational,
    /// The same at the p95 calls per turn, if given.
    pub p95_utilization_pct: Option<Rational>,
    /// Whether demand at the mean exceeds the quota.
    pub over_quota: bool,
}

/// What `tollgate capacity` computes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CapacityReport {
    /// The arguments.
    pub input: CapacityInput,
    /// Turns in flight: arrival rate × mean turn time (Little's law).
    pub turns_in_flight: Rational,
    /// Replicas needed: turns in flight ÷ per replica, rounded up (at
    /// least 1).
    pub replicas_needed: u64,
    /// In-flight turns the needed replicas hold: needed × per replica.
    pub replica_capacity: u64,
    /// Replicas to deploy: needed + spare.
    pub replicas_deploy: u64,
    /// Model requests per second at the mean calls per turn.
    pub requests_per_s: Rational,
    /// Model requests per minute at the mean.
    pub requests_per_min: Rational,
    /// Model requests per minute if every turn made the p95 calls.
    pub requests_per_min_p95: Option<Rational>,
    /// Tokens per minute at the mean.
    pub tokens_per_min: Rational,
    /// Tokens per minute if every turn made the p95 calls.
    pub tokens_per_min_p95: Option<Rational>,
    /// Requests against `--quota-rpm`.
    pub requests_quota: Option<QuotaUse>,
    /// Tokens against `--quota-tpm`.
    pub tokens_quota: Option<QuotaUse>,
    /// The quota that binds first: the one with the highest utilization
    /// (`requests` or `tokens`; on a tie, tokens). `None` without quotas.
    pub binding: Option<String>,
    /// The arrival rate (turns/s) at which the binding quota is exactly
    /// used up, at the mean calls per turn.
    pub max_arrival_rate: Option<Rational>,
}

fn overflow(_: RationalError) -> PlanError {
    PlanError::input("(input)", "numbers too large to compute exactly")
}

/// Computes the fleet's numbers.
///
/// # Errors
///
/// [`PlanError::Input`] for an argument out of range (a zero arrival rate,
/// turn time, per-replica count or quota) or
/// numbers too large to compute exactly.
pub fn capacity(input: &CapacityInput) -> Result<CapacityReport, PlanError> {
    if input.arrival_rate.is_zero() {
        return Err(PlanError::input("--arrival-rate", "must be more than 0"));
    }
    if input.mean_turn_s.is_zero() {
        return Err(PlanError::input("--mean-turn-s", "must be more than 0"));
    }
    if input.per_replica == 0 {
        return Err(PlanError::input("--per-replica", "must be at least 1"));
    }
    for (flag, q) in [
        ("--quota-rpm", input.quota_rpm),
        ("--quota-tpm", input.quota_tpm),
    ] {
        if q.is_some_and(|q| q.is_zero()) {
            return Err(PlanError::input(flag, "must be more than 0"));
        }
    }
    let minute = Rational::int(60);
    let hundred = Rational::int(100);
    let in_flight = input
        .arrival_rate
        .try_mul(input.mean_turn_s)
        .map_err(overflow)?;
    let needed = in_flight
        .try_div(Rational::int(input.per_replica))
        .map_err(overflow)?
        .map_or(0, |r| r.ceil())
        .max(1);
    let needed = u64::try_from(needed).map_err(|_| overflow(RationalError::Overflow))?;
    let per_s = input
        .arrival_rate
        .try_mul(input.mean_calls)
        .map_err(overflow)?;
    let per_min = per_s.try_mul(minute).map_err(overflow)?;
    let tokens = per_min.try_mul(input.tokens_per_call).map_err(overflow)?;
    let p95 = match input.p95_calls {
        Some(c) => {
            let r = input
                .arrival_rate
                .try_mul(c)
                .and_then(|x| x.try_mul(minute))
                .map_err(overflow)?;
            Some((r, r.try_mul(input.tokens_per_call).map_err(overflow)?))
        }
        None => None,
    };
    let quota = |name: &'static str,
                 demand: Rational,
                 p95: Option<Rational>,
                 quota: Option<Rational>|
     -> Result<Option<QuotaUse>, PlanError> {
        let Some(q) = quota else { return Ok(None) };
        let pct = |d: Rational| -> Result<Rational, PlanError> {
            d.try_mul(hundred)
                .and_then(|x| x.try_div(q))
                .map_err(overflow)
                .map(|x| x.unwrap_or(Rational::ZERO))
        };
        Ok(Some(QuotaUse {
            name,
            demand_per_min: demand,
            quota_per_min: q,
            utilization_pct: pct(demand)?,
            p95_utilization_pct: p95.map(pct).transpose()?,
            over_quota: demand > q,
        }))
    };
    let requests_quota = quota("requests", per_min, p95.map(|(r, _)| r), input.quota_rpm)?;
    let tokens_quota = quota("tokens", tokens, p95.map(|(_, t)| t), input.quota_tpm)?;
    let binding = match (&requests_quota, &tokens_quota) {
        (Some(r), Some(t)) if r.utilization_pct > t.utilization_pct => Some(r),
        (_, Some(t)) => Some(t),
        (Some(r), None) => Some(r),
        (None, None) => None,
    };
    // At the binding quota's utilization u %, the rate that uses it up
    // exactly is arrival × 100 / u.
    let max_arrival_rate = match binding {
        Some(b) => input
            .arrival_rate
            .try_mul(hundred)
            .and_then(|x| x.try_div(b.utilization_pct))
            .map_err(overflow)?,
        None => None,
    };
    Ok(CapacityReport {
        input: input.clone(),
        turns_in_flight: in_flight,
        replicas_needed: needed,
        replica_capacity: needed.saturating_mul(input.per_replica),
        replicas_deploy: needed.saturating_add(input.spare),
        requests_per_s: per_s,
        requests_per_min: per_min,
        requests_per_min_p95: p95.map(|(r, _)| r),
        tokens_per_min: tokens,
        tokens_per_min_p95: p95.map(|(_, t)| t),
        binding: binding.map(|b| b.name.to_owned()),
        requests_quota,
        tokens_quota,
        max_arrival_rate,
    })
}

/// A JSON number: an integer when whole, else the nearest float.
fn num(r: &Rational) -> Value {
    if r.is_integer()
        && let Ok(n) = u64::try_from(r.numer())
    {
        return Value::from(n);
    }
    Value::from(r.to_f64())
}

fn opt(r: Option<&Rational>) -> Value {
    r.map_or(Value::Null, num)
}

fn quota_json(q: &Option<QuotaUse>) -> Value {
    match q {
        None => Value::Null,
        Some(q) => json!({
            "quota_per_min": num(&q.quota_per_min),
            "utilization_pct": num(&q.utilization_pct),
            "p95_utilization_pct": opt(q.p95_utilization_pct.as_ref()),
            "over_quota": q.over_quota,
        }),
    }
}

fn pct(r: &Rational) -> String {
    format!("{} %", r.display(0))
}

impl CapacityReport {
    /// The report as JSON: whole numbers as integers, others as floats
    /// (`"utilization_pct": 124.8`).
    pub fn to_json(&self) -> Value {
        let i = &self.input;
        json!({
            "input": {
                "arrival_rate": num(&i.arrival_rate),
                "mean_turn_s": num(&i.mean_turn_s),
                "mean_calls": num(&i.mean_calls),
                "p95_calls": opt(i.p95_calls.as_ref()),
                "tokens_per_call": num(&i.tokens_per_call),
                "per_replica": i.per_replica,
                "spare": i.spare,
                "quota_rpm": opt(i.quota_rpm.as_ref()),
                "quota_tpm": opt(i.quota_tpm.as_ref()),
            },
            "turns_in_flight": num(&self.turns_in_flight),
            "replicas": {
                "needed": self.replicas_needed,
                "capacity": self.replica_capacity,
                "spare": i.spare,
                "deploy": self.replicas_deploy,
            },
            "requests": {
                "per_s": num(&self.requests_per_s),
                "per_min": num(&self.requests_per_min),
                "p95_per_min": opt(self.requests_per_min_p95.as_ref()),
                "quota": quota_json(&self.requests_quota),
            },
            "tokens": {
                "per_min": num(&self.tokens_per_min),
                "p95_per_min": opt(self.tokens_per_min_p95.as_ref()),
                "quota": quota_json(&self.tokens_quota),
            },
            "binding": self.binding,
            "max_arrival_rate": opt(self.max_arrival_rate.as_ref()),
        })
    }

    /// The report as a table for people.
    pub fn to_table(&self) -> String {
        let i = &self.input;
        let d = |r: &Rational| r.display(2);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "turns in flight     {}   ({} turns/s × {} s per turn, Little's law)",
            d(&self.turns_in_flight),
            d(&i.arrival_rate),
            d(&i.mean_turn_s)
        );
        let _ = writeln!(
            out,
            "replicas needed     {}   ({} in-flight turns each: room for {})",
            self.replicas_needed,
            group(u128::from(i.per_replica)),
            group(u128::from(self.replica_capacity))
        );
        let _ = writeln!(
            out,
            "replicas to deploy  {}   (N+{})",
            self.replicas_deploy, i.spare
        );
        let _ = writeln!(
            out,
            "model requests      {}/s = {}/min   ({} calls per turn on average)",
            d(&self.requests_per_s),
            d(&self.requests_per_min),
            d(&i.mean_calls)
        );
        let _ = writeln!(
            out,
            "tokens              {}/min   ({} per call)",
            d(&self.tokens_per_min),
            d(&i.tokens_per_call)
        );
        if let (Some(p95), Some(r), Some(t)) = (
            i.p95_calls,
            self.requests_per_min_p95,
            self.tokens_per_min_p95,
        ) {
            let _ = writeln!(
                out,
                "{:<20}{}/min requests, {}/min tokens   (every turn making the p95: a pessimistic bound)",
                format!("at p95 ({} calls)", d(&p95)),
                d(&r),
                d(&t)
            );
        }
        let quotas: Vec<&QuotaUse> = [&self.requests_quota, &self.tokens_quota]
            .into_iter()
            .flatten()
            .collect();
        if quotas.is_empty() {
            return out;
        }
        out.push('\n');
        let p95 = quotas.iter().any(|q| q.p95_utilization_pct.is_some());
        let mut head = vec!["quota", "demand/min", "quota/min", "use"];
        if p95 {
            head.push("use at p95");
        }
        let mut rows: Vec<Vec<String>> = vec![head.into_iter().map(String::from).collect()];
        for q in &quotas {
            let mut row = vec![
                q.name.to_owned(),
                d(&q.demand_per_min),
                d(&q.quota_per_min),
                pct(&q.utilization_pct),
            ];
            if p95 {
                row.push(q.p95_utilization_pct.as_ref().map(pct).unwrap_or_default());
            }
            row.push(if q.over_quota {
                "over quota".into()
            } else {
                "ok".into()
            });
            rows.push(row);
        }
        let mut widths = vec![0usize; rows.iter().map(Vec::len).max().unwrap_or(0)];
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        for r in &rows {
            let mut line = format!("{:<w$}", r[0], w = widths[0]);
            for (c, w) in r.iter().zip(&widths).skip(1) {
                let _ = write!(line, "  {c:>w$}");
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        if let Some(b) = quotas
            .iter()
            .find(|q| Some(q.name) == self.binding.as_deref())
        {
            let verdict = if b.over_quota {
                format!(
                    "{} bind: demand is {} of the quota",
                    b.name,
                    pct(&b.utilization_pct)
                )
            } else {
                format!(
                    "{} bind first, at {} of the quota",
                    b.name,
                    pct(&b.utilization_pct)
                )
            };
            let _ = write!(out, "\n{verdict}");
            if let Some(m) = &self.max_arrival_rate {
                let _ = write!(out, "; the quota sustains at most {} turns/s", d(m));
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec7() -> CapacityInput {
        let mut i = CapacityInput::new("40", "5.5", "3.2", "6500", 60, 2).unwrap();
        i.quota_rpm = Some("10000".parse().unwrap());
        i.quota_tpm = Some("40000000".parse().unwrap());
        i
    }

    #[test]
    fn spec7_capacity_example_holds_exactly() {
        let r = capacity(&spec7()).unwrap();
        assert_eq!(r.turns_in_flight, Rational::int(220));
        assert_eq!(r.replicas_needed, 4);
        assert_eq!(r.replica_capacity, 240);
        assert_eq!(r.replicas_deploy, 6);
        assert_eq!(r.requests_per_s, Rational::int(128));
        assert_eq!(r.requests_per_min, Rational::int(7_680));
        assert_eq!(r.tokens_per_min, Rational::int(49_920_000));
        let req = r.requests_quota.as_ref().unwrap();
        let tok = r.tokens_quota.as_ref().unwrap();
        assert_eq!(req.utilization_pct, "76.8".parse().unwrap());
        assert_eq!(tok.utilization_pct, "124.8".parse().unwrap());
        assert_eq!((req.utilization_pct.round(), req.over_quota), (77, false));
        assert_eq!((tok.utilization_pct.round(), tok.over_quota), (125, true));
        assert_eq!(r.binding.as_deref(), Some("tokens"));
        // 40 turns/s × 100 / 124.8 = 32.051… turns/s.
        assert_eq!(r.max_arrival_rate.unwrap().display(2), "32.05");
    }

    #[test]
    fn spec7_json_form() {
        let j = capacity(&spec7()).unwrap().to_json();
        assert_eq!(j["turns_in_flight"], 220);
        assert_eq!(j["replicas"]["needed"], 4);
        assert_eq!(j["replicas"]["capacity"], 240);
        assert_eq!(j["replicas"]["deploy"], 6);
        assert_eq!(j["requests"]["per_s"], 128);
        assert_eq!(j["requests"]["per_min"], 7_680);
        assert_eq!(j["tokens"]["per_min"], 49_920_000);
        assert_eq!(j["requests"]["quota"]["utilization_pct"], 76.8);
        assert_eq!(j["requests"]["quota"]["over_quota"], false);
        assert_eq!(j["tokens"]["quota"]["utilization_pct"], 124.8);
        assert_eq!(j["tokens"]["quota"]["over_quota"], true);
        assert_eq!(j["binding"], "tokens");
        assert_eq!(j["input"]["mean_turn_s"], 5.5);
        assert_eq!(j["input"]["per_replica"], 60);
        assert!(j["requests"]["p95_per_min"].is_null());
    }

    #[test]
    fn spec7_table_reads_as_the_spec() {
        let t = capacity(&spec7()).unwrap().to_table();
        for want in [
            "turns in flight     220",
            "replicas needed     4",
            "room for 240",
            "replicas to deploy  6   (N+2)",
            "128/s = 7,680/min",
            "49,920,000/min",
            "77 %",
            "125 %",
            "over quota",
            "tokens bind: demand is 125 % of the quota; the quota sustains at most 32.05 turns/s",
        ] {
            assert!(t.contains(want), "{want:?} not in\n{t}");
        }
    }

    #[test]
    fn p95_adds_a_pessimistic_bound() {
        let mut i = spec7();
        i.p95_calls = Some("8".parse().unwrap());
        let r = capacity(&i).unwrap();
        assert_eq!(r.requests_per_min_p95, Some(Rational::int(19_200)));
        assert_eq!(r.tokens_per_min_p95, Some(Rational::int(124_800_000)));
        assert_eq!(
            r.requests_quota.as_ref().unwrap().p95_utilization_pct,
            Some(Rational::int(192))
        );
        assert!(r.to_table().contains("use at p95"));
    }

    #[test]
    fn fractional_load_rounds_replicas_up_and_requests_can_bind() {
        let mut i = CapacityInput::new("0.5", "3", "10", "100", 1, 0).unwrap();
        i.quota_rpm = Some("200".parse().unwrap());
        i.quota_tpm = Some("1000000".parse().unwrap());
        let r = capacity(&i).unwrap();
        assert_eq!(r.turns_in_flight.to_string(), "1.5");
        assert_eq!((r.replicas_needed, r.replicas_deploy), (2, 2));
        assert_eq!(r.requests_per_min, Rational::int(300));
        assert_eq!(r.binding.as_deref(), Some("requests"));
        assert_eq!(r.to_json()["turns_in_flight"], 1.5);
        let none = capacity(&CapacityInput::new("1", "1", "1", "1", 10, 0).unwrap()).unwrap();
        assert_eq!(none.binding, None);
        assert_eq!(none.replicas_needed, 1);
        assert!(!none.to_table().contains("quota"));
    }

    #[test]
    fn bad_arguments_name_their_flag() {
        let e = CapacityInput::new("x", "1", "1", "1", 1, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--arrival-rate: \"x\" is not a non-negative decimal number like 40 or 5.5"
        );
        assert_eq!(e.exit_code(), 64);
        let mut i = spec7();
        i.per_replica = 0;
        assert_eq!(
            capacity(&i).unwrap_err().to_string(),
            "--per-replica: must be at least 1"
        );
        let mut i = spec7();
        i.quota_tpm = Some(Rational::ZERO);
        assert_eq!(
            capacity(&i).unwrap_err().to_string(),
            "--quota-tpm: must be more than 0"
        );
        let i = CapacityInput::new("0", "1", "1", "1", 1, 0).unwrap();
        assert!(capacity(&i).is_err());
    }
}
