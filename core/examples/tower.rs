//! The hardening as tower layers over a reqwest-based OpenAI-compatible
//! client: a breaker, a per-tenant limiter and retries around a `Service`
//! that asks a real server for a typed record.
//!
//! ```text
//! cargo run -p redstring --features tower,openai --example tower -- \
//!     --base-url http://127.0.0.1:8080/v1 --model qwen3 [--calls 5]
//! ```
//!
//! The inner service is the kind of thing a service already has: a
//! `service_fn` over `OpenAiCompatible` (whose transport is reqwest). The
//! layers go around it in the builder's order: the breaker, then one limiter
//! slot per call for the request's tenant, then retries of what the adapter
//! calls transient, waiting what the server asked. Each call's outcome is
//! printed; a refusal by a layer says which and for how long. Exits 1 when
//! every call failed, 2 for bad arguments.

use std::process::ExitCode;
use std::sync::Arc;

use redstring::provider::{ExtractError, ExtractRequest, LlmProvider, OpenAiCompatible, OutputSchema};
use redstring::tower::{BoxError, CircuitBreakerLayer, ErrIsFailure, RateLimitLayer, RetryLayer};
use redstring::{CircuitBreaker, RateLimiter, Retry, RetryPolicy, Retryable, TenantId};
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// The record the model is asked for.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code)] // printed, and the schema is made of it
struct Person {
    /// The person's name.
    name: String,
}

/// One request through the stack: whose it is and what to read.
#[derive(Clone)]
struct Ask {
    tenant: TenantId,
    text: String,
}

/// What the adapter calls worth another try, with the server's wait.
fn retryable(error: &BoxError) -> Retryable {
    error
        .downcast_ref::<ExtractError>()
        .map_or(Retryable::No, ExtractError::retryable)
}

fn arg(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(base_url), Some(model)) = (arg(&args, "--base-url"), arg(&args, "--model")) else {
        eprintln!("usage: tower --base-url URL --model ID [--calls N]");
        return ExitCode::from(2);
    };
    let Ok(calls) = arg(&args, "--calls").unwrap_or_else(|| "5".into()).parse::<u32>() else {
        eprintln!("--calls must be a whole number");
        return ExitCode::from(2);
    };
    let built = (|| -> Result<_, Box<dyn std::error::Error>> {
        let client = Arc::new(OpenAiCompatible::builder(base_url, model).build()?);
        let breaker = Arc::new(CircuitBreaker::builder().failure_threshold(3).build()?);
        let limiter = Arc::new(RateLimiter::builder(60).build()?);
        let retry = Retry::new(RetryPolicy::builder().max_retries(2).build()?);
        Ok((client, breaker, limiter, retry))
    })();
    let (client, breaker, limiter, retry) = match built {
        Ok(parts) => parts,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let schema = Arc::new(OutputSchema::for_type::<Person>());
    // The service you already have: one chat completion, the record parsed.
    let model = service_fn(move |ask: Ask| {
        let (client, schema) = (client.clone(), schema.clone());
        async move {
            let request = ExtractRequest {
                text: &ask.text,
                system_prompt: Some("Extract the person named."),
                schema: &schema,
            };
            client.extract_value(request).await.map_err(BoxError::from)
        }
    });
    let service = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new(breaker, ErrIsFailure))
        .layer(RateLimitLayer::new(limiter, |ask: &Ask| ask.tenant))
        .layer(RetryLayer::new(retry, retryable))
        .service(model);

    let mut answered = 0;
    for n in 0..calls {
        let ask = Ask {
            tenant: TenantId::from_u128(1),
            text: format!("Ada Lovelace wrote the first program ({n})."),
        };
        match service.clone().oneshot(ask).await {
            Ok(record) => {
                answered += 1;
                println!("call {n}: {record}");
            }
            Err(e) => {
                let wait = redstring::tower::retry_after_of(&e);
                println!(
                    "call {n}: {e}{}",
                    wait.map_or_else(String::new, |w| format!(" (again in {w:?})"))
                );
                // Spent retries hold the last attempt's failure as their source.
                let mut cause = std::error::Error::source(&*e);
                while let Some(c) = cause {
                    println!("  because: {c}");
                    cause = c.source();
                }
            }
        }
    }
    if answered == 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
