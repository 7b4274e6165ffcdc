//! Named rules whose quotas can change while the service runs.

/// The named rules of a [`Limiter`](crate::Limiter): quotas the running
/// service can change, looked up by name on every call.
#[derive(Debug, Default)]
pub struct Rules {}
