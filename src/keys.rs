//! Keys the attribute and the HTTP layer build alike.

use ratelimit_core::{Algorithm, Quota};

/// A key decided under a quota of an algorithm other than `home` (the one
/// its attribute or HTTP limit was written with: a named rule or a quota
/// expression can change it at run time) gets the suffix `~<algorithm>`:
/// each algorithm keeps state of its own shape, and a key never meets
/// another algorithm's state. Escaped values never hold `~`, so no value can
/// forge the suffix.
pub(crate) fn keep_apart(key: &mut String, home: Algorithm, quota: &Quota) {
    if quota.algorithm() != home {
        key.push('~');
        key.push_str(quota.algorithm().name());
    }
}
