//! The limiter `#[rate_limit]` uses when the attribute names none.

use once_cell::sync::OnceCell;

use crate::error::Error;
use crate::limiter::Limiter;

static GLOBAL: OnceCell<Limiter> = OnceCell::new();

/// Sets the limiter that `#[rate_limit]` uses by default. Call it once at
/// start-up, before the first rate-limited call.
///
/// Fails with [`Error::AlreadyInstalled`] when a limiter is already installed,
/// or once the default is fixed, which the first rate-limited call does, and
/// so does any call of [`global`] (`global().stats()` in a metrics endpoint,
/// say): limits must not silently move between backends.
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

/// The installed limiter; before any [`install`], what
/// [`Limiter::from_env`] gives: Redis (or Sentinel) when the environment
/// names one, so a forgotten `install` never limits each process on its own
/// while `REDIS_URL` says the limit is shared; else the memory backend, with
/// one warning that says so. An environment that names a Redis wrongly (a
/// URL that does not parse) falls back to memory with a warning on standard
/// error as well, naming the fix.
pub fn global() -> &'static Limiter {
    GLOBAL.get_or_init(|| match Limiter::from_env() {
        Ok(limiter) if limiter.backend_name() != "memory" => {
            tracing::info!(
                backend = limiter.backend_name(),
                "no rate limiter installed; using the one the environment names (REDIS_URL or \
                 REDIS_SENTINELS)"
            );
            limiter
        }
        Ok(limiter) => {
            tracing::warn!(
                "no rate limiter installed and no REDIS_URL; using the in-process memory \
                 backend, which limits each process on its own; call \
                 `ratelimit::install(Limiter::from_env()?)` at start-up"
            );
            limiter
        }
        Err(error) => {
            let message = format!(
                "the environment names a Redis the rate limiter cannot use ({error}); limiting \
                 each process on its own in memory: fix it and restart"
            );
            tracing::error!("{message}");
            eprintln!("ratelimit: {message}");
            Limiter::memory()
        }
    })
}
