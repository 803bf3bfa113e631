//! The hosts: one module per kind of machine in the modelled deployment.
//!
//! Each host is what turmoil runs — a model server, the shared cache host, or
//! a worker — plus the two seams they share: the HTTP transport workers reach
//! servers through, and the per-host clock that gives every machine its own
//! skew. Only these modules know turmoil's sockets; everything above them
//! (the world, the evidence, the judgement) sees hosts through their handles
//! and the trace.

/// The request header a worker replaying an arrival trace sends with each
/// request's token counts (`"<prompt>,<output>"`); a server honours it in
/// place of its own token counts. Real servers never see it.
pub const TOKENS_HEADER: &str = "x-redstring-sim-tokens";

/// The most tokens either count in [`TOKENS_HEADER`] may carry; larger or
/// unparsable values are ignored, as a header a real server does not know.
pub const MAX_HEADER_TOKENS: u64 = 10_000_000;

/// The token counts a request carries in [`TOKENS_HEADER`], if any.
pub fn tokens_of(value: Option<&str>) -> Option<(u64, u64)> {
    let (prompt, output) = value?.split_once(',')?;
    let prompt: u64 = prompt.trim().parse().ok()?;
    let output: u64 = output.trim().parse().ok()?;
    (prompt <= MAX_HEADER_TOKENS && output <= MAX_HEADER_TOKENS).then_some((prompt, output))
}

pub mod cache_host;
pub mod clock;
pub mod server;
pub mod transport;
pub mod worker;
