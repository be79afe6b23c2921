//! Criterion micro-benchmarks live in this package's `[[bench]]` targets; run `cargo bench`.
//! The library itself is empty on purpose: it only gives the benchmarks a package to live in.
