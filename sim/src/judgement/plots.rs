//! The SVG timeline `run --svg` writes: calls, server load and breaker states
//! over simulated time, one panel each, all drawn by one helper.

use plotters::coord::Shift;
use plotters::prelude::*;
use redstring::CircuitState;

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

/// Draws one panel: `lines` over `[0, end]` seconds, with a legend.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    end: f64,
    lines: &[Line],
) -> Result<(), Box<dyn std::error::Error>> {
    let top = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(1.0_f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..top)?;
    chart.configure_mesh().x_desc("simulated seconds").draw()?;
    for line in lines {
        let color = line.color;
        let points = line.points.iter().copied();
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
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn draw(scenario: &Scenario, events: &[TraceEvent], svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let seconds = scenario.duration_s.ceil() as usize;
    let end = seconds as f64;
    let ended =
        |ok: bool| move |e: &TraceEvent| matches!(&e.kind, Kind::CallEnd { outcome, .. } if outcome.is_ok() == ok);
    let calls = [
        Line::solid(per_second(events, seconds, ended(true)), GREEN, "succeeded"),
        Line::solid(per_second(events, seconds, ended(false)), RED, "failed"),
        Line::solid(
            per_second(events, seconds, |e| matches!(e.kind, Kind::Limited { .. })),
            BLUE,
            "rate-limited",
        ),
    ];
    let mut servers = Vec::new();
    for (n, s) in scenario.servers.iter().enumerate() {
        let color = Palette99::pick(n).to_rgba();
        let received = per_second(events, seconds, |e| {
            e.host == s.name && matches!(e.kind, Kind::Served { .. })
        });
        let impaired = per_second(events, seconds, |e| {
            e.host == s.name && matches!(e.kind, Kind::Served { impaired: true, .. })
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
        &format!("{} — calls per second", scenario.name),
        end,
        &calls,
    )?;
    panel(
        &panels[1],
        "requests reaching each server per second (dashed: while impaired)",
        end,
        &servers,
    )?;
    panel(&panels[2], "breakers open / half-open", end, &breakers)?;
    root.present()?;
    Ok(())
}
