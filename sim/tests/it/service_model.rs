//! The batching service model against its own analytic expectation: one
//! engine under Poisson load from 10 % to 120 % of its capacity estimate,
//! latency and time to first token measured beside the mean-value fixed point
//! of `batching::expectation`.
//!
//! `write_the_validation_figure` (ignored) redraws `docs/service-model.svg`
//! and prints the table `docs/server-kinds.md` quotes:
//! `cargo test -p redstring-sim --test it service_model:: -- --ignored --nocapture`.

use plotters::prelude::*;
use redstring_sim::hosts::server::batching::{EngineParams, Expectation, Measured, StepCost, expectation, measure};

const PROMPT: u64 = 400;
const OUTPUT: u64 = 60;
const SIGMA: f64 = 0.05;

fn params() -> EngineParams {
    EngineParams {
        max_seqs: 64,
        kv_tokens: 100_000,
        max_batched_tokens: 8192,
        cost: StepCost::Polynomial { time_scale: 1.0 },
        preempt: true,
        reject_prompts_from: None,
        cached_prefix: 0,
    }
}

/// (load fraction, measured, expected) at each load.
fn sweep(loads: &[f64], requests: u64) -> Vec<(f64, Measured, Option<Expectation>)> {
    let p = params();
    let capacity = p.capacity_per_s(PROMPT, OUTPUT);
    loads
        .iter()
        .map(|&load| {
            let rate = load * capacity;
            let measured = measure(&p, PROMPT, OUTPUT, rate, requests, SIGMA, 42);
            (load, measured, expectation(&p, PROMPT, OUTPUT, rate))
        })
        .collect()
}

fn error(measured: f64, expected: f64) -> f64 {
    (measured - expected).abs() / expected
}

#[test]
fn below_capacity_the_engine_matches_its_expectation() {
    let rows = sweep(&[0.1, 0.3, 0.5, 0.7, 0.9], 20_000);
    for (load, m, e) in &rows {
        let e = e.unwrap_or_else(|| panic!("no expectation at {load}"));
        assert!(
            error(m.latency_s, e.latency_s) < 0.08,
            "latency at {load}: measured {m:?}, expected {e:?}"
        );
        assert!(
            error(m.ttft_s, e.ttft_s) < 0.15,
            "ttft at {load}: measured {m:?}, expected {e:?}"
        );
    }
    let latencies: Vec<f64> = rows.iter().map(|(_, m, _)| m.latency_s).collect();
    assert!(
        latencies.windows(2).all(|w| w[0] < w[1]),
        "latency grows with load: {latencies:?}"
    );
}

#[test]
#[ignore = "redraws docs/service-model.svg"]
fn write_the_validation_figure() {
    let loads: Vec<f64> = (1..=12).map(|i| f64::from(i) / 10.0).collect();
    let rows = sweep(&loads, 20_000);
    println!(
        "| load | latency measured (s) | latency expected (s) | error | TTFT measured (ms) | TTFT expected (ms) | error |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (load, m, e) in &rows {
        match e {
            Some(e) => println!(
                "| {:.0} % | {:.3} | {:.3} | {:.1} % | {:.1} | {:.1} | {:.1} % |",
                load * 100.0,
                m.latency_s,
                e.latency_s,
                100.0 * error(m.latency_s, e.latency_s),
                m.ttft_s * 1000.0,
                e.ttft_s * 1000.0,
                100.0 * error(m.ttft_s, e.ttft_s)
            ),
            None => println!(
                "| {:.0} % | {:.3} | — | — | {:.1} | — | — |",
                load * 100.0,
                m.latency_s,
                m.ttft_s * 1000.0
            ),
        }
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/service-model.svg");
    let root = SVGBackend::new(&path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let (left, right) = root.split_horizontally(450);
    let panel = |area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
                 caption: &str,
                 unit: f64,
                 pick: &dyn Fn(&Measured) -> f64,
                 expect: &dyn Fn(&Expectation) -> f64| {
        let measured: Vec<(f64, f64)> = rows.iter().map(|(l, m, _)| (l * 100.0, pick(m) * unit)).collect();
        let expected: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|(l, _, e)| e.map(|e| (l * 100.0, expect(&e) * unit)))
            .collect();
        let top = measured.iter().chain(&expected).map(|p| p.1).fold(0.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..125.0, 0.0..top)
            .unwrap();
        chart
            .configure_mesh()
            .x_desc("offered load, % of the capacity estimate")
            .draw()
            .unwrap();
        chart
            .draw_series(LineSeries::new(expected, BLUE))
            .unwrap()
            .label("expectation (fixed point)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(measured.iter().map(|p| Circle::new(*p, 3, RED.filled())))
            .unwrap()
            .label("engine, 20 000 requests")
            .legend(|(x, y)| Circle::new((x + 10, y), 3, RED.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .unwrap();
    };
    panel(&left, "mean latency (s)", 1.0, &|m| m.latency_s, &|e| e.latency_s);
    panel(&right, "mean time to first token (ms)", 1000.0, &|m| m.ttft_s, &|e| {
        e.ttft_s
    });
    root.present().unwrap();
}
