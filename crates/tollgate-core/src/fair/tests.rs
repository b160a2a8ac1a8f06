use super::*;
use crate::bucket::{self, BucketSpec, BucketState, Take};

/// A pool of 600 requests/min with a burst of 60, `max_wait_ms` 4,000:
/// the and SPEC §5's.
fn pool() -> BucketSpec {
    BucketSpec::new(600, 60_000, 60).expect("spec")
}

const MAX_WAIT: u64 = 4_000;

/// One provider key: its pool bucket and its fair-share state, with the
/// permits it granted (start times) per tenant.
struct Key {
    spec: BucketSpec,
    bucket: Option<BucketState>,
    fair: FairState,
    weights: Vec<(&'static str, u32)>,
    starts: Vec<(u64, &'static str)>,
    granted_at: Vec<(u64, &'static str)>,
    waits: BTreeMap<&'static str, Vec<u64>>,
    refused: BTreeMap<&'static str, u64>,
}

impl Key {
    fn new(weights: &[(&'static str, u32)]) -> Self {
        Self {
            spec: pool(),
            bucket: None,
            fair: FairState::default(),
            weights: weights.to_vec(),
            starts: Vec::new(),
            granted_at: Vec::new(),
            waits: BTreeMap::new(),
            refused: BTreeMap::new(),
        }
    }

    fn take(&self, tenant: &'static str) -> FairTake<'_> {
        FairTake {
            tenant,
            weights: &self.weights,
            amount: self.spec.amount(),
            period_ms: self.spec.period_ms(),
            capacity: self.spec.capacity(),
            window_ms: MAX_WAIT,
        }
    }

    /// A permit as the store composes it: the gate, then the pool.
    fn permit(&mut self, tenant: &'static str, now: u64) -> (Gate, Option<u64>) {
        let d = decide(&self.fair, &self.take(tenant), now);
        let max_wait = match d.gate {
            Gate::Open => MAX_WAIT,
            Gate::ImmediateOnly => 0,
            Gate::Closed { .. } => {
                self.fair = d.refused;
                *self.refused.entry(tenant).or_default() += 1;
                return (d.gate, None);
            }
        };
        let t = bucket::take(&self.spec, self.bucket, now, 1, max_wait);
        match t.outcome {
            Take::Granted { wait_ms } => {
                self.bucket = Some(t.state);
                self.fair = d.granted;
                self.starts.push((now + wait_ms, tenant));
                self.granted_at.push((now, tenant));
                self.waits.entry(tenant).or_default().push(wait_ms);
                (d.gate, Some(wait_ms))
            }
            _ => {
                self.fair = d.refused;
                *self.refused.entry(tenant).or_default() += 1;
                (d.gate, None)
            }
        }
    }

    /// Offers each tenant's calls every `every_ms` from its start to
    /// `end_ms`, in time order.
    fn offer(&mut self, offers: &[(&'static str, u64, u64)], end_ms: u64) {
        let mut calls: Vec<(u64, &'static str)> = Vec::new();
        for &(tenant, every_ms, from) in offers {
            let mut n = 0;
            loop {
                let at = from + n * every_ms;
                if at >= end_ms {
                    break;
                }
                calls.push((at, tenant));
                n += 1;
            }
        }
        calls.sort();
        for (at, tenant) in calls {
            self.permit(tenant, at);
        }
    }

    /// Permits granted to `tenant` whose calls start in `[from, to)`.
    fn served(&self, tenant: &str, from: u64, to: u64) -> usize {
        self.starts
            .iter()
            .filter(|&&(s, t)| t == tenant && s >= from && s < to)
            .count()
    }

    /// The most call starts in any window of `ms`.
    fn densest(&self, ms: u64) -> usize {
        let mut s: Vec<u64> = self.starts.iter().map(|&(s, _)| s).collect();
        s.sort_unstable();
        let mut best = 0;
        let mut j = 0;
        for i in 0..s.len() {
            while s[i] - s[j] >= ms {
                j += 1;
            }
            best = best.max(i - j + 1);
        }
        best
    }

    fn p99(&self, tenant: &str) -> u64 {
        let mut w = self.waits.get(tenant).cloned().unwrap_or_default();
        w.sort_unstable();
        w.get((w.len() * 99).div_ceil(100).saturating_sub(1))
            .copied()
            .unwrap_or(0)
    }
}

fn entry(finish: u64, seen_ms: u64) -> FairEntry {
    FairEntry {
        finish,
        seen_ms,
        queued: false,
    }
}

#[test]
fn a_tenant_alone_uses_the_pool_as_without_tenants() {
    let mut k = Key::new(&[("a", 3)]);
    k.offer(&[("a", 10, 0)], 60_000);
    // Every permit the pool can give: its burst and 60 s of refill.
    assert_eq!(k.served("a", 0, 60_000), 659);
    assert_eq!(k.p99("a"), MAX_WAIT);
    assert!(k.densest(1_000) <= 70);
}

#[test]
fn backlogged_tenants_share_by_weight() {
    for (wa, wb) in [(3, 1), (3, 2), (1, 1)] {
        let mut k = Key::new(&[("a", wa), ("b", wb)]);
        k.offer(&[("a", 10, 0), ("b", 10, 5)], 60_000);
        let (a, b) = (k.served("a", 0, 60_000), k.served("b", 0, 60_000));
        let share = a as f64 / (a + b) as f64;
        let want = f64::from(wa) / f64::from(wa + wb);
        assert!((share - want).abs() <= 0.01, "{wa}:{wb}: {a} / {b}");
        assert!(a + b >= 655, "the pool is used: {a} + {b}");
        assert!(k.densest(1_000) <= 70);
    }
}

#[test]
fn a_light_tenant_is_never_refused_and_hardly_waits() {
    let mut k = Key::new(&[("heavy", 1), ("light", 1)]);
    // Light asks for half its share (2.5/s of its 5/s); heavy offers 10×
    // the pool.
    k.offer(&[("heavy", 10, 0), ("light", 400, 3)], 60_000);
    assert_eq!(k.refused.get("light"), None);
    assert!(k.p99("light") <= 200, "p99 {}", k.p99("light"));
    // Work-conserving: heavy gets what light leaves.
    let used = k.served("heavy", 0, 60_000) + k.served("light", 0, 60_000);
    assert!(used >= 655, "{used}");
    assert!(k.densest(1_000) <= 70);
}

#[test]
fn a_tenant_back_from_idle_gets_its_share_within_max_wait() {
    let mut k = Key::new(&[("a", 1), ("b", 1)]);
    k.offer(&[("a", 10, 0), ("b", 10, 30_000)], 60_000);
    // a booked the pool up to max_wait ahead while alone: b's first permit
    // is granted within max_wait of its return (and starts behind what a
    // booked), and from then on they share.
    let first = k
        .granted_at
        .iter()
        .find(|&&(_, t)| t == "b")
        .map(|&(at, _)| at)
        .expect("b served");
    assert!(first <= 30_000 + MAX_WAIT, "{first}");
    let (a, b) = (k.served("a", 36_000, 60_000), k.served("b", 36_000, 60_000));
    assert!(a.abs_diff(b) <= 2, "{a} / {b}");
    assert!(k.densest(1_000) <= 70);
}

#[test]
fn idle_tenants_are_forgotten_and_unconfigured_ones_bounded() {
    let mut k = Key::new(&[("a", 1)]);
    let names: Vec<&'static str> = (0..100)
        .map(|i| &*Box::leak(format!("t{i}").into_boxed_str()))
        .collect();
    for (i, name) in names.iter().enumerate() {
        k.permit(name, i as u64);
    }
    assert!(k.fair.tenants.len() <= MAX_TENANTS + 1);
    assert!(k.fair.tenants.contains_key(OTHERS));
    // A configured tenant always has an entry of its own.
    k.permit("a", 100);
    assert!(k.fair.tenants.contains_key("a"));
    // Past max_wait with nobody ahead, everything idle is forgotten.
    k.permit("a", 100 + MAX_WAIT + 60_000);
    assert_eq!(k.fair.tenants.len(), 1, "{:?}", k.fair.tenants.keys());
    assert_eq!(k.fair.v, 0, "set back to 0 with nobody ahead");
}

#[test]
fn long_or_control_names_are_held_under_others() {
    let long: &'static str = Box::leak("x".repeat(MAX_NAME_BYTES + 1).into_boxed_str());
    let fits: &'static str = Box::leak("x".repeat(MAX_NAME_BYTES).into_boxed_str());
    let mut k = Key::new(&[]);
    for name in [long, "nul\0name", "tab\tname", "del\u{7f}"] {
        assert_eq!(held_name(name), OTHERS, "{name:?}");
        k.permit(name, 0);
    }
    k.permit(fits, 0);
    k.permit("caf\u{e9}", 0);
    let held: Vec<&str> = k.fair.tenants.keys().map(String::as_str).collect();
    assert_eq!(held, ["caf\u{e9}", fits, OTHERS]);
}

#[test]
fn a_closed_gate_takes_nothing_and_hints_when_the_share_allows() {
    let mut k = Key::new(&[("a", 1), ("b", 1)]);
    // Both ahead of the clock; a by 50 permits, past its lead (1 permit)
    // and its half of the burst (30).
    k.fair = FairState {
        v: 0,
        at_ms: 0,
        tenants: BTreeMap::from([
            ("a".to_owned(), entry(5_000_000, 0)),
            ("b".to_owned(), entry(100_000, 0)),
        ]),
    };
    let (gate, got) = k.permit("a", 0);
    assert_eq!(got, None);
    // The clock moves 500/ms while both are ahead: a's excess of 49
    // permits (4,900,000) passes in 9,800 ms.
    assert_eq!(
        gate,
        Gate::Closed {
            retry_after_ms: 9_800
        }
    );
    assert_eq!(k.bucket, None, "nothing taken");
    assert_eq!(
        k.fair.tenants["a"],
        entry(5_000_000, 0),
        "seen, nothing booked"
    );
    // b, one permit ahead, may book.
    assert_eq!(k.permit("b", 0), (Gate::Open, Some(0)));
}

/// SPEC §5's worked example of fair sharing, to the millisecond.
#[test]
fn spec_worked_example() {
    let mut k = Key::new(&[("a", 3), ("b", 1)]);
    k.spec = BucketSpec::new(600, 60_000, 2).expect("spec");
    // (t, tenant, clock after advancing, gate, granted wait or the pool's
    // refusal hint (Err), tenant's tag after)
    type Row = (u64, &'static str, u64, Gate, Result<u64, u64>, u64);
    let rows: [Row; 13] = [
        (0, "a", 0, Gate::Open, Ok(0), 33_333),
        (0, "b", 0, Gate::Open, Ok(0), 100_000),
        (0, "a", 0, Gate::Open, Ok(100), 66_666),
        (0, "a", 0, Gate::ImmediateOnly, Err(200), 66_666),
        (0, "b", 0, Gate::Open, Ok(200), 200_000),
        (50, "a", 12_500, Gate::ImmediateOnly, Err(250), 66_666),
        (100, "a", 25_000, Gate::ImmediateOnly, Err(200), 66_666),
        (
            100,
            "b",
            25_000,
            Gate::Closed {
                retry_after_ms: 300,
            },
            Err(300),
            200_000,
        ),
        (150, "a", 37_500, Gate::Open, Ok(150), 99_999),
        (200, "b", 50_000, Gate::ImmediateOnly, Err(200), 200_000),
        (250, "a", 62_500, Gate::ImmediateOnly, Err(150), 99_999),
        (300, "a", 75_000, Gate::Open, Ok(100), 133_332),
        (300, "b", 75_000, Gate::ImmediateOnly, Err(200), 200_000),
    ];
    for (at, tenant, v, gate, answer, tag) in rows {
        let d = decide(&k.fair, &k.take(tenant), at);
        assert_eq!((d.granted.v, d.gate), (v, gate), "t={at} {tenant}");
        let hint = match bucket::take(&k.spec, k.bucket, at, 1, 0).outcome {
            Take::Refused { retry_after_ms } => retry_after_ms,
            _ => 0,
        };
        let got = match k.permit(tenant, at).1 {
            Some(wait) => Ok(wait),
            None => Err(match gate {
                Gate::Closed { retry_after_ms } => retry_after_ms,
                _ => hint,
            }),
        };
        assert_eq!(got, answer, "t={at} {tenant}");
        assert_eq!(k.fair.tenants[tenant].finish, tag, "t={at} {tenant}");
    }
    // a's calls start at 0, 100, 300 and 400; b's at 0 and 200.
    let mut starts = k.starts.clone();
    starts.sort();
    assert_eq!(
        starts,
        [
            (0, "a"),
            (0, "b"),
            (100, "a"),
            (200, "b"),
            (300, "a"),
            (400, "a")
        ]
    );
}

/// The operator's view: after a (weight 3) books two permits and b
/// (weight 1) one at t = 0, both are ahead; with both ahead the clock
/// moves 250 per ms: a's tag 66,666 is passed in 267 ms, b's 100,000 in
/// 400 ms. 100 ms later (the clock at 25,000) they are 167 and 300 ms
/// ahead.
#[test]
fn the_view_says_how_far_ahead_each_tenant_has_booked() {
    let mut k = Key::new(&[("a", 3)]);
    k.permit("a", 0);
    k.permit("b", 0);
    k.permit("a", 0);
    let take = k.take("a");
    let at = |ms| view(&k.fair, &take, ms);
    let row = |name: &str, weight, ahead_ms| TenantView {
        name: name.to_owned(),
        weight,
        active: true,
        ahead_ms,
        queued: false,
    };
    assert_eq!(at(0), [row("a", 3, 267), row("b", 1, 400)]);
    assert_eq!(at(100), [row("a", 3, 167), row("b", 1, 300)]);
    assert_eq!(k.fair.v, 0, "a view saves nothing");
}
