//! [`RouteOptions`]: how the router runs one domain's worker.

use std::time::Duration;

/// How the router runs one domain's worker: the limits it enforces around the worker rather than
/// inside it. Its own file because both the registry (which reads them from a worker's options)
/// and the router (which enforces them) need it, and neither should depend on the other for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteOptions {
    /// A sample whose scoring takes longer fails with a timeout (`None`: no limit). Measured
    /// from when the sample gets a concurrency slot. Default 120 s.
    pub timeout: Option<Duration>,
    /// Samples of this domain scored at once; the rest wait. Default 64.
    pub max_concurrency: usize,
}

impl Default for RouteOptions {
    fn default() -> Self {
        Self {
            timeout: Some(Duration::from_secs(120)),
            max_concurrency: 64,
        }
    }
}
