//! Cross-crate tests and benchmarks for redstring live in `tests/` and
//! `benches/`; this library only compiles the README's examples as doctests so
//! the README stays true.

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
