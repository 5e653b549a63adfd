//! Placeholder, replaced by the fast-path benchmarks.
fn main() {}
