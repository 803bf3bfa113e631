//! The Pareto front as a picture (`tune --svg`).

use plotters::prelude::*;

use super::*;

/// The unit an objective's figure is measured in, for an axis.
fn objective_unit(name: &str) -> &'static str {
    match name {
        "goodput_recovery_s" | "p99_latency_s" => "seconds",
        "impaired_requests_max" | "throttled_requests_max" => "requests",
        "failed_fraction_max" | "high_failed_fraction_max" => "fraction of calls",
        "amplification_max" => "requests per admitted call",
        _ => "",
    }
}

/// The Pareto front of a tune as an SVG document, every objective drawn.
/// With one or two objectives, one scatter: the objectives' worst-seed
/// figures on the axes (with one objective, the margin on the y axis).
/// With more, small multiples: one such panel per pair of objectives, so
/// each objective has an axis in `n − 1` panels. In each, every candidate
/// of the last rung is a grey dot labelled with its id and its settings
/// (`#id: v1, v2`, in the order of the varied keys the caption names), the
/// front red and joined, the recommendation ringed, the targets dashed. A
/// candidate whose figure was never measured (goodput never came back) is
/// left out of the panels that need that figure, and counted in their
/// title.
pub fn pareto(tuning: &Tuning) -> String {
    let mut svg = String::new();
    if let Err(e) = draw_pareto(tuning, &mut svg) {
        return format!("<svg xmlns=\"http://www.w3.org/2000/svg\"><text y=\"20\">front failed: {e}</text></svg>");
    }
    svg
}

/// The pairs of objectives drawn against each other, by index (`None`:
/// the margin): one pair for one or two objectives, every pair for more.
pub(super) fn panels(objectives: usize) -> Vec<(usize, Option<usize>)> {
    match objectives {
        0 | 1 => vec![(0, None)],
        2 => vec![(0, Some(1))],
        n => (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, Some(j)))).collect(),
    }
}

/// A candidate's label on the picture: its id and its values, short.
pub(super) fn point_label(c: &Candidate, keys: &[String]) -> String {
    let values: Vec<&str> = keys
        .iter()
        .map(|k| c.values.get(k).map_or("?", String::as_str))
        .collect();
    format!("#{}: {}", c.id, values.join(", "))
}

fn draw_pareto(tuning: &Tuning, svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let last = tuning.rungs.last().map_or(0, |r| r.seeds);
    let finalists: Vec<&Candidate> = tuning
        .candidates
        .iter()
        .filter(|c| c.disqualified.is_none() && c.seeds == last && last > 0)
        .collect();
    let Some(first) = finalists.first() else {
        return Err("no candidate ran every seed".into());
    };
    let pairs = panels(first.objectives.len());
    let cols = match pairs.len() {
        1 => 1,
        2..=4 => 2,
        _ => 3,
    };
    let rows = pairs.len().div_ceil(cols);
    let (w, h) = if pairs.len() == 1 { (900, 650) } else { (560, 460) };
    let size = ((w * cols) as u32, (h * rows + 50) as u32);
    let root = SVGBackend::with_string(svg, size).into_drawing_area();
    root.fill(&WHITE)?;
    let short: Vec<&str> = tuning.keys.iter().map(|k| k.rsplit('.').next().unwrap_or(k)).collect();
    let caption = format!(
        "{}: {} candidates over {last} seeds, front over all {} objectives; labels #id: {}",
        tuning.scenario,
        finalists.len(),
        first.objectives.len(),
        short.join(", ")
    );
    let root = root.titled(&caption, ("sans-serif", 18))?;
    let areas = root.split_evenly((rows, cols));
    for (n, (&(x, y), area)) in pairs.iter().zip(areas.iter()).enumerate() {
        draw_panel(tuning, &finalists, (x, y), area, n == 0)?;
    }
    root.present()?;
    Ok(())
}

/// One panel: objective `x` against objective `y` (or the margin).
fn draw_panel(
    tuning: &Tuning,
    finalists: &[&Candidate],
    (xi, yi): (usize, Option<usize>),
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    legend: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let first = finalists.first().ok_or("no candidate ran every seed")?;
    let x_name = first.objectives.get(xi).map_or("", |o| o.name.as_str());
    let y_name = yi
        .and_then(|j| first.objectives.get(j))
        .map_or("margin", |o| o.name.as_str());
    let point = |c: &Candidate| -> Option<(f64, f64)> {
        let value = |i: usize| match c.objectives.get(i)?.worst {
            Worst::Measured { value } => Some(value),
            Worst::NotApplicable => Some(0.0),
            Worst::Never => None,
        };
        let y = match yi {
            Some(j) => value(j)?,
            None => c.margin?,
        };
        Some((value(xi)?, y))
    };
    let points: Vec<(&Candidate, (f64, f64))> = finalists.iter().filter_map(|c| point(c).map(|p| (*c, p))).collect();
    let left_out = finalists.len() - points.len();
    let targets = (
        first.objectives.get(xi).map(|o| o.target),
        yi.and_then(|j| first.objectives.get(j)).map(|o| o.target),
    );
    let span = |values: Vec<f64>| {
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min).min(0.0);
        let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let hi = if hi > lo { hi } else { lo + 1.0 };
        (lo, hi + (hi - lo) * 0.25)
    };
    let xs: Vec<f64> = points.iter().map(|p| p.1.0).chain(targets.0).collect();
    let ys: Vec<f64> = points.iter().map(|p| p.1.1).chain(targets.1).collect();
    let (x_lo, x_hi) = span(xs);
    let (y_lo, y_hi) = span(ys);
    let title = format!(
        "{x_name} against {y_name}{}",
        if left_out > 0 {
            format!(" ({left_out} never recovered, not drawn)")
        } else {
            String::new()
        }
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)?;
    let unit = |name: &str| {
        if name == "margin" {
            "margin (smallest normalised slack)".to_owned()
        } else {
            format!("{name}: worst seed, {}", objective_unit(name))
        }
    };
    chart
        .configure_mesh()
        .x_desc(unit(x_name))
        .y_desc(unit(y_name))
        .draw()?;
    if let Some(t) = targets.0 {
        chart
            .draw_series(DashedLineSeries::new(
                [(t, y_lo), (t, y_hi)],
                4,
                4,
                BLUE.mix(0.6).into(),
            ))?
            .label(format!(
                "targets ({x_name} ≤ {t}{})",
                targets.1.map_or(String::new(), |t| format!(", {y_name} ≤ {t}"))
            ))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.mix(0.6)));
    }
    if let Some(t) = targets.1 {
        chart.draw_series(DashedLineSeries::new(
            [(x_lo, t), (x_hi, t)],
            4,
            4,
            BLUE.mix(0.6).into(),
        ))?;
    }
    chart
        .draw_series(points.iter().map(|(_, p)| Circle::new(*p, 4, BLACK.mix(0.35).filled())))?
        .label("candidate (all seeds)")
        .legend(|(x, y)| Circle::new((x + 10, y), 4, BLACK.mix(0.35).filled()));
    let mut front: Vec<(f64, f64)> = points
        .iter()
        .filter(|(c, _)| tuning.front.contains(&c.id))
        .map(|(_, p)| *p)
        .collect();
    front.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    chart.draw_series(LineSeries::new(front.iter().copied(), RED.mix(0.6)))?;
    chart
        .draw_series(front.iter().map(|p| Circle::new(*p, 5, RED.filled())))?
        .label("Pareto front")
        .legend(|(x, y)| Circle::new((x + 10, y), 5, RED.filled()));
    if let Some(&(c, p)) = points.iter().find(|(c, _)| Some(c.id) == tuning.recommended) {
        chart
            .draw_series([Circle::new(p, 10, GREEN.stroke_width(3))])?
            .label(format!("recommended #{}", c.id))
            .legend(|(x, y)| Circle::new((x + 10, y), 6, GREEN.stroke_width(3)));
    }
    // Every point named, just right of it.
    chart.draw_series(
        points
            .iter()
            .map(|(c, p)| EmptyElement::at(*p) + Text::new(point_label(c, &tuning.keys), (8, -4), ("sans-serif", 11))),
    )?;
    if legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}
