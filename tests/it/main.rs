//! The cross-crate tests, one module per area, all in one test binary: one
//! link of redstring, the simulator, proptest and insta instead of one per
//! file. `cargo test -p redstring-suite --test it <filter>` runs part of it
//! (`scenarios::`, `fuzz::`, …).
//!
//! Two tests stand alone, beside this binary: `tests/memory.rs` and
//! `tests/no_alloc.rs` each install a counting `#[global_allocator]`, which
//! would count (and slow) every test of a binary it shared, and whose
//! figures other tests' allocations on other threads would disturb.
//!
//! Snapshots of `scenarios` are in `snapshots/` (named `it__scenarios__*`
//! by module path); the fuzzer's saved failing cases are in
//! `tests/proptest-regressions/fuzz.txt`, where proptest keeps a test
//! file's cases.

mod clock_reads;
mod fuzz;
mod racing;
mod scenarios;
