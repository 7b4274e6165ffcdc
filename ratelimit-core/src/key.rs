//! Keys built from user-supplied values, safely.
//!
//! A key template such as `order:submit:<user_id>` is literal text with values
//! spliced in. Every value is escaped so that:
//! - two different values never produce the same key: every byte outside
//!   `[A-Za-z0-9_.-]` becomes `%XX`, and the `#[rate_limit]` attribute requires
//!   a separator outside that set (and `%`) on each side of a placeholder
//!   (or the template's start or end), so that a key splits into its text and
//!   its values one way only;
//! - an empty value is written `%_`, never as nothing: `"{<user>}:burst"`
//!   keeps its hash tag for an empty user (Redis Cluster reads `{}` as no
//!   tag);
//! - a value can never add a separator or a Redis Cluster hash tag (`{`, `}`):
//!   those are always escaped;
//! - a value can never make a key grow without bound: a value whose escaped
//!   form exceeds [`MAX_VALUE_LEN`] bytes is replaced by `%_` and 32 hex digits
//!   of its SHA-256, a form no escaped value can take.

use std::fmt::{self, Write as _};

use sha2::{Digest, Sha256};

use crate::quota::{Algorithm, Quota};

/// How an empty value is written: as the start of a digest, a form no
/// escaped value takes, and too short to be a digest.
const EMPTY: &str = "%_";

/// The longest escaped value kept as is; longer ones become a 34-byte digest.
pub const MAX_VALUE_LEN: usize = 64;

/// The longest value of a `key = <expression>` kept as is.
pub const MAX_WHOLE_KEY_LEN: usize = 256;

/// Whether `c` stands for itself in an escaped value. Any other character in
/// a template between two placeholders separates them unambiguously.
pub const fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-'
}

/// Gives a key decided under a quota of an algorithm other than `home`
/// (the one its attribute or HTTP limit was written with: a named rule or a
/// quota expression can change it at run time) the suffix `~<algorithm>`:
/// each algorithm keeps state of its own shape, and a key never meets
/// another algorithm's state. Escaped values never hold `~`, so no value
/// can forge the suffix. [`Limiter::reset`](crate::Limiter::reset) resets a
/// key's variants too.
#[doc(hidden)]
pub fn __keep_apart(key: &mut String, home: Algorithm, quota: &Quota) {
    if quota.algorithm() != home {
        key.push('~');
        key.push_str(quota.algorithm().name());
    }
}

/// The keys `__keep_apart` can make of `key`, one per algorithm.
pub(crate) fn algorithm_variants(key: &str) -> impl Iterator<Item = String> + '_ {
    Algorithm::ALL
        .into_iter()
        .map(move |algorithm| format!("{key}~{}", algorithm.name()))
}

/// Whether `c` can appear in an escaped value: the value characters, plus
/// `%`, which starts escapes, digests and the empty value. A separator, in
/// a template beside a placeholder or after a key prefix, must be none of
/// these.
#[doc(hidden)]
pub const fn __in_escaped_value(c: char) -> bool {
    is_value_char(c) || c == '%'
}

/// Builds one key from literal text and escaped values.
///
/// ```
/// use ratelimit_core::KeyBuilder;
///
/// let mut key = KeyBuilder::new();
/// key.push_literal("order:submit:");
/// key.push_value(&"alice:{admin}");
/// assert_eq!(key.finish(), "order:submit:alice%3A%7Badmin%7D");
/// ```
#[derive(Debug)]
pub struct KeyBuilder {
    key: String,
}

/// Room for most keys, so that building one allocates once.
const KEY_CAPACITY: usize = 64;

impl Default for KeyBuilder {
    fn default() -> Self {
        Self {
            key: String::with_capacity(KEY_CAPACITY),
        }
    }
}

impl KeyBuilder {
    /// An empty key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends template text as written.
    pub fn push_literal(&mut self, text: &str) {
        self.key.push_str(text);
    }

    /// Appends a value, escaped (see the module documentation).
    pub fn push_value<T: fmt::Display + ?Sized>(&mut self, value: &T) {
        push_escaped_value(&mut self.key, value, Escaping::Value);
    }

    /// Appends the whole key given by `key = <expression>`: `%`, `{` and `}` are
    /// escaped so the value cannot choose a Redis Cluster hash tag, `~` so it
    /// cannot spell a suffix the attribute adds (`key~gcra`, `key~2`), control
    /// characters (`char::is_control`, NEL among them) and the line and
    /// paragraph separators U+2028 and U+2029 so it cannot write lines of its
    /// own in logs; an empty value is written `%_`, as an empty template value
    /// is, and a value longer than [`MAX_WHOLE_KEY_LEN`] is replaced by its
    /// digest. Other characters stand for themselves.
    ///
    /// The expression itself must give different callers different values:
    /// `format!("{a}/{b}")` gives `("x/y", "z")` and `("x", "y/z")` one key.
    /// A template (`"<a>/<b>"`) escapes each value and cannot collide.
    ///
    /// ```
    /// use ratelimit_core::KeyBuilder;
    ///
    /// let mut key = KeyBuilder::new();
    /// key.push_whole(&"tenant{7}~gcra");
    /// assert_eq!(key.finish(), "tenant%7B7%7D%7Egcra");
    /// ```
    pub fn push_whole<T: fmt::Display + ?Sized>(&mut self, value: &T) {
        push_escaped_value(&mut self.key, value, Escaping::Whole);
    }

    /// The finished key.
    pub fn finish(self) -> String {
        self.key
    }
}

/// Escapes one value into `out`.
pub fn escape_value(value: &str, out: &mut String) {
    push_escaped_value(out, value, Escaping::Value);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Escaping {
    /// A template placeholder: everything outside the value characters.
    Value,
    /// A whole key: only what could choose a hash tag or a suffix, or
    /// break a log line, and `%` itself.
    Whole,
}

/// Formats `value` straight into `out`, escaped, with no copy of the value;
/// when the escaped form outgrows its bound, replaces it by the digest of
/// the value's `Display` output.
fn push_escaped_value<T: fmt::Display + ?Sized>(out: &mut String, value: &T, escaping: Escaping) {
    let start = out.len();
    let max = match escaping {
        Escaping::Value => MAX_VALUE_LEN,
        Escaping::Whole => MAX_WHOLE_KEY_LEN,
    };
    let mut escaper = Escaper {
        out,
        start,
        max,
        escaping,
        too_long: false,
    };
    // Writing into a String cannot fail; a Display impl that errors leaves
    // what it wrote so far, which is still escaped.
    let _ = write!(escaper, "{value}");
    if escaper.too_long {
        out.truncate(start);
        let mut hasher = Hasher(Sha256::new());
        let _ = write!(hasher, "{value}");
        push_digest(hasher.0.finalize().as_slice(), out);
    }
    if out.len() == start {
        out.push_str(EMPTY);
    }
}

struct Escaper<'a> {
    out: &'a mut String,
    start: usize,
    max: usize,
    escaping: Escaping,
    too_long: bool,
}

/// Whether `c` stands for itself in a whole key (`key = <expression>`).
/// `%` starts escapes; `{` and `}` would choose a Redis Cluster hash tag;
/// `~` separates the suffixes the attribute adds to keep apart state of
/// several algorithms or stacked limits. Control characters (ASCII's, DEL,
/// and U+0080 to U+009F, NEL among them) and the line and paragraph
/// separators are escaped too: a key is written in logs, where a line break
/// would start a line of the caller's choosing.
fn is_whole_key_char(c: char) -> bool {
    !matches!(c, '%' | '{' | '}' | '~' | '\u{2028}' | '\u{2029}') && !c.is_control()
}

impl Escaper<'_> {
    /// Whether the byte `b` stands for itself in a run copied at once. Every
    /// byte of a character beyond ASCII is 0x80 or above, so a run of plain
    /// bytes never ends inside a character; such characters are looked at
    /// one at a time ([`Escaper::plain_char`]).
    fn plain(&self, b: u8) -> bool {
        b.is_ascii() && self.plain_char(char::from(b))
    }

    /// Whether the character `c` stands for itself: for a value, only the
    /// value characters; for a whole key, those [`is_whole_key_char`] keeps.
    fn plain_char(&self, c: char) -> bool {
        match self.escaping {
            Escaping::Value => is_value_char(c),
            Escaping::Whole => is_whole_key_char(c),
        }
    }
}

impl fmt::Write for Escaper<'_> {
    /// Copies each run of ASCII bytes that stand for themselves at once, and
    /// writes the characters between them one at a time, escaped unless they
    /// stand for themselves. Once the escaped value outgrows its bound, it is
    /// dropped for a digest, so the rest is not written.
    fn write_str(&mut self, mut text: &str) -> fmt::Result {
        while !text.is_empty() && !self.too_long {
            let run = text
                .bytes()
                .position(|b| !self.plain(b))
                .unwrap_or(text.len());
            if self.out.len() - self.start + run > self.max {
                self.too_long = true;
                break;
            }
            self.out.push_str(&text[..run]);
            text = &text[run..];
            if let Some(c) = text.chars().next() {
                if self.plain_char(c) {
                    self.out.push(c);
                } else {
                    push_escaped(self.out, c);
                }
                text = &text[c.len_utf8()..];
                self.too_long = self.out.len() - self.start > self.max;
            }
        }
        Ok(())
    }
}

/// Feeds a value's `Display` output to SHA-256 without collecting it.
struct Hasher(Sha256);

impl fmt::Write for Hasher {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        self.0.update(text.as_bytes());
        Ok(())
    }
}

fn push_escaped(out: &mut String, c: char) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut buf = [0u8; 4];
    for &b in c.encode_utf8(&mut buf).as_bytes() {
        out.push('%');
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0xF)] as char);
    }
}

/// `%_` then 128 bits of the SHA-256 `digest` in lowercase hex. Escaping
/// writes `%` only before two uppercase hex digits, so this form never equals
/// an escaped value.
fn push_digest(digest: &[u8], out: &mut String) {
    out.push_str("%_");
    for b in &digest[..16] {
        let _ = write!(out, "{b:02x}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn escaped(value: &str) -> String {
        let mut out = String::new();
        escape_value(value, &mut out);
        out
    }

    #[test]
    fn plain_values_stand_for_themselves() {
        assert_eq!(escaped("42"), "42");
        assert_eq!(escaped("a-b_c.d"), "a-b_c.d");
        assert_eq!(
            escaped(""),
            "%_",
            "never nothing: it would empty a hash tag"
        );
    }

    #[test]
    fn separators_and_hash_tags_are_escaped() {
        assert_eq!(escaped("a:b"), "a%3Ab");
        assert_eq!(escaped("{tag}"), "%7Btag%7D");
        assert_eq!(escaped("100%"), "100%25");
        assert_eq!(escaped("é"), "%C3%A9");
    }

    #[test]
    fn long_values_become_a_fixed_size_digest() {
        let long = "x".repeat(10_000);
        let key = escaped(&long);
        assert_eq!(key.len(), 34);
        assert!(key.starts_with("%_"));
        assert_ne!(escaped(&"x".repeat(10_001)), key);
        // The longest value kept as is.
        assert_eq!(
            escaped(&"y".repeat(MAX_VALUE_LEN)),
            "y".repeat(MAX_VALUE_LEN)
        );
    }

    #[test]
    fn whole_keys_cannot_choose_a_hash_tag() {
        let mut key = KeyBuilder::new();
        key.push_whole("tenant:{7}:100%");
        assert_eq!(key.finish(), "tenant:%7B7%7D:100%25");
        let mut key = KeyBuilder::new();
        key.push_whole(&"k".repeat(1_000));
        assert_eq!(key.finish().len(), 34);
    }

    /// A key is written in logs (a sampled denial, a backend's error): a
    /// newline in a whole key would start a log line of the caller's choice.
    #[test]
    fn whole_keys_write_no_control_character() {
        let mut key = KeyBuilder::new();
        key.push_whole("evil\n2025-01-01T00:00:00Z INFO admin logged in\r\t\u{7f}é");
        assert_eq!(
            key.finish(),
            "evil%0A2025-01-01T00:00:00Z INFO admin logged in%0D%09%7Fé"
        );
    }

    /// Unicode has line breaks beyond ASCII: NEL (U+0085, a control
    /// character) and the line and paragraph separators (U+2028, U+2029),
    /// which log viewers may break lines at. Other characters beyond ASCII
    /// stand for themselves.
    #[test]
    fn whole_keys_write_no_unicode_line_break() {
        let mut key = KeyBuilder::new();
        key.push_whole("a\u{85}b\u{2028}c\u{2029}d\u{9f}e\u{a0}é€");
        assert_eq!(key.finish(), "a%C2%85b%E2%80%A8c%E2%80%A9d%C2%9Fe\u{a0}é€");
    }

    /// An empty whole key is written `%_`, as an empty template value is,
    /// never as nothing: the bare prefix, and `{}` in no tag.
    #[test]
    fn an_empty_whole_key_is_written_as_an_empty_value() {
        let mut key = KeyBuilder::new();
        key.push_whole("");
        assert_eq!(key.finish(), "%_");
        for value in ["%_", "%", "_"] {
            let mut key = KeyBuilder::new();
            key.push_whole(value);
            assert_ne!(key.finish(), "%_", "{value:?}");
        }
    }

    /// Redis Cluster reads `{}` as no hash tag: an empty value written as
    /// nothing scattered `"{<user>}:burst"` and `"{<user>}:sustained"` over
    /// two slots.
    #[test]
    fn an_empty_value_keeps_its_hash_tag() {
        let keys = ["}:burst", "}:sustained"].map(|after| build(&["{", after], &[String::new()]));
        assert_eq!(keys, ["{%_}:burst", "{%_}:sustained"]);
    }

    fn build(template: &[&str], values: &[String]) -> String {
        let mut key = KeyBuilder::new();
        for (i, literal) in template.iter().enumerate() {
            key.push_literal(literal);
            if let Some(v) = values.get(i) {
                key.push_value(v.as_str());
            }
        }
        key.finish()
    }

    /// Escaping one character at a time, the plainest way: the model that
    /// the escaper, which copies runs of plain bytes at once, must match.
    fn escaped_one_char_at_a_time(value: &str, escaping: Escaping) -> String {
        let max = match escaping {
            Escaping::Value => MAX_VALUE_LEN,
            Escaping::Whole => MAX_WHOLE_KEY_LEN,
        };
        let mut out = String::new();
        for c in value.chars() {
            let plain = match escaping {
                Escaping::Value => is_value_char(c),
                Escaping::Whole => {
                    !matches!(c, '%' | '{' | '}' | '~' | '\u{2028}' | '\u{2029}') && !c.is_control()
                }
            };
            if plain {
                out.push(c);
            } else {
                push_escaped(&mut out, c);
            }
        }
        if out.len() > max {
            out.clear();
            push_digest(Sha256::digest(value.as_bytes()).as_slice(), &mut out);
        }
        if out.is_empty() {
            out.push_str(EMPTY);
        }
        out
    }

    /// A value whose `Display` writes it in pieces, as a struct's does.
    struct Pieces(Vec<String>);

    impl fmt::Display for Pieces {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.iter().try_for_each(|piece| f.write_str(piece))
        }
    }

    /// Values whose escaped form ends just short of, at, or just past the
    /// bound, by a plain character or an escaped one.
    #[test]
    fn the_escaper_cuts_at_the_bound_as_one_character_at_a_time_does() {
        for escaping in [Escaping::Value, Escaping::Whole] {
            let max = match escaping {
                Escaping::Value => MAX_VALUE_LEN,
                Escaping::Whole => MAX_WHOLE_KEY_LEN,
            };
            for len in max - 4..=max + 2 {
                for last in ["", "a", "{", "é", "~", "\n", "\u{85}", "\u{2028}"] {
                    let value = format!("{}{last}", "x".repeat(len));
                    let mut out = String::new();
                    push_escaped_value(&mut out, value.as_str(), escaping);
                    assert_eq!(out, escaped_one_char_at_a_time(&value, escaping), "{value}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn the_escaper_matches_escaping_one_character_at_a_time(
            pieces in proptest::collection::vec("([a-zA-Z0-9_.-]{0,40}|[%{}~:/ é€😀\u{85}\u{2028}\u{2029}\n]{0,3}|.{0,10}){0,4}", 0..6),
            prefix in "[a-z:]{0,8}",
        ) {
            let whole: String = pieces.concat();
            for escaping in [Escaping::Value, Escaping::Whole] {
                let mut out = prefix.clone();
                push_escaped_value(&mut out, &Pieces(pieces.clone()), escaping);
                let expected = format!("{prefix}{}", escaped_one_char_at_a_time(&whole, escaping));
                prop_assert_eq!(out, expected);
            }
        }

        #[test]
        fn different_values_never_make_the_same_key(
            a in proptest::collection::vec(".{0,80}", 3),
            b in proptest::collection::vec(".{0,80}", 3),
            sep in "[:/|# {}]",
        ) {
            let template = ["t", sep.as_str(), sep.as_str(), ""];
            prop_assume!(a != b);
            prop_assert_ne!(build(&template, &a), build(&template, &b));
        }

        /// A whole key escapes `%` and writes every other escape as `%XX`,
        /// the empty value as `%_` and a digest as `%_` and 32 hex digits:
        /// it reads back one way only.
        #[test]
        fn different_whole_keys_never_make_the_same_key(
            a in "([a-z%_{}~]|\\PC|\\pC|\u{2028}){0,12}",
            b in "([a-z%_{}~]|\\PC|\\pC|\u{2028}){0,12}",
        ) {
            prop_assume!(a != b);
            let whole = |value: &str| {
                let mut key = KeyBuilder::new();
                key.push_whole(value);
                key.finish()
            };
            prop_assert_ne!(whole(&a), whole(&b));
        }

        #[test]
        fn escaped_values_never_contain_a_separator_or_a_hash_tag(v in ".{0,100}") {
            let e = escaped(&v);
            prop_assert!(e.len() <= MAX_VALUE_LEN.max(34));
            prop_assert!(e.chars().all(__in_escaped_value), "{}", e);
        }

        #[test]
        fn escaping_is_injective_on_near_collisions(v in "[a%:{}_0-9A-F]{0,70}", w in "[a%:{}_0-9A-F]{0,70}") {
            prop_assume!(v != w);
            prop_assert_ne!(escaped(&v), escaped(&w));
        }
    }
}
