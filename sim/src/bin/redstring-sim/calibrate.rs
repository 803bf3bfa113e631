//! `calibrate`: measure a running OpenAI-compatible server and print the
//! `[[servers]]` section that gives a scenario its speed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use redstring_sim::lab::HttpEndpoint;
use redstring_sim::lab::calibrate::{self, MAX_CONCURRENCY, Plan};

use crate::shared::{BAD_SCENARIO, Outcome, Outputs, SIM_FAILED, fail};

/// The arguments of `calibrate`.
#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// The server's base URL (`http://127.0.0.1:8080`; a trailing `/v1` is
    /// dropped).
    #[arg(long)]
    base_url: String,
    /// The `model` each request names.
    #[arg(long, default_value = "default")]
    model: String,
    /// The name the section gives the server.
    #[arg(long, default_value = "calibrated")]
    name: String,
    /// The most clients at once (and at most the server's slots, when its
    /// `/props` says them).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CONCURRENCY)))]
    max_concurrency: u32,
    /// Requests each client sends at each level of concurrency.
    #[arg(long, default_value_t = 10)]
    requests_per_client: u32,
    /// Seconds one request may take.
    #[arg(long, default_value_t = 120.0)]
    timeout_s: f64,
    /// The environment variable holding an API key to send as a bearer
    /// token (never the key itself on the command line).
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,
    /// Also write the section to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write each measured request, with the latency the fitted step
    /// predicts for it, to this file as CSV.
    #[arg(long)]
    samples: Option<PathBuf>,
}

/// Runs `calibrate`.
pub fn calibrate(args: CalibrateArgs) -> Outcome {
    let timeout = Duration::try_from_secs_f64(args.timeout_s)
        .ok()
        .filter(|t| !t.is_zero() && *t <= Duration::from_secs(3600))
        .ok_or_else(|| {
            fail(
                BAD_SCENARIO,
                &format!("--timeout-s must be above 0 and at most 3600, got {}", args.timeout_s),
            )
        })?;
    let plan = Plan {
        model: args.model.clone(),
        max_concurrency: args.max_concurrency,
        requests_per_client: args.requests_per_client,
        timeout,
        ..Plan::default()
    };
    plan.check().map_err(|e| match e {
        // The plan's fields a flag sets are named as the flag.
        calibrate::CalibrateError::Plan { field, problem } => {
            fail(BAD_SCENARIO, &format!("--{} {problem}", field.replace('_', "-")))
        }
        other => fail(BAD_SCENARIO, &other),
    })?;
    let api_key = match &args.api_key_env {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            fail(
                BAD_SCENARIO,
                &format!("--api-key-env {var}: no such environment variable (or not UTF-8)"),
            )
        })?),
        None => None,
    };
    let mut outputs = Outputs::reserve([("--out", args.out.clone()), ("--samples", args.samples.clone())])?;
    let endpoint = HttpEndpoint::new(&args.base_url, api_key).map_err(|e| fail(SIM_FAILED, &e))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(SIM_FAILED, &e))?;
    eprintln!(
        "calibrating {}: {} requests per client, 1 to {} clients at once",
        args.base_url, args.requests_per_client, args.max_concurrency
    );
    let measured = runtime
        .block_on(calibrate::measure(Arc::new(endpoint), &plan))
        .map_err(|e| fail(SIM_FAILED, &e))?;
    let fitted = calibrate::fit(&measured).map_err(|e| fail(SIM_FAILED, &e))?;
    let section = fitted.server_section(&args.name, &args.base_url);
    print!("{section}");
    outputs.write("--out", || section.clone())?;
    outputs.write("--samples", || calibrate::samples_csv(&measured, &fitted))?;
    outputs.commit()?;
    Ok(ExitCode::SUCCESS)
}
