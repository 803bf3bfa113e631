//! The evidence a run leaves behind.
//!
//! [`trace`] is the ordered record every host writes into, and the only
//! thing the judgement reads.

pub mod trace;
