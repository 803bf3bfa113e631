//! Extracts a small typed record from a real OpenAI-compatible endpoint,
//! hardened with retry, a per-tenant rate limit and a circuit breaker.
//!
//! ```text
//! cargo run -p redstring --example extract -- \
//!     --base-url http://127.0.0.1:8080/v1 --model qwen3 \
//!     [--text "Ada Lovelace, ada@example.com, works at Analytical Engines Ltd."] \
//!     [--system-prompt "Extract the contact."] [--api-key KEY] \
//!     [--timeout-secs 120] [--max-tokens 512] [--max-retries 3]
//! ```
//!
//! The API key may also come from `OPENAI_API_KEY`; it defaults to
//! `not-needed`, which local servers (llama.cpp, llama-swap, vLLM, Ollama)
//! ignore. Prints the record as JSON on success; on failure prints the error
//! and its causes and exits with status 1 (2 for bad arguments). Retries and
//! waits are reported on stderr as they happen.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use redstring::provider::{HardenedProvider, LlmProvider, LlmProviderExt, OpenAiCompatible};
use redstring::{CircuitBreaker, Env, Event, Observer, RateLimiter, RetryPolicy, TenantId};

/// The record the model is asked for.
#[derive(Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Contact {
    /// The person's full name.
    name: String,
    /// Their email address, if the text gives one.
    email: Option<String>,
    /// The organisation they work for, if the text says.
    company: Option<String>,
}

const DEFAULT_TEXT: &str = "Ada Lovelace (ada@example.com) leads research at Analytical Engines Ltd.";
const USAGE: &str = "usage: extract --base-url URL --model ID [--text TEXT] [--system-prompt PROMPT] \
[--api-key KEY] [--timeout-secs N] [--max-tokens N] [--max-retries N]";

struct Args {
    base_url: String,
    model: String,
    text: String,
    system_prompt: Option<String>,
    api_key: Option<String>,
    timeout: Duration,
    max_tokens: Option<u32>,
    max_retries: u32,
}

fn parse_args() -> Result<Args, String> {
    let mut base_url = None;
    let mut model = None;
    let mut args = Args {
        base_url: String::new(),
        model: String::new(),
        text: DEFAULT_TEXT.to_owned(),
        system_prompt: None,
        api_key: std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()),
        timeout: Duration::from_secs(120),
        max_tokens: None,
        max_retries: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_owned());
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |v: &str| {
            v.parse::<u32>()
                .map_err(|_| format!("{flag} takes a whole number, got {v:?}"))
        };
        match flag.as_str() {
            "--base-url" => base_url = Some(value),
            "--model" => model = Some(value),
            "--text" => args.text = value,
            "--system-prompt" => args.system_prompt = Some(value),
            "--api-key" => args.api_key = Some(value),
            "--timeout-secs" => args.timeout = Duration::from_secs(u64::from(number(&value)?)),
            "--max-tokens" => args.max_tokens = Some(number(&value)?),
            "--max-retries" => args.max_retries = number(&value)?,
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    args.base_url = base_url.ok_or_else(|| format!("--base-url is required\n{USAGE}"))?;
    args.model = model.ok_or_else(|| format!("--model is required\n{USAGE}"))?;
    Ok(args)
}

/// Shows the hardening's decisions as they happen.
struct Stderr;

impl Observer for Stderr {
    fn on_event(&self, event: &Event) {
        match event {
            Event::RetryScheduled {
                attempt, delay, error, ..
            } => eprintln!(
                "attempt {attempt} failed ({error}); retrying in {:.1}s",
                delay.as_secs_f64()
            ),
            Event::RateLimitWait { wait, .. } => eprintln!("rate limited; waiting {:.1}s", wait.as_secs_f64()),
            Event::BreakerTransition { from, to, .. } => eprintln!("circuit {from:?} -> {to:?}"),
            Event::ServedModelDiffers { requested, served } => {
                eprintln!("warning: asked for {requested}, but {served} answered")
            }
            _ => {}
        }
    }
}

fn print_error(error: &dyn std::error::Error) {
    eprintln!("error: {error}");
    let mut cause = error.source();
    while let Some(c) = cause {
        eprintln!("  caused by: {c}");
        cause = c.source();
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(contact) => match serde_json::to_string_pretty(&contact) {
            Ok(json) => {
                println!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                print_error(&e);
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            print_error(e.as_ref());
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<Contact, Box<dyn std::error::Error>> {
    let mut adapter = OpenAiCompatible::builder(&args.base_url, &args.model).timeout(args.timeout);
    if let Some(key) = &args.api_key {
        adapter = adapter.api_key(key);
    }
    if let Some(n) = args.max_tokens {
        adapter = adapter.max_tokens(n);
    }
    let env = Env::default().with_observer(Arc::new(Stderr));
    let adapter = adapter.env(env.clone()).build()?;

    let limiter = Arc::new(RateLimiter::builder(60).env(env.clone()).build()?);
    let breaker = Arc::new(CircuitBreaker::builder().env(env.clone()).build()?);
    let provider = HardenedProvider::builder(adapter, TenantId::from_u128(1), limiter, breaker)
        .retry_policy(RetryPolicy::builder().max_retries(args.max_retries).build()?)
        .env(env)
        .build();

    eprintln!("extracting with {}", provider.model());
    let answer = provider
        .extract_with_model::<Contact>(&args.text, args.system_prompt.as_deref())
        .await?;
    eprintln!("answered by {}", answer.model);
    Ok(answer.value)
}
