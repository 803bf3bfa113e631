//! The SVG timeline `run --svg` writes: calls, server load and breaker states
//! over simulated time, one panel each, all drawn by one helper; and the
//! distributions `compare --svg` sets side by side ([`distributions`]). (A
//! tune's front is drawn with the tune, `crate::search::tune::pareto`.)
//!
//! Every panel shades each fault episode (from the fault until the server is
//! ready again, [`crate::evidence::episodes`]) and marks the ready instant
//! with a dashed vertical line; the y axis says its unit; the legend sits in
//! headroom above the data; a spike above ten times the 95th percentile of a
//! panel's values is clipped at the top (the axis says so) so that it does
//! not flatten the rest.

use plotters::coord::Shift;
use plotters::prelude::*;
use redstring::CircuitState;

use crate::evidence::episodes::{Episode, episodes};
use crate::evidence::outcome::CallOutcome;
use crate::evidence::timeline::{Breakers, Scopes};
use crate::evidence::trace::{Kind, TraceEvent};
use crate::scenario::Scenario;

/// Renders the timeline as an SVG document. Drawing errors (none are expected
/// for an in-memory SVG) yield a document containing the error text.
pub fn render(scenario: &Scenario, events: &[TraceEvent]) -> String {
    let mut svg = String::new();
    if let Err(e) = draw(scenario, events, &mut svg) {
        return format!("<svg xmlns=\"http://www.w3.org/2000/svg\"><text y=\"20\">timeline failed: {e}</text></svg>");
    }
    svg
}

/// Points (second, value).
type Series = Vec<(f64, f64)>;

/// One line of a panel.
struct Line {
    points: Series,
    color: RGBAColor,
    /// Shown in the legend; `None` for a line that shares its colour's entry.
    label: Option<String>,
    dashed: bool,
}

impl Line {
    fn solid(points: Series, color: impl Color, label: impl Into<String>) -> Line {
        Line {
            points,
            color: color.to_rgba(),
            label: Some(label.into()),
            dashed: false,
        }
    }
}

fn per_second(events: &[TraceEvent], seconds: usize, pick: impl Fn(&TraceEvent) -> bool) -> Series {
    let mut counts = vec![0u32; seconds + 1];
    for e in events.iter().filter(|e| pick(e)) {
        let s = (e.t_us / 1_000_000) as usize;
        if let Some(c) = counts.get_mut(s) {
            *c += 1;
        }
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(s, c)| (s as f64, f64::from(c)))
        .collect()
}

/// Breakers open and half-open at each second, from the one breaker fold.
fn breaker_states(scenario: &Scenario, events: &[TraceEvent], seconds: usize) -> (Series, Series) {
    let mut breakers = Breakers::new(Scopes::of(scenario));
    let (mut open, mut half) = (Series::new(), Series::new());
    let mut i = 0;
    for s in 0..=seconds {
        while i < events.len() && events[i].t_us <= (s as u64) * 1_000_000 {
            breakers.observe(&events[i]);
            i += 1;
        }
        open.push((s as f64, breakers.count(CircuitState::Open) as f64));
        half.push((s as f64, breakers.count(CircuitState::HalfOpen) as f64));
    }
    (open, half)
}

/// The top of a panel's data range: the largest value, or — when that is a
/// spike above ten times the 95th percentile — the clip level, with whether
/// it clipped.
fn data_top(lines: &[Line]) -> (f64, bool) {
    let mut values: Vec<f64> = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).collect();
    values.sort_by(f64::total_cmp);
    let max = values.last().copied().unwrap_or(0.0).max(1.0);
    let p95 = values
        .get((values.len() * 95).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    let clip = (p95 * 10.0).max(1.0);
    if max > clip { (clip, true) } else { (max, false) }
}

/// Draws one panel: `lines` over `[0, end]` seconds, with a legend above
/// the data, the fault episodes shaded and the ready instants marked.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    unit: &str,
    end: f64,
    lines: &[Line],
    episodes: &[Episode],
) -> Result<(), Box<dyn std::error::Error>> {
    let (data, clipped) = data_top(lines);
    // Headroom for the legend, so it never covers the data.
    let top = data * 1.5;
    let unit = if clipped {
        format!("{unit} (clipped at {data:.0})")
    } else {
        unit.to_owned()
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("simulated seconds")
        .y_desc(unit.as_str())
        .draw()?;
    let end_us = (end * 1e6) as u64;
    for ep in episodes {
        let from = ep.start_us as f64 / 1e6;
        let to = ep.outage_end_us(end_us) as f64 / 1e6;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(from, 0.0), (to.min(end), top)],
            BLACK.mix(0.08).filled(),
        )))?;
        if let Some(ready) = ep.ready_us {
            let x = ready as f64 / 1e6;
            chart.draw_series(DashedLineSeries::new([(x, 0.0), (x, top)], 3, 3, BLACK.mix(0.6).into()))?;
        }
    }
    for line in lines {
        let color = line.color;
        let points = line.points.iter().map(|&(x, y)| (x, y.min(data)));
        let drawn = if line.dashed {
            chart.draw_series(DashedLineSeries::new(points, 4, 3, color.into()))?
        } else {
            chart.draw_series(LineSeries::new(points, color))?
        };
        if let Some(label) = &line.label {
            drawn
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// The calls panel's lines: calls ending per second, each call once, by how
/// it ended — a deferred call (by any of the caller's own limits) is deferred, not also failed, and a call
/// the limiter refused several times counts once.
fn call_lines(events: &[TraceEvent], seconds: usize) -> [Line; 3] {
    let ended = |pick: fn(&CallOutcome) -> bool| move |e: &TraceEvent| matches!(&e.kind, Kind::CallEnd(end) if pick(&end.outcome));
    [
        Line::solid(per_second(events, seconds, ended(|o| o.is_ok())), GREEN, "succeeded"),
        Line::solid(
            per_second(events, seconds, ended(|o| !o.is_ok() && !o.is_deferred())),
            RED,
            "failed",
        ),
        Line::solid(
            per_second(events, seconds, ended(|o| o.is_deferred())),
            BLUE,
            "deferred by a limit",
        ),
    ]
}

fn draw(scenario: &Scenario, events: &[TraceEvent], svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let seconds = scenario.duration_s.ceil() as usize;
    let end = seconds as f64;
    let calls = call_lines(events, seconds);
    let episodes = episodes(scenario, events);
    let mut servers = Vec::new();
    for (n, s) in scenario.servers.iter().enumerate() {
        let color = Palette99::pick(n).to_rgba();
        let received = per_second(events, seconds, |e| {
            *e.host == *s.name && matches!(e.kind, Kind::Served { .. })
        });
        let impaired = per_second(events, seconds, |e| {
            *e.host == *s.name && matches!(e.kind, Kind::Served { impaired: true, .. })
        });
        servers.push(Line::solid(received, color, s.name.as_str()));
        servers.push(Line {
            points: impaired,
            color,
            label: None,
            dashed: true,
        });
    }
    let (open, half) = breaker_states(scenario, events, seconds);
    let breakers = [Line::solid(open, RED, "open"), Line::solid(half, MAGENTA, "half-open")];

    let root = SVGBackend::with_string(svg, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((3, 1));
    panel(
        &panels[0],
        &format!(
            "{} — calls ending per second (shaded: fault until ready)",
            scenario.name
        ),
        "calls / s",
        end,
        &calls,
        &episodes,
    )?;
    panel(
        &panels[1],
        "requests reaching each server per second (dashed: while impaired)",
        "requests / s",
        end,
        &servers,
        &episodes,
    )?;
    panel(
        &panels[2],
        "breakers open / half-open",
        "breakers",
        end,
        &breakers,
        &episodes,
    )?;
    root.present()?;
    Ok(())
}

/// The unit a summary figure is measured in, for an axis.
fn figure_unit(name: &str) -> &'static str {
    match name {
        "failed_fraction" => "fraction of calls",
        "impaired_requests" | "throttled_requests" => "requests",
        "calls_deferred" => "calls",
        "retry_amplification" => "requests per admitted call",
        "latency_p50_s" | "latency_p95_s" | "latency_p99_s" | "goodput_recovery_s" => "seconds",
        _ => "",
    }
}

/// A comparison's distributions as an SVG document: one panel per figure,
/// one column per variant: a bar from min to max, a tick at the p95, a dot
/// at the median; a figure a variant never measured has no column.
pub fn distributions(comparison: &crate::judgement::compare::Comparison) -> String {
    let mut svg = String::new();
    if let Err(e) = draw_distributions(comparison, &mut svg) {
        return format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\"><text y=\"20\">distributions failed: {e}</text></svg>"
        );
    }
    svg
}

fn draw_distributions(
    comparison: &crate::judgement::compare::Comparison,
    svg: &mut String,
) -> Result<(), Box<dyn std::error::Error>> {
    use crate::judgement::sweep::FIGURE_NAMES;

    let n = comparison.variants.len();
    let rows = FIGURE_NAMES.len().div_ceil(2);
    let root = SVGBackend::with_string(svg, (1200, 260 * rows as u32 + 60)).into_drawing_area();
    root.fill(&WHITE)?;
    let [from, to] = comparison.seeds;
    let (title, body) = root.split_vertically(60);
    let names: Vec<String> = comparison
        .variants
        .iter()
        .enumerate()
        .map(|(i, (name, _))| format!("[{}] {name}", i + 1))
        .collect();
    title.draw(&Text::new(
        format!(
            "seeds {from}..{to}: min–max bar, p95 tick, median dot per variant — {}",
            names.join("   ")
        ),
        (10, 10),
        ("sans-serif", 15),
    ))?;
    let panels = body.split_evenly((rows, 2));
    for (figure, area) in FIGURE_NAMES.iter().zip(panels.iter()) {
        let dists: Vec<(usize, &crate::judgement::sweep::Distribution)> = comparison
            .variants
            .iter()
            .enumerate()
            .filter_map(|(i, (_, s))| s.figures.get(*figure).map(|d| (i + 1, d)))
            .collect();
        let top = dists.iter().map(|(_, d)| d.max).fold(0.0, f64::max);
        let top = if top > 0.0 { top * 1.15 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(*figure, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.5..(n as f64 + 0.5), 0.0..top)?;
        chart
            .configure_mesh()
            .x_labels(n + 2)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-9 && i >= 1.0 {
                    format!("[{i:.0}]")
                } else {
                    String::new()
                }
            })
            .disable_x_mesh()
            .x_desc("variant")
            .y_desc(figure_unit(figure))
            .draw()?;
        for &(i, d) in &dists {
            let x = i as f64;
            let color = Palette99::pick(i - 1).to_rgba();
            chart.draw_series([Rectangle::new(
                [(x - 0.12, d.min), (x + 0.12, d.max)],
                color.mix(0.3).filled(),
            )])?;
            chart.draw_series([PathElement::new(
                vec![(x - 0.2, d.p95), (x + 0.2, d.p95)],
                color.stroke_width(2),
            )])?;
            chart.draw_series([Circle::new((x, d.median), 5, color.filled())])?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::outcome::Limit;
    use crate::evidence::trace::CallEnded;

    fn line(values: &[f64]) -> Line {
        Line::solid(
            values.iter().enumerate().map(|(i, v)| (i as f64, *v)).collect(),
            RED,
            "x",
        )
    }

    #[test]
    fn a_deferred_call_is_drawn_once_as_rate_limited() {
        let tenant = crate::scenario::tenant(1);
        let at = |kind| TraceEvent {
            t_us: 500_000,
            host: "w".into(),
            call: None,
            kind,
        };
        let end = |outcome| {
            at(Kind::CallEnd(Box::new(CallEnded {
                call: 1,
                tenant,
                outcome,
                attempts: 0,
                latency_ms: 1,
                retry_after_us: None,
                answer_us: None,
            })))
        };
        let refused = || {
            at(Kind::Limited {
                tenant,
                retry_after_us: 1,
                at_us: 1,
                decided_by: Default::default(),
            })
        };
        // One call refused twice and then deferred; one call that failed.
        let events = [
            refused(),
            refused(),
            end(CallOutcome::Deferred(Limit::Tokens)),
            end(CallOutcome::Failed("timeout")),
        ];
        let [ok, failed, limited] = call_lines(&events, 1);
        let at0 = |l: &Line| l.points[0].1;
        assert_eq!((at0(&ok), at0(&failed), at0(&limited)), (0.0, 1.0, 1.0));
    }

    #[test]
    fn every_summary_figure_has_its_own_unit() {
        for name in crate::judgement::sweep::FIGURE_NAMES {
            assert!(!figure_unit(name).is_empty(), "{name}");
        }
        // Counts are not seconds.
        assert_eq!(figure_unit("calls_deferred"), "calls");
        assert_eq!(figure_unit("throttled_requests"), "requests");
    }

    #[test]
    fn a_comparison_draws_every_figure_with_its_unit_and_every_variant() {
        use crate::judgement::compare::{Comparison, Variant};
        use crate::judgement::sweep::SeedRecord;

        let record = |seed, v: f64| SeedRecord {
            seed,
            error: None,
            figures: [
                ("latency_p50_s".to_owned(), v),
                ("failed_fraction".to_owned(), v / 10.0),
            ]
            .into(),
            ..SeedRecord::default()
        };
        let variant = |name: &str, base: f64| Variant {
            name: name.into(),
            records: (1..4).map(|s| record(s, base + s as f64)).collect(),
        };
        let c = Comparison::new(1, 4, None, String::new(), &[variant("a", 0.0), variant("b", 5.0)]);
        let svg = distributions(&c);
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("[1] a") && svg.contains("[2] b"), "{svg}");
        for unit in ["seconds", "fraction of calls", "requests per admitted call"] {
            assert!(svg.contains(unit), "{unit}");
        }
        assert!(svg.contains("failed_fraction") && svg.contains("latency_p50_s"));
        // Two measured figures × two variants: four median dots.
        assert_eq!(svg.matches("<circle").count(), 4, "{svg}");
    }

    #[test]
    fn a_spike_far_above_the_rest_is_clipped_and_ordinary_data_is_not() {
        let mut spiky = vec![2.0; 100];
        spiky[50] = 500.0;
        assert_eq!(data_top(&[line(&spiky)]), (20.0, true));
        let ordinary: Vec<f64> = (0..100).map(f64::from).collect();
        assert_eq!(data_top(&[line(&ordinary)]), (99.0, false));
        assert_eq!(data_top(&[line(&[])]), (1.0, false));
    }
}
