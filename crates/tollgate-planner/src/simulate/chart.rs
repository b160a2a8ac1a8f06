//! The chart of a replay, drawn with `plotters` as SVG: decisions per
//! second by outcome, with tenants the provider permits each one started
//! per second, and the token bucket levels of the users hit hardest.
//!
//! Both panels use fixed time bins (at most [`MAX_BINS`]), so the chart's
//! memory does not grow with the trace.

use plotters::prelude::*;
use tollgate_core::bucket::BucketSpec;
use tollgate_core::{Outcome, Plan};

/// Most time bins per chart.
pub(super) const MAX_BINS: u64 = 600;
/// Users whose bucket levels are drawn.
pub(super) const CHART_USERS: usize = 5;
/// Tenants (of any provider keys) whose permits are drawn: the first seen.
pub(super) const CHART_TENANTS: usize = 8;
const SIZE: (u32, u32) = (1200, 800);
/// The chart's size with the tenants' panel.
const SIZE_TENANTS: (u32, u32) = (1200, 1200);

/// Colours of the tenants' lines.
const TENANT_COLOURS: [RGBColor; CHART_TENANTS] = [
    RGBColor(0x1F, 0x77, 0xB4),
    RGBColor(0xFF, 0x7F, 0x0E),
    RGBColor(0x2C, 0xA0, 0x2C),
    RGBColor(0xD6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xBD),
    RGBColor(0x8C, 0x56, 0x4B),
    RGBColor(0xE3, 0x77, 0xC2),
    RGBColor(0x17, 0xBE, 0xCF),
];

/// The outcomes in drawing order, with their labels and colours.
pub(super) const OUTCOMES: [(Outcome, &str, RGBColor); 4] = [
    (Outcome::Allowed, "allowed", RGBColor(0x2C, 0xA0, 0x2C)),
    (Outcome::Waited, "waited", RGBColor(0xFF, 0x7F, 0x0E)),
    (Outcome::Denied, "denied", RGBColor(0xD6, 0x27, 0x28)),
    (
        Outcome::ShadowDenied,
        "shadow-denied",
        RGBColor(0x94, 0x67, 0xBD),
    ),
];

/// Colours of the tracked users' lines.
pub(super) const USER_COLOURS: [RGBColor; CHART_USERS] = [
    RGBColor(0x1F, 0x77, 0xB4),
    RGBColor(0x8C, 0x56, 0x4B),
    RGBColor(0xE3, 0x77, 0xC2),
    RGBColor(0x7F, 0x7F, 0x7F),
    RGBColor(0x17, 0xBE, 0xCF),
];

struct Tracked {
    user: String,
    plan: String,
    turns: BucketSpec,
    tokens: BucketSpec,
    /// Lowest level per finished bin.
    levels: Vec<i64>,
    /// Lowest level seen in the current bin.
    low: Option<i64>,
}

/// An axis label: whole numbers grouped by commas, small ones with one
/// decimal.
fn format_number(v: f64) -> String {
    if v.abs() >= 10.0 || v == v.trunc() {
        let r = v.round();
        let digits = crate::rational::group(r.abs() as u128);
        if r < 0.0 {
            format!("-{digits}")
        } else {
            digits
        }
    } else {
        format!("{v:.1}")
    }
}

/// Collects the chart's series during a replay.
pub(crate) struct ChartRecorder {
    start: u64,
    /// The last event's time, from the start.
    span: u64,
    bin_ms: u64,
    n_bins: usize,
    decisions: Vec<[u64; 4]>,
    users: Vec<Tracked>,
    samples: usize,
    /// `provider:model tenant` and its permits started per bin.
    tenants: Vec<(String, Vec<u64>)>,
}

/// A bin width of 1, 2 or 5 × 10^k seconds, at least 1 s, giving at most
/// [`MAX_BINS`] bins over `span_ms`.
fn bin_width(span_ms: u64) -> u64 {
    let want = span_ms.div_ceil(MAX_BINS).max(1_000);
    let mut unit = 1_000u64;
    loop {
        for m in [1, 2, 5] {
            if unit * m >= want {
                return unit * m;
            }
        }
        unit = unit.saturating_mul(10);
    }
}

impl ChartRecorder {
    /// Bins over `[start_ms, end_ms]`, tracking `users` (with their plans).
    pub(super) fn new(start_ms: u64, end_ms: u64, users: Vec<(String, &Plan)>) -> Self {
        let span = end_ms.saturating_sub(start_ms);
        let bin_ms = bin_width(span);
        let n_bins = (span / bin_ms + 1) as usize;
        Self {
            start: start_ms,
            span,
            bin_ms,
            n_bins,
            decisions: vec![[0; 4]; n_bins],
            users: users
                .into_iter()
                .take(CHART_USERS)
                .map(|(user, plan)| Tracked {
                    user,
                    plan: plan.name.to_string(),
                    turns: plan.turns,
                    tokens: plan.tokens,
                    levels: Vec::with_capacity(n_bins),
                    low: None,
                })
                .collect(),
            samples: 0,
            tenants: Vec::new(),
        }
    }

    /// A permit of `tenant` on provider key `key` granted to start at `t`
    /// (counted for the first [`CHART_TENANTS`] tenants seen).
    pub(super) fn tenant_permit(&mut self, t: u64, key: &str, tenant: &str) {
        let bin = ((t.saturating_sub(self.start)) / self.bin_ms).min(self.n_bins as u64 - 1);
        let label = format!("{key} {tenant}");
        let i = match self.tenants.iter().position(|(l, _)| *l == label) {
            Some(i) => i,
            None if self.tenants.len() < CHART_TENANTS => {
                self.tenants.push((label, vec![0; self.n_bins]));
                self.tenants.len() - 1
            }
            None => return,
        };
        self.tenants[i].1[bin as usize] += 1;
    }

    /// When the next level sample is due (the end of the current bin).
    pub(super) fn next_sample(&self) -> Option<u64> {
        (self.samples < self.n_bins).then(|| self.start + (self.samples as u64 + 1) * self.bin_ms)
    }

    pub(super) fn decision(&mut self, t: u64, o: Outcome) {
        let bin = ((t.saturating_sub(self.start)) / self.bin_ms).min(self.n_bins as u64 - 1);
        let i = OUTCOMES.iter().position(|(x, ..)| *x == o).unwrap_or(0);
        self.decisions[bin as usize][i] += 1;
    }

    pub(super) fn tracked(&self, user: &str) -> Option<usize> {
        self.users.iter().position(|u| u.user == user)
    }

    pub(super) fn tracked_len(&self) -> usize {
        self.users.len()
    }

    pub(super) fn user(&self, i: usize) -> &str {
        &self.users[i].user
    }

    pub(super) fn specs(&self, i: usize) -> (BucketSpec, BucketSpec) {
        (self.users[i].turns, self.users[i].tokens)
    }

    pub(super) fn observe(&mut self, i: usize, level: i64) {
        let u = &mut self.users[i];
        u.low = Some(u.low.map_or(level, |l| l.min(level)));
    }

    /// The end of a bin: `levels[i]` is tracked user `i`'s level now.
    pub(super) fn sample(&mut self, levels: &[i64]) {
        for (u, &level) in self.users.iter_mut().zip(levels) {
            u.levels.push(u.low.map_or(level, |l| l.min(level)));
            u.low = Some(level);
        }
        self.samples += 1;
    }

    /// Draws the chart as SVG text.
    pub(super) fn render(&self, title: &str) -> Result<String, String> {
        let span_ms = self.n_bins as u64 * self.bin_ms;
        let (unit_ms, unit) = if span_ms <= 2 * 60_000 {
            (1_000.0, "s")
        } else if span_ms <= 2 * 3_600_000 {
            (60_000.0, "min")
        } else {
            (3_600_000.0, "h")
        };
        let x_max = span_ms as f64 / unit_ms;
        // The time the trace covers in each bin, in seconds (the last bin
        // is usually cut short by the end of the trace), at least 1 s.
        let covered_s = |b: usize| {
            let lo = b as u64 * self.bin_ms;
            let hi = ((b as u64 + 1) * self.bin_ms).min(self.span);
            hi.saturating_sub(lo).max(1_000) as f64 / 1_000.0
        };
        let rate_max = self
            .decisions
            .iter()
            .enumerate()
            .flat_map(|(b, counts)| counts.iter().map(move |&c| c as f64 / covered_s(b)))
            .fold(0.0f64, f64::max);
        let mut svg = String::new();
        {
            let size = if self.tenants.is_empty() {
                SIZE
            } else {
                SIZE_TENANTS
            };
            let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            let root = root
                .titled(title, ("sans-serif", 22))
                .map_err(|e| e.to_string())?;
            let panel_h = if self.tenants.is_empty() {
                size.1 as i32 / 2 - 20
            } else {
                size.1 as i32 / 3 - 14
            };
            let (top, rest) = root.split_vertically(panel_h);
            let (middle, bottom) = if self.tenants.is_empty() {
                (None, rest)
            } else {
                let (m, b) = rest.split_vertically(panel_h);
                (Some(m), b)
            };

            let x = (x_max, format!("time ({unit})"));
            let mid = |b: usize| (b as f64 + 0.5) * self.bin_ms as f64 / unit_ms;
            let outcomes = OUTCOMES
                .iter()
                .enumerate()
                .map(|(i, (_, name, colour))| Line {
                    label: (*name).to_owned(),
                    colour: *colour,
                    points: self
                        .decisions
                        .iter()
                        .enumerate()
                        .map(|(b, counts)| (mid(b), counts[i] as f64 / covered_s(b)))
                        .collect(),
                });
            panel(
                &top,
                &format!(
                    "Decisions per second by outcome ({} s bins)",
                    self.bin_ms / 1_000
                ),
                &x,
                (0.0, (rate_max * 1.1).max(1.0), "decisions/s"),
                SeriesLabelPosition::UpperRight,
                outcomes.collect(),
            )?;

            if let Some(middle) = middle {
                let lines: Vec<Line> = self
                    .tenants
                    .iter()
                    .zip(TENANT_COLOURS)
                    .map(|((label, bins), colour)| Line {
                        label: label.clone(),
                        colour,
                        points: bins
                            .iter()
                            .enumerate()
                            .map(|(b, &c)| (mid(b), c as f64 / covered_s(b)))
                            .collect(),
                    })
                    .collect();
                let top_rate = lines
                    .iter()
                    .flat_map(|l| l.points.iter().map(|p| p.1))
                    .fold(0.0f64, f64::max);
                panel(
                    &middle,
                    "Provider permits per second by tenant (by start)",
                    &x,
                    (0.0, (top_rate * 1.1).max(1.0), "permits/s"),
                    SeriesLabelPosition::UpperRight,
                    lines,
                )?;
            }

            let low = self
                .users
                .iter()
                .flat_map(|u| u.levels.iter().copied())
                .min()
                .unwrap_or(0)
                .min(0) as f64;
            let high = self
                .users
                .iter()
                .map(|u| u.tokens.capacity() as f64)
                .fold(1.0f64, f64::max);
            let pad = (high - low) * 0.05;
            let users = self.users.iter().zip(USER_COLOURS).map(|(u, colour)| Line {
                label: format!("{} ({})", u.user, u.plan),
                colour,
                points: u
                    .levels
                    .iter()
                    .enumerate()
                    .map(|(b, &level)| {
                        (
                            (b as f64 + 1.0) * self.bin_ms as f64 / unit_ms,
                            level as f64,
                        )
                    })
                    .collect(),
            });
            panel(
                &bottom,
                "Token bucket level of the users hit hardest (lowest in each bin)",
                &x,
                (low - pad, high + pad, "tokens available"),
                SeriesLabelPosition::LowerRight,
                users.collect(),
            )?;
            root.present().map_err(|e| e.to_string())?;
        }
        Ok(svg)
    }
}

/// One line of a panel.
struct Line {
    label: String,
    colour: RGBColor,
    points: Vec<(f64, f64)>,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Draws one panel: `caption`, time on x (`x`: its end and label), `y` (its
/// low, high and label), and `lines` with a legend at `legend` (none
/// without lines).
fn panel(
    area: &Area<'_>,
    caption: &str,
    x: &(f64, String),
    y: (f64, f64, &str),
    legend: SeriesLabelPosition,
    lines: Vec<Line>,
) -> Result<(), String> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x.0, y.0..y.1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x.1.as_str())
        .y_desc(y.2)
        .y_label_formatter(&|v| format_number(*v))
        .draw()
        .map_err(|e| e.to_string())?;
    let any = !lines.is_empty();
    for line in lines {
        let colour = line.colour;
        chart
            .draw_series(LineSeries::new(line.points, colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(line.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
            });
    }
    if any {
        chart
            .configure_series_labels()
            .position(legend)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_are_round_and_bounded() {
        assert_eq!(bin_width(0), 1_000);
        assert_eq!(bin_width(600_000), 1_000);
        assert_eq!(bin_width(600_001), 2_000);
        assert_eq!(bin_width(86_400_000), 200_000);
        for span in [0, 1, 59_999, 86_400_000, 365 * 86_400_000] {
            let bins = span / bin_width(span) + 1;
            assert!(bins <= MAX_BINS + 1, "{span}: {bins}");
        }
    }
}
