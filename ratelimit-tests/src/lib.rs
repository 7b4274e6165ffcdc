//! The tests, benchmarks and load generator of `distributed-ratelimit` live
//! in this package's `tests/`, `benches/` and `examples/`, with the
//! dependencies only they need, so that the framework's own examples compile
//! nothing more than they use.
