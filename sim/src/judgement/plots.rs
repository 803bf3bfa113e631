//! The SVG timeline `run --svg` writes: calls, server load and breaker states
//! over simulated time, one panel each.

use std::collections::BTreeMap;

use plotters::prelude::*;
use redstring::CircuitState;

use crate::scenario::Scenario;
use crate::evidence::trace::{Kind, TraceEvent};

/// Renders the timeline as an SVG document. Drawing errors (none are expected
/// for an in-memory SVG) yield a document containing the error text.
pub fn render(scenario: &Scenario, events: &[TraceEvent]) -> String {
    let mut svg = String::new();
    if let Err(e) = draw(scenario, events, &mut svg) {
        return format!("<svg xmlns=\"http://www.w3.org/2000/svg\"><text y=\"20\">timeline failed: {e}</text></svg>");
    }
    svg
}

type Series = Vec<(f64, f64)>;

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

fn draw(scenario: &Scenario, events: &[TraceEvent], svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let seconds = scenario.duration_s.ceil() as usize;
    let end = seconds as f64;
    let ok = per_second(
        events,
        seconds,
        |e| matches!(&e.kind, Kind::CallEnd { outcome, .. } if outcome == "ok"),
    );
    let failed = per_second(
        events,
        seconds,
        |e| matches!(&e.kind, Kind::CallEnd { outcome, .. } if outcome != "ok"),
    );
    let limited = per_second(events, seconds, |e| matches!(e.kind, Kind::Limited { .. }));
    let mut servers: Vec<(String, Series, Series)> = Vec::new();
    for s in &scenario.servers {
        let received = per_second(events, seconds, |e| {
            e.host == s.name && matches!(e.kind, Kind::Served { .. })
        });
        let impaired = per_second(events, seconds, |e| {
            e.host == s.name && matches!(e.kind, Kind::Served { impaired: true, .. })
        });
        servers.push((s.name.clone(), received, impaired));
    }
    // Breakers open and half-open at each second.
    let shared = scenario.cache.kind == crate::scenario::CacheKind::Shared;
    let mut state: BTreeMap<String, CircuitState> = BTreeMap::new();
    let (mut open, mut half) = (vec![0.0; seconds + 1], vec![0.0; seconds + 1]);
    let mut i = 0;
    for s in 0..=seconds {
        while i < events.len() && events[i].t_us <= (s as u64) * 1_000_000 {
            if let Kind::Breaker { breaker, to, .. } = &events[i].kind {
                let scope = if shared {
                    breaker.clone()
                } else {
                    format!("{}/{breaker}", events[i].host)
                };
                state.insert(scope, *to);
            }
            i += 1;
        }
        open[s] = state.values().filter(|st| **st == CircuitState::Open).count() as f64;
        half[s] = state.values().filter(|st| **st == CircuitState::HalfOpen).count() as f64;
    }

    let root = SVGBackend::with_string(svg, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((3, 1));
    let max_of = |series: &[&Series]| {
        series
            .iter()
            .flat_map(|s| s.iter().map(|p| p.1))
            .fold(1.0_f64, f64::max)
            * 1.1
    };

    let mut chart = ChartBuilder::on(&panels[0])
        .caption(format!("{} — calls per second", scenario.name), ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..max_of(&[&ok, &failed, &limited]))?;
    chart.configure_mesh().x_desc("simulated seconds").draw()?;
    for (series, color, label) in [
        (&ok, GREEN, "succeeded"),
        (&failed, RED, "failed"),
        (&limited, BLUE, "rate-limited"),
    ] {
        chart
            .draw_series(LineSeries::new(series.iter().copied(), color))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;

    let all: Vec<&Series> = servers.iter().map(|(_, r, _)| r).collect();
    let mut chart = ChartBuilder::on(&panels[1])
        .caption(
            "requests reaching each server per second (dashed: while impaired)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..max_of(&all))?;
    chart.configure_mesh().x_desc("simulated seconds").draw()?;
    for (n, (name, received, impaired)) in servers.iter().enumerate() {
        let color = Palette99::pick(n).to_rgba();
        chart
            .draw_series(LineSeries::new(received.iter().copied(), color))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(DashedLineSeries::new(impaired.iter().copied(), 4, 3, color.into()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;

    let open: Series = open.into_iter().enumerate().map(|(s, v)| (s as f64, v)).collect();
    let half: Series = half.into_iter().enumerate().map(|(s, v)| (s as f64, v)).collect();
    let mut chart = ChartBuilder::on(&panels[2])
        .caption("breakers open / half-open", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..max_of(&[&open, &half]))?;
    chart.configure_mesh().x_desc("simulated seconds").draw()?;
    for (series, color, label) in [(&open, RED, "open"), (&half, MAGENTA, "half-open")] {
        chart
            .draw_series(LineSeries::new(series.iter().copied(), color))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
