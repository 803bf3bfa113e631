//! Cross-crate tests and benchmarks for redstring live in `tests/` and `benches/`; this library is empty.
