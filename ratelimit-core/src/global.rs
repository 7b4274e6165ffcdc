//! The limiter `#[rate_limit]` uses when the attribute names none.

use once_cell::sync::OnceCell;

use crate::error::Error;
use crate::limiter::Limiter;

static GLOBAL: OnceCell<Limiter> = OnceCell::new();

/// Sets the limiter that `#[rate_limit]` uses by default. Call it once at
/// start-up, before the first rate-limited call.
///
/// Fails with [`Error::AlreadyInstalled`] when a limiter is already installed,
/// or when a rate-limited call already ran and so fixed the default (the
/// memory backend): limits must not silently move between backends.
///
/// ```
/// use ratelimit_core::{install, Limiter};
///
/// install(Limiter::memory())?;
/// assert!(install(Limiter::memory()).is_err());
/// # Ok::<(), ratelimit_core::Error>(())
/// ```
pub fn install(limiter: Limiter) -> Result<(), Error> {
    GLOBAL.set(limiter).map_err(|_| Error::AlreadyInstalled)
}

/// The installed limiter; before any [`install`], the memory backend, with
/// one warning that says so.
pub fn global() -> &'static Limiter {
    GLOBAL.get_or_init(|| {
        tracing::warn!(
            "no rate limiter installed; using the in-process memory backend, which limits each \
             process on its own; call `ratelimit::install(Limiter::from_env()?)` at start-up"
        );
        Limiter::memory()
    })
}
