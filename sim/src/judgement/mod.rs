//! Judgement: what the evidence of a run says.
//!
//! [`invariants`] decides whether the library kept its promises (one registry,
//! one checker per invariant, grouped by subject); [`report`] turns a run and
//! its verdicts into figures and text; [`plots`] draws the SVG timeline.

pub mod invariants;
pub mod plots;
pub mod report;
