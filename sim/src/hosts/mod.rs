//! The hosts: one module per kind of machine in the modelled deployment.
//!
//! Each host is what turmoil runs — a model server, the shared cache host, or
//! a worker — plus the two seams they share: the HTTP transport workers reach
//! servers through, and the per-host clock that gives every machine its own
//! skew. Only these modules know turmoil's sockets; everything above them
//! (the world, the evidence, the judgement) sees hosts through their handles
//! and the trace.

/// The request header a worker sends with a call's own token counts
/// (`"<prompt>,<output>"`, either side may be empty): a replayed trace's
/// request, or a draw from its tenant's `prompt_tokens` / `output_tokens`
/// distributions. A server honours each count given in place of its own
/// (fixed or drawn) count. Real servers never see it.
pub const TOKENS_HEADER: &str = "x-redstring-sim-tokens";

/// A simulator-only request header naming the call a request belongs to, as
/// `worker/call`, so a server's `served` event can say which call it served.
pub const CALL_HEADER: &str = "x-redstring-sim-call";

/// The most tokens either count in [`TOKENS_HEADER`] may carry; larger or
/// unparsable values are ignored, as a header a real server does not know.
pub const MAX_HEADER_TOKENS: u64 = 10_000_000;

/// The token counts a request carries in [`TOKENS_HEADER`], if it carries
/// both.
pub fn tokens_of(value: Option<&str>) -> Option<(u64, u64)> {
    match token_sides_of(value)? {
        RequestTokens {
            prompt: Some(prompt),
            output: Some(output),
        } => Some((prompt, output)),
        _ => None,
    }
}

/// The token counts a call asks the server to use, each side optional: a
/// side left out is the server's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestTokens {
    /// Prompt tokens.
    pub prompt: Option<u64>,
    /// Output tokens the answer would have without a `max_tokens` cap.
    pub output: Option<u64>,
}

impl RequestTokens {
    /// Whether it sets neither side (nothing to send).
    pub fn is_empty(&self) -> bool {
        self.prompt.is_none() && self.output.is_none()
    }

    /// The [`TOKENS_HEADER`] value for these counts.
    pub fn header_value(&self) -> String {
        let side = |n: Option<u64>| n.map_or_else(String::new, |n| n.to_string());
        format!("{},{}", side(self.prompt), side(self.output))
    }
}

/// The counts a [`TOKENS_HEADER`] value carries, either side possibly
/// absent; `None` when the value is missing, has no comma, carries neither
/// count, or a side is neither empty nor a count up to [`MAX_HEADER_TOKENS`].
pub fn token_sides_of(value: Option<&str>) -> Option<RequestTokens> {
    let (prompt, output) = value?.split_once(',')?;
    let side = |s: &str| -> Option<Option<u64>> {
        let s = s.trim();
        if s.is_empty() {
            return Some(None);
        }
        let n: u64 = s.parse().ok()?;
        (n <= MAX_HEADER_TOKENS).then_some(Some(n))
    };
    let tokens = RequestTokens {
        prompt: side(prompt)?,
        output: side(output)?,
    };
    (!tokens.is_empty()).then_some(tokens)
}

pub mod cache_host;
pub mod clock;
pub mod server;
pub mod transport;
pub mod worker;
