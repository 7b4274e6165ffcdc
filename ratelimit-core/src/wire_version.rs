//! The version of the format of a call of the limiter's function (its
//! arguments, its reply and the values it stores), which the native module
//! decides too: the limiter sends it first in every call.

/// The version of the call's format (the arguments and the reply of
/// `scripts/entry.lua`). The limiter sends it first; a module of another
/// version refuses the call, and the limiter uses the function instead.
/// Changed with every change of the scripts' arguments, replies or values
/// (a test holds the scripts' hash to `WIRE_SCRIPTS_SHA1`).
pub const WIRE_VERSION: u64 = 7;

/// The SHA-1 of the scripts this version's format is that of; see
/// [`WIRE_VERSION`].
#[cfg(all(test, feature = "redis"))]
pub(crate) const WIRE_SCRIPTS_SHA1: &str = "8f32cadf863a2f08324de681e05852a06d1859ec";
