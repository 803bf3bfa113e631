//! Fixtures the simulator's host tests share.
// Each test crate uses only some of these.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use redstring_sim::scenario::{Network, ServerSpec};
use redstring_sim::world::sim_builder;
use turmoil::Sim;

/// A seeded simulation with the world's own settings: the fixed epoch, 10 ms
/// steps, the default 1–5 ms links.
pub fn sim<'a>(seed: u64, secs: u64) -> Sim<'a> {
    sim_builder(
        seed,
        Duration::from_millis(10),
        &Network::default(),
        Duration::from_secs(secs),
    )
    .build()
}

/// A small server (two slots, a queue of four) that is ready at once.
pub fn spec() -> ServerSpec {
    ServerSpec {
        slots: 2,
        queue: 4,
        reload_s: 0.0,
        ..ServerSpec::named("gpu")
    }
}

/// The `redstring-sim` binary, ready for arguments.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_redstring-sim"))
}

/// Writes `text` to `name` (which may name subdirectories) in a temporary
/// directory of this test binary and process, and returns its path.
pub fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "redstring-sim-{}-{}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap_or(&dir)).unwrap();
    std::fs::write(&path, text).unwrap();
    path
}

/// One worker calling one generic server 30 times a minute for 400 s (rpm 60
/// per 10 s): the start of a scenario that appends its faults.
pub const ONE_WORKER: &str = r#"
name = "one-worker"
duration_s = 400
[hardening]
rpm = 60
window_s = 10
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 30 }]
"#;

/// The server answers 500 from 10 s to the end: no breaker closes again
/// after the last fault, so liveness fails.
pub const ERRORS_TO_THE_END: &str =
    "[[faults]]\nkind = \"behave\"\nat_s = 10\nserver = \"gpu\"\nbehaviour = { mode = \"error\" }\n";
