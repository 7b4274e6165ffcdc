//! The tests, benchmarks and load generator of `distributed-ratelimit` live
//! in this package's `tests/`, `benches/` and `examples/`, with the
//! dependencies only they need, so that the framework's own examples compile
//! nothing more than they use.

/// The front page's and the guide's examples, compiled (and most run) as
/// doctests, so none drifts from the API.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../docs/setup.md")]
    struct Setup;
    #[doc = include_str!("../../docs/attribute.md")]
    struct Attribute;
    #[doc = include_str!("../../docs/algorithms.md")]
    struct Algorithms;
    #[doc = include_str!("../../docs/failures.md")]
    struct Failures;
    #[doc = include_str!("../../docs/rules.md")]
    struct Rules;
    #[doc = include_str!("../../docs/cluster.md")]
    struct Cluster;
    #[cfg(feature = "axum")]
    #[doc = include_str!("../../docs/http.md")]
    struct Http;
    #[doc = include_str!("../../docs/operations.md")]
    struct Operations;
    #[doc = include_str!("../../docs/benchmarks.md")]
    struct Benchmarks;
    #[doc = include_str!("../../docs/native-module.md")]
    struct NativeModule;
}
