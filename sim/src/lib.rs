//! A deterministic simulator for redstring's hardening.
//!
//! The same core code that runs in production — limiter, breaker, retry, the
//! OpenAI-compatible adapter and the hardened provider — runs here inside the
//! `turmoil` network simulator against flaky GPU model servers, fleets sharing
//! a cache, partitions and skewed clocks. A run is a pure function of its
//! scenario and seed: the same pair gives the same trace, byte for byte.
//!
//! The modules follow the roles of a run, in the order data flows through
//! them:
//!
//! - [`scenario`] — the input: a deployment, its hardening and a fault
//!   schedule, parsed from TOML and validated;
//! - [`world`] — the engine: builds the turmoil simulation from a scenario,
//!   applies each fault at its instant and runs it, handing back its
//!   evidence ([`world::run_within`]);
//! - [`hosts`] — one module per machine of the modelled deployment: model
//!   server, cache host, worker, the transport between them, and their clocks;
//! - [`evidence`] — what a run leaves behind: the typed trace and the one
//!   fold of breaker and limiter state over it;
//! - [`judgement`] — what the evidence says: the invariants, the report and
//!   the plots;
//! - [`campaign`] — one scenario over many seeds and variants, on many
//!   threads, with the result of one ([`campaign::simulate`] is world then
//!   judgement for one seed);
//! - [`search`] — looking for the scenario that breaks a configuration, and
//!   for the numbers that meet the objectives: the fuzzer and `tune`;
//! - [`merge`] — the shards of any of those joined back into one result;
//! - [`lab`] — real servers measured, to give a scenario's servers their
//!   real speed.
//!
//! The judgement never runs a world, and the world never judges: what runs
//! (`world`, `hosts`) hands `evidence` up, `judgement` reads it, and
//! `campaign`, `search` and `merge` build on both. (`scenario` still asks
//! the server model for a kind's analytic capacity, and a few helpers cross
//! between `world`, `hosts` and `evidence`.)

pub mod campaign;
pub mod evidence;
pub mod hosts;
pub mod judgement;
pub mod lab;
pub mod merge;
pub mod scenario;
pub mod search;
pub mod terminal;
pub mod world;
