//! Fixtures the simulator's tests share.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
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

/// Runs the `redstring-sim` binary with `args` to its end.
pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

/// A path as the `&str` a command line takes.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The shipped scenarios, `scenarios/` at the workspace's root.
pub fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

/// A file in a temporary directory of this process and of the calling
/// module, so modules may reuse file names.
pub use testkit::temp_file;

/// One worker calling one generic server 30 times a minute for 20 s.
pub const SMALL: &str = r#"
name = "small"
duration_s = 20
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{ id = 1, calls_per_min = 30 }]
"#;

/// A scenario named `name` in which one worker calls one generic server 30
/// times a minute for 40 s, and the server crashes at 5 s and is back at
/// 8 s, so that the hardening has something to do and recovery something to
/// measure; `objectives` (an `[objectives]` table, or nothing) ends it.
pub fn outage(name: &str, objectives: &str) -> String {
    format!(
        r#"
name = "{name}"
duration_s = 40
[hardening]
failure_threshold = 3
recovery_timeout_s = 5
[[servers]]
name = "gpu"
[[workers]]
name = "w"
servers = ["gpu"]
tenants = [{{ id = 1, calls_per_min = 30 }}]
[[faults]]
kind = "crash"
at_s = 5
server = "gpu"
[[faults]]
kind = "restart"
at_s = 8
server = "gpu"
{objectives}"#
    )
}

/// Objectives on recovery and on requests reaching the impaired server,
/// which [`outage`] meets at some settings and misses at others.
pub const OUTAGE_OBJECTIVES: &str = "[objectives]\ngoodput_recovery_s = 20\nimpaired_requests_max = 30\n";

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

/// The laboratory's tools (`lab/setup.sh` builds them), or `None` with a
/// loud skip message — unless `REDSTRING_REQUIRE_LLAMA=1`, when their
/// absence fails the test.
pub fn llama_tools_or_skip() -> Option<redstring_sim::lab::llama::Tools> {
    match redstring_sim::lab::llama::Tools::find() {
        Ok(tools) => Some(tools),
        Err(e) => {
            assert_ne!(
                std::env::var("REDSTRING_REQUIRE_LLAMA").as_deref(),
                Ok("1"),
                "REDSTRING_REQUIRE_LLAMA=1 but {e}"
            );
            eprintln!("SKIPPED (set REDSTRING_REQUIRE_LLAMA=1 to fail instead): {e}");
            None
        }
    }
}
