//! The Pareto front as a picture (`tune --svg`).

use plotters::prelude::*;

use super::*;

/// The unit an objective's figure is measured in, for an axis.
fn objective_unit(name: &str) -> &'static str {
    match name {
        "goodput_recovery_s" | "p99_latency_s" => "seconds",
        "impaired_requests_max" | "throttled_requests_max" => "requests",
        "failed_fraction_max" => "fraction of calls",
        "amplification_max" => "requests per admitted call",
        _ => "",
    }
}

/// The Pareto front of a tune as an SVG document: the first two
/// objectives' worst-seed figures on the axes (with one objective, the
/// margin on the y axis), every candidate of the last rung a grey dot, the
/// front red and joined, the recommendation ringed and named, the targets
/// dashed. A candidate whose figure was never measured (goodput never came
/// back) is left out and counted in the caption.
pub fn pareto(tuning: &Tuning) -> String {
    let mut svg = String::new();
    if let Err(e) = draw_pareto(tuning, &mut svg) {
        return format!("<svg xmlns=\"http://www.w3.org/2000/svg\"><text y=\"20\">front failed: {e}</text></svg>");
    }
    svg
}

fn draw_pareto(tuning: &Tuning, svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let last = tuning.rungs.last().map_or(0, |r| r.seeds);
    let finalists: Vec<_> = tuning
        .candidates
        .iter()
        .filter(|c| c.disqualified.is_none() && c.seeds == last && last > 0)
        .collect();
    let Some(first) = finalists.first() else {
        return Err("no candidate ran every seed".into());
    };
    let x_name = first.objectives.first().map_or("", |o| o.name.as_str());
    let y_name = first.objectives.get(1).map_or("margin", |o| o.name.as_str());
    let point = |c: &Candidate| -> Option<(f64, f64)> {
        let value = |i: usize| match c.objectives.get(i)?.worst {
            Worst::Measured { value } => Some(value),
            Worst::NotApplicable => Some(0.0),
            Worst::Never => None,
        };
        let y = if c.objectives.len() > 1 { value(1)? } else { c.margin? };
        Some((value(0)?, y))
    };
    let points: Vec<(usize, (f64, f64))> = finalists.iter().filter_map(|c| point(c).map(|p| (c.id, p))).collect();
    let left_out = finalists.len() - points.len();
    let targets = (
        first.objectives.first().map(|o| o.target),
        first.objectives.get(1).map(|o| o.target),
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
    let root = SVGBackend::with_string(svg, (900, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "{}: {} candidates over {last} seeds, front over all {} objectives{}",
        tuning.scenario,
        finalists.len(),
        first.objectives.len(),
        if left_out > 0 {
            format!(" ({left_out} never recovered, not drawn)")
        } else {
            String::new()
        }
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
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
        .filter(|(id, _)| tuning.front.contains(id))
        .map(|(_, p)| *p)
        .collect();
    front.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    chart.draw_series(LineSeries::new(front.iter().copied(), RED.mix(0.6)))?;
    chart
        .draw_series(front.iter().map(|p| Circle::new(*p, 5, RED.filled())))?
        .label("Pareto front")
        .legend(|(x, y)| Circle::new((x + 10, y), 5, RED.filled()));
    if let Some(&(id, p)) = points.iter().find(|(id, _)| Some(*id) == tuning.recommended) {
        chart
            .draw_series([Circle::new(p, 10, GREEN.stroke_width(3))])?
            .label(format!("recommended #{id}"))
            .legend(|(x, y)| Circle::new((x + 10, y), 6, GREEN.stroke_width(3)));
        chart.draw_series([Text::new(format!("#{id}"), p, ("sans-serif", 14))])?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
