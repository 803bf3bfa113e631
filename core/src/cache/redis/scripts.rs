//! The Lua scripts, compiled into the binary and shared by every cache.
//!
//! Each script is `common.lua` (helpers: exact integer formatting, the time
//! source, the hit-recording rule) followed by its own body, so the rule for
//! recording a hit is written once for `record_hit` and `acquire_slot`.

use std::sync::LazyLock;

use ::redis::Script;

const COMMON: &str = include_str!("common.lua");

/// One `redis::Script` per atomic operation; `invoke_async` sends `EVALSHA`
/// and loads the script on `NOSCRIPT`.
pub(super) struct Scripts {
    pub(super) record_hit: Script,
    pub(super) count_since: Script,
    pub(super) oldest_since: Script,
    pub(super) acquire_slot: Script,
    pub(super) increment: Script,
    pub(super) breaker_step: Script,
    pub(super) breaker_read: Script,
    pub(super) budget_step: Script,
    pub(super) acquire_with_tokens: Script,
    pub(super) settle_tokens: Script,
    pub(super) pick_least_loaded: Script,
    pub(super) concurrency_step: Script,
}

fn with_common(body: &str) -> Script {
    Script::new(&format!("{COMMON}\n{body}"))
}

/// The scripts, hashed once per process.
pub(super) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    record_hit: with_common(include_str!("record_hit.lua")),
    count_since: with_common(include_str!("count_since.lua")),
    oldest_since: with_common(include_str!("oldest_since.lua")),
    acquire_slot: with_common(include_str!("acquire_slot.lua")),
    increment: with_common(include_str!("increment.lua")),
    breaker_step: with_common(include_str!("breaker_step.lua")),
    breaker_read: with_common(include_str!("breaker_read.lua")),
    budget_step: with_common(include_str!("budget_step.lua")),
    acquire_with_tokens: with_common(include_str!("acquire_with_tokens.lua")),
    settle_tokens: with_common(include_str!("settle_tokens.lua")),
    pick_least_loaded: with_common(include_str!("pick_least_loaded.lua")),
    concurrency_step: with_common(include_str!("concurrency_step.lua")),
});
