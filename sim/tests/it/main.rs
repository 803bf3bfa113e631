//! The simulator's integration tests, one module per area, all in one test
//! binary: one link of the simulator, turmoil, hyper and the core instead of
//! one per file. `cargo test -p redstring-sim --test it <filter>` runs part of
//! it (`cli::`, `shard::`, …).
//!
//! None of them stands alone. Each simulation runs turmoil on its own
//! thread's state; the tests that run the CLI start the built
//! `redstring-sim` as a process (`support::bin`, through
//! `CARGO_BIN_EXE_redstring-sim`, which every integration test gets); the
//! metrics tests install their recorder for one closure
//! (`metrics::with_local_recorder`); nothing sets an environment variable
//! or a global allocator. Files a test writes go to a temporary directory
//! per module (`support::temp_file`), so modules may reuse names.
//!
//! `conformance` and `mutants` run the known-bad variants of the hardening
//! and are compiled only with the `mutants` feature (the default).

mod support;

mod cache_host;
mod cli;
mod closed_loop;
#[cfg(feature = "mutants")]
mod conformance;
mod fuzz_shard;
mod hostile;
mod input_checks;
mod metrics;
#[cfg(feature = "mutants")]
mod mutants;
mod objectives;
mod output_safety;
mod replay;
mod routing;
mod sanity;
mod scenario_files;
mod server;
mod server_connections;
mod server_kinds;
mod server_tenant_tokens;
mod service_model;
mod shard;
mod transport;
mod tune;
mod tune_shard;
mod world;
