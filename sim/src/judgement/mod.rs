//! Judgement: what the evidence of a run says.
//!
//! [`invariants`] decides whether the library kept its promises (one registry,
//! one checker per invariant, grouped by subject); [`figures`] measures how the
//! configuration served its callers, [`episode_figures`] the same per fault
//! episode, and [`objectives`] judges those figures
//! against the scenario's targets; [`report`] turns a run and its verdicts
//! into figures and text; [`sweep`] summarises many seeds; [`plots`] draws the SVG timeline.

pub mod episode_figures;
pub mod figures;
pub mod invariants;
pub mod objectives;
pub mod plots;
pub mod report;
pub mod sweep;
