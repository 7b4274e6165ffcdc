//! The header fields of draft-ietf-httpapi-ratelimit-headers-11 and the
//! older `X-RateLimit-*` ones.

use std::fmt::Write as _;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// The largest Integer a Structured Field can carry (RFC 9651, section 3.3.1).
pub(crate) const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

pub(crate) fn ratelimit_policy() -> HeaderName {
    HeaderName::from_static("ratelimit-policy")
}

pub(crate) fn ratelimit() -> HeaderName {
    HeaderName::from_static("ratelimit")
}

pub(crate) fn x_ratelimit_limit() -> HeaderName {
    HeaderName::from_static("x-ratelimit-limit")
}

pub(crate) fn x_ratelimit_remaining() -> HeaderName {
    HeaderName::from_static("x-ratelimit-remaining")
}

pub(crate) fn x_ratelimit_reset() -> HeaderName {
    HeaderName::from_static("x-ratelimit-reset")
}

/// Whole seconds, rounded up, saturating.
pub(crate) fn ceil_secs(duration: Duration) -> u64 {
    let secs = duration.as_secs();
    if duration.subsec_nanos() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    }
}

/// Whether `name` can be a policy name: a non-empty Structured Field String,
/// that is printable ASCII.
pub(crate) fn is_valid_policy_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (0x20..=0x7E).contains(&b))
}

/// Panics with a message saying what a policy name may be.
pub(crate) fn check_policy_name(name: &str) {
    assert!(
        is_valid_policy_name(name),
        "invalid rate limit policy name {name:?}; a policy name is non-empty printable ASCII, \
         as it is sent in the `RateLimit-Policy` and `RateLimit` header fields"
    );
}

/// `name` as a Structured Field String: quoted, with `"` and `\` escaped.
fn push_sf_string(out: &mut String, name: &str) {
    out.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

fn header_value(text: String) -> HeaderValue {
    // Built only from printable ASCII (checked policy names and digits).
    HeaderValue::try_from(text).expect("rate limit header fields are printable ASCII")
}

/// `"name";q=<quota>` and `;w=<window seconds>` when known.
pub(crate) fn policy_value(name: &str, quota: u64, window_secs: Option<u64>) -> HeaderValue {
    let mut text = String::new();
    push_sf_string(&mut text, name);
    let _ = write!(text, ";q={}", quota.min(SF_INTEGER_MAX));
    if let Some(w) = window_secs {
        // The draft's window is a non-zero Integer.
        let _ = write!(text, ";w={}", w.clamp(1, SF_INTEGER_MAX));
    }
    header_value(text)
}

/// `"name";r=<remaining>` and `;t=<seconds>` when known.
pub(crate) fn ratelimit_value(name: &str, remaining: u64, reset_secs: Option<u64>) -> HeaderValue {
    let mut text = String::new();
    push_sf_string(&mut text, name);
    let _ = write!(text, ";r={}", remaining.min(SF_INTEGER_MAX));
    if let Some(t) = reset_secs {
        let _ = write!(text, ";t={}", t.min(SF_INTEGER_MAX));
    }
    header_value(text)
}

/// Sets the `X-RateLimit-*` fields unless the response already reports a
/// limit with no more remaining (set by an inner layer): these fields take
/// one value, so the most constrained limit wins. `remaining` is `None` when
/// unknown (a fallback decision), and then only the limit is set, if no
/// other layer set the fields.
pub(crate) fn set_legacy(
    headers: &mut HeaderMap,
    limit: u64,
    remaining: Option<u64>,
    reset_secs: Option<u64>,
) {
    let existing = headers
        .get(x_ratelimit_remaining())
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match (existing, remaining) {
        (Some(existing), Some(remaining)) if existing <= remaining => return,
        (Some(_), None) => return,
        (None, None) if headers.contains_key(x_ratelimit_limit()) => return,
        _ => {}
    }
    headers.insert(x_ratelimit_limit(), HeaderValue::from(limit));
    match remaining {
        Some(remaining) => {
            headers.insert(x_ratelimit_remaining(), HeaderValue::from(remaining));
        }
        None => {
            headers.remove(x_ratelimit_remaining());
        }
    }
    match reset_secs {
        Some(reset) => {
            headers.insert(x_ratelimit_reset(), HeaderValue::from(reset));
        }
        None => {
            headers.remove(x_ratelimit_reset());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up_and_saturate() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_millis(480)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1_200)), 2);
        assert_eq!(ceil_secs(Duration::from_nanos(60_000_000_001)), 61);
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn policy_names_are_structured_field_strings() {
        assert_eq!(
            policy_value("per-ip", 10, Some(60)),
            r#""per-ip";q=10;w=60"#
        );
        assert_eq!(policy_value(r#"a"b\c"#, 1, None), r#""a\"b\\c";q=1"#);
        assert_eq!(ratelimit_value("x", 0, Some(3)), r#""x";r=0;t=3"#);
        assert_eq!(ratelimit_value("x", 4, None), r#""x";r=4"#);
        assert!(!is_valid_policy_name(""));
        assert!(!is_valid_policy_name("tab\there"));
        assert!(!is_valid_policy_name("café"));
        assert!(is_valid_policy_name("orders: submit"));
    }

    #[test]
    fn integers_are_clamped_to_what_structured_fields_allow() {
        assert_eq!(
            policy_value("p", 1 << 52, Some(0)),
            r#""p";q=999999999999999;w=1"#
        );
        assert_eq!(
            ratelimit_value("p", 0, Some(u64::MAX)),
            r#""p";r=0;t=999999999999999"#
        );
    }

    #[test]
    fn legacy_fields_report_the_most_constrained_limit() {
        let mut headers = HeaderMap::new();
        set_legacy(&mut headers, 10, Some(3), Some(5));
        set_legacy(&mut headers, 100, Some(50), Some(1));
        assert_eq!(headers[x_ratelimit_limit()], "10");
        assert_eq!(headers[x_ratelimit_remaining()], "3");
        assert_eq!(headers[x_ratelimit_reset()], "5");
        set_legacy(&mut headers, 2, Some(0), None);
        assert_eq!(headers[x_ratelimit_limit()], "2");
        assert_eq!(headers[x_ratelimit_remaining()], "0");
        assert!(headers.get(x_ratelimit_reset()).is_none());
        // An unknown remaining never replaces a known one.
        set_legacy(&mut headers, 7, None, None);
        assert_eq!(headers[x_ratelimit_limit()], "2");
        let mut headers = HeaderMap::new();
        set_legacy(&mut headers, 7, None, None);
        assert_eq!(headers[x_ratelimit_limit()], "7");
        assert!(headers.get(x_ratelimit_remaining()).is_none());
    }
}
