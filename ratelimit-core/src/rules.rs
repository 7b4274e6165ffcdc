//! Named rules whose quotas can change while the service runs, and the text
//! form a rule is written in (in a Redis hash, a config file, an admin API).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::quota::{Algorithm, Quota, QuotaError, Rate};

/// The named rules of a [`Limiter`](crate::Limiter): quotas the running
/// service can change, looked up by name on every call.
///
/// `#[rate_limit(rule = "order_submit", capacity = 10, rate = 2, ...)]` asks
/// its limiter's rules for `order_submit` at each call, and uses the
/// attribute's own numbers while no rule of that name is set. A rule can hold
/// any [`Quota`], of any algorithm.
///
/// Reading is lock-free (one atomic load, then a hash lookup), and each
/// change is atomic: a call sees the old quota or the new one, never a mix of
/// the two. Clones share the same rules, as clones of a limiter do.
///
/// ```
/// use ratelimit_core::{Limiter, Quota};
///
/// let limiter = Limiter::memory();
/// let rules = limiter.rules();
/// assert_eq!(rules.get("order_submit"), None);
///
/// rules.set("order_submit", Quota::per_minute(100)?);
/// rules.set_text("search", "algorithm=sliding_window limit=20 window=10s")?;
/// assert_eq!(rules.get("order_submit").map(|q| q.capacity()), Some(100));
/// assert_eq!(rules.names(), ["order_submit", "search"]);
///
/// // Removed: the attribute's own numbers apply again.
/// assert!(rules.remove("order_submit").is_some());
/// assert_eq!(rules.get("order_submit"), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct Rules {
    /// Replaced whole on every change: writes are rare, and a reader holds
    /// one consistent map for the duration of its lookup.
    shared: Arc<ArcSwap<HashMap<String, Quota>>>,
    /// Counts the changes that changed a rule: the deny cache answers only
    /// from what it learned since the last (see [`changes`](Self::changes)).
    changes: Arc<AtomicU64>,
}

impl Rules {
    /// An empty set of rules, shared by its clones.
    pub fn new() -> Self {
        Self::default()
    }

    /// The quota of the rule `name`, if one is set.
    #[inline]
    pub fn get(&self, name: &str) -> Option<Quota> {
        self.shared.load().get(name).copied()
    }

    /// Sets the rule `name` to `quota`; returns the quota it replaces.
    pub fn set(&self, name: impl Into<String>, quota: Quota) -> Option<Quota> {
        let name = name.into();
        let old = self.shared.rcu(|rules| {
            let mut rules = HashMap::clone(rules);
            rules.insert(name.clone(), quota);
            rules
        });
        let old = old.get(&name).copied();
        if old != Some(quota) {
            self.changed();
        }
        old
    }

    /// Sets the rule `name` from its [text form](RuleError); on an invalid
    /// text the rule is left as it was.
    ///
    /// ```
    /// use ratelimit_core::{Rules, RuleError};
    ///
    /// let rules = Rules::new();
    /// rules.set_text("export", "capacity=1 rate=1/h")?;
    /// let err = rules.set_text("export", "capacity=0 rate=1/h").unwrap_err();
    /// assert_eq!(err.to_string(), "capacity must be greater than 0");
    /// assert_eq!(rules.get("export").unwrap().capacity(), 1, "the old rule is kept");
    /// # Ok::<(), RuleError>(())
    /// ```
    pub fn set_text(
        &self,
        name: impl Into<String>,
        text: &str,
    ) -> Result<Option<Quota>, RuleError> {
        let quota = text.parse()?;
        Ok(self.set(name, quota))
    }

    /// Removes the rule `name`; returns the quota it had.
    pub fn remove(&self, name: &str) -> Option<Quota> {
        if !self.shared.load().contains_key(name) {
            return None;
        }
        let old = self.shared.rcu(|rules| {
            let mut rules = HashMap::clone(rules);
            rules.remove(name);
            rules
        });
        let old = old.get(name).copied();
        if old.is_some() {
            self.changed();
        }
        old
    }

    /// The names of the rules set, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.load().keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// How many rules are set.
    pub fn len(&self) -> usize {
        self.shared.load().len()
    }

    /// Whether no rule is set.
    pub fn is_empty(&self) -> bool {
        self.shared.load().is_empty()
    }

    /// Applies several changes at once (`None` removes): each look-up sees
    /// all of them or none. A check of several named rules looks each up
    /// on its own, so one made while changes land may see some rules old
    /// and some new.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn apply(&self, changes: &[(String, Option<Quota>)]) {
        if changes.is_empty() {
            return;
        }
        let old = self.shared.rcu(|rules| {
            let mut rules = HashMap::clone(rules);
            for (name, quota) in changes {
                match quota {
                    Some(quota) => rules.insert(name.clone(), *quota),
                    None => rules.remove(name),
                };
            }
            rules
        });
        // A rule source applies every rule again at each reload: only a
        // change that changed one counts.
        if changes
            .iter()
            .any(|(name, quota)| old.get(name) != quota.as_ref())
        {
            self.changed();
        }
    }

    /// Counts a change, after it landed.
    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The count of changes that changed a rule, shared by the clones. A
    /// denial the deny cache learned before a change is not answered from
    /// the cache after it: another instance may have decided the key under
    /// the changed rule meanwhile (a shorter window starts a new count),
    /// even if the rule has changed back since.
    pub(crate) fn changes(&self) -> Arc<AtomicU64> {
        self.changes.clone()
    }
}

impl fmt::Debug for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules = self.shared.load();
        let mut names: Vec<&String> = rules.keys().collect();
        names.sort_unstable();
        f.debug_map()
            .entries(names.into_iter().map(|name| (name, rules[name])))
            .finish()
    }
}

/// Whether `name` can name a rule: 1 to 128 characters among letters, digits
/// and `_ - . : /`. The attribute checks the same at compile time, and a rule
/// source ignores (and logs) any other name.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn is_valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':' | b'/'))
}

/// The options of a rule's text form, in the order they are listed.
const OPTIONS: [&str; 5] = ["algorithm", "capacity", "rate", "limit", "window"];

/// Parses a rule's text form: `name=value` options separated by spaces or
/// commas, the same options as the attribute's.
///
/// | option | value | default |
/// | --- | --- | --- |
/// | `algorithm` | `token_bucket`, `gcra`, `leaky_bucket` (these take `capacity` and `rate`), `fixed_window`, `sliding_log`, `sliding_window` (these take `limit` and `window`) | `token_bucket` |
/// | `capacity` | a whole number > 0 | |
/// | `rate` | `100/min`, `5/s`, `10/30s`, `1/500ms`...; a bare number is per second (`2`, `2.5`) | |
/// | `limit` | a whole number > 0 | |
/// | `window` | `1m`, `10s`, `1h`, `1d`, `500ms`... | |
///
/// The quota is built through [`Quota::builder`], so every check of the
/// attribute applies: a zero, a malformed rate or window, an option of the
/// other family (`window` with `gcra`), a quota too large to compute exactly.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_core::{Algorithm, Quota, Rate, RuleError};
///
/// let bucket: Quota = "capacity=10 rate=100/min".parse()?;
/// assert_eq!(bucket, Quota::new(10, Rate::per_minute(100)?)?);
///
/// let window: Quota = "algorithm=fixed_window, limit=100, window=1m".parse()?;
/// assert_eq!(window.algorithm(), Algorithm::FixedWindow);
/// assert_eq!(window.window(), Some(Duration::from_secs(60)));
///
/// let err = "algorithm=gcra capacity=10 window=1m".parse::<Quota>().unwrap_err();
/// assert_eq!(err.to_string(), "`gcra` takes `capacity` and `rate`, not `window`");
/// let err = "capacity=10 burst=5".parse::<Quota>().unwrap_err();
/// assert_eq!(err, RuleError::UnknownOption("burst".into()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl FromStr for Quota {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // Whoever can write the rules hash may store megabytes under a
        // name, which every instance reads at each reload.
        if text.len() > MAX_RULE_TEXT {
            return Err(RuleError::TooLong(text.len()));
        }
        let mut values: [Option<&str>; 5] = [None; 5];
        let parts = text
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|part| !part.is_empty());
        for part in parts {
            let (option, value) = part
                .split_once('=')
                .filter(|(option, value)| !option.is_empty() && !value.is_empty())
                .ok_or_else(|| RuleError::Malformed(quoted(part)))?;
            let index = OPTIONS
                .iter()
                .position(|known| *known == option)
                .ok_or_else(|| RuleError::UnknownOption(quoted(option)))?;
            if values[index].replace(value).is_some() {
                return Err(RuleError::DuplicateOption(OPTIONS[index]));
            }
        }
        let [algorithm, capacity, rate, limit, window] = values;
        if values.iter().all(Option::is_none) {
            return Err(RuleError::Empty);
        }
        let algorithm = match algorithm {
            Some(name) => name
                .parse::<Algorithm>()
                .map_err(|error| requoted(error, name))?,
            None => Algorithm::TokenBucket,
        };
        let mut builder = Quota::builder(algorithm);
        if let Some(value) = capacity {
            builder = builder.capacity(whole_number("capacity", value)?);
        }
        if let Some(value) = rate {
            builder = builder.rate(rate_value(value).map_err(|error| requoted(error, value))?);
        }
        if let Some(value) = limit {
            builder = builder.limit(whole_number("limit", value)?);
        }
        if let Some(value) = window {
            builder =
                builder.window(Quota::parse_window(value).map_err(|error| requoted(error, value))?);
        }
        Ok(builder.build()?)
    }
}

/// The longest text a rule may have, in bytes: the longest valid rule is
/// under a hundred.
pub(crate) const MAX_RULE_TEXT: usize = 1024;

/// A part of a rule's text as an error quotes it: escaped, so a rule read
/// from Redis cannot write lines of its own where the error is logged, and
/// cut to 64 bytes, so a huge one is not logged whole (nor escaped whole).
fn quoted(part: &str) -> String {
    const MAX: usize = 64;
    let mut escaped = String::new();
    for c in part.chars() {
        let before = escaped.len();
        escaped.extend(c.escape_debug());
        if escaped.len() > MAX {
            escaped.truncate(before);
            return format!("{escaped}… ({} bytes)", part.len());
        }
    }
    escaped
}

/// `error`, quoting `value` as [`quoted`] does where it quotes it whole.
fn requoted(error: QuotaError, value: &str) -> QuotaError {
    match error {
        QuotaError::UnknownAlgorithm(_) => QuotaError::UnknownAlgorithm(quoted(value)),
        QuotaError::InvalidRate(_) => QuotaError::InvalidRate(quoted(value)),
        QuotaError::InvalidWindow(_) => QuotaError::InvalidWindow(quoted(value)),
        other => other,
    }
}

fn whole_number(option: &'static str, value: &str) -> Result<u64, RuleError> {
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RuleError::InvalidNumber {
            option,
            value: quoted(value),
        });
    }
    value.parse().map_err(|_| QuotaError::TooLarge.into())
}

/// `100/min`, or a bare number of tokens per second as in the attribute
/// (both are [`Rate`]'s strings).
fn rate_value(value: &str) -> Result<Rate, QuotaError> {
    value.parse()
}

/// Why a rule's text form does not parse. The text form is `name=value`
/// options separated by spaces or commas, such as
/// `algorithm=token_bucket capacity=10 rate=100/min` or
/// `algorithm=fixed_window limit=100 window=1m`; see
/// [`Quota`'s `FromStr`](Quota#impl-FromStr-for-Quota).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// No option at all.
    #[error(
        "empty rule; write options such as `capacity=10 rate=100/min` or \
         `algorithm=fixed_window limit=100 window=1m`"
    )]
    Empty,
    /// A part that is not `name=value`.
    #[error(
        "`{0}` is not an option; write `name=value` with no spaces around `=`, such as `capacity=10`"
    )]
    Malformed(String),
    /// An option that does not exist.
    #[error(
        "unknown option `{0}`; expected one of `algorithm`, `capacity`, `rate`, `limit`, `window`"
    )]
    UnknownOption(String),
    /// An option given twice.
    #[error("duplicate option `{0}`; give each option once")]
    DuplicateOption(&'static str),
    /// A `capacity` or `limit` that is not a whole number.
    #[error("invalid `{option}` value `{value}`; expected a whole number greater than 0")]
    InvalidNumber {
        /// The option.
        option: &'static str,
        /// The value as written.
        value: String,
    },
    /// The options do not make a valid quota: an unknown algorithm, a
    /// malformed rate or window, a zero, an option the algorithm does not
    /// take or a missing one.
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// A text longer than any rule (1,024 bytes), of this many bytes.
    #[error(
        "a rule of {0} bytes; a rule is at most 1024 bytes, such as `capacity=10 rate=100/min`"
    )]
    TooLong(usize),
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A change that changes a rule is counted; one that sets a rule to
    /// what it is (a rule source applying every rule again at each reload)
    /// is not: each count makes the deny cache ask Redis again.
    #[test]
    fn only_changes_that_change_a_rule_are_counted() {
        let rules = Rules::new();
        let changes = rules.changes();
        let count = || changes.load(Ordering::SeqCst);
        let quota = Quota::per_minute(10).unwrap();
        rules.set("a", quota);
        assert_eq!(count(), 1);
        rules.set("a", quota);
        rules.apply(&[("a".to_owned(), Some(quota))]);
        assert!(rules.remove("b").is_none());
        assert_eq!(count(), 1, "nothing changed");
        rules.apply(&[("a".to_owned(), Some(Quota::per_minute(5).unwrap()))]);
        assert_eq!(count(), 2);
        rules.remove("a");
        assert_eq!(count(), 3);
        assert_eq!(
            rules.clone().changes().load(Ordering::SeqCst),
            3,
            "shared by clones"
        );
    }

    /// A rule's text comes from Redis, where anyone who can write the hash
    /// writes it: its errors quote it escaped and cut.
    #[test]
    fn errors_quote_a_rules_text_escaped_and_cut() {
        let forged = "capacity=10\u{1b}[2K rate=1/s".parse::<Quota>();
        assert_eq!(
            forged.unwrap_err().to_string(),
            "invalid `capacity` value `10\\u{1b}[2K`; expected a whole number greater than 0"
        );
        for huge in [
            format!("burst={}", "x".repeat(5_000_000)),
            format!("capacity=1 rate={}", "x".repeat(100_000)),
            format!("algorithm={}", "x".repeat(100_000)),
            format!(
                "algorithm=fixed_window limit=1 window={}",
                "x".repeat(100_000)
            ),
        ] {
            let message = huge.parse::<Quota>().unwrap_err().to_string();
            assert!(
                message.len() < 300,
                "{} bytes: {}",
                message.len(),
                &message[..80]
            );
        }
        let escape = "capacity=1 rate=1\u{1b}[2K/s".parse::<Quota>();
        assert!(
            !escape.unwrap_err().to_string().contains('\u{1b}'),
            "an escape character is quoted escaped"
        );
    }

    fn parse(text: &str) -> Result<Quota, RuleError> {
        text.parse()
    }

    #[test]
    fn every_algorithm_has_a_text_form() {
        let cases = [
            (
                "capacity=10 rate=100/min",
                Quota::token_bucket(10, Rate::per_minute(100).unwrap()),
            ),
            (
                "algorithm=gcra capacity=5 rate=2",
                Quota::gcra(5, Rate::per_second(2).unwrap()),
            ),
            (
                "  algorithm=leaky_bucket,capacity=3 , rate=2.5\n",
                Quota::leaky_bucket(3, "2.5/s".parse().unwrap()),
            ),
            (
                "algorithm=fixed_window limit=100 window=1m",
                Quota::fixed_window(100, Duration::from_secs(60)),
            ),
            (
                "window=500ms limit=7 algorithm=sliding_log",
                Quota::sliding_log(7, Duration::from_millis(500)),
            ),
            (
                "algorithm=sliding_window limit=1000 window=1d",
                Quota::sliding_window(1_000, Duration::from_secs(86_400)),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), Ok(expected.unwrap()), "{text:?}");
        }
    }

    #[test]
    fn malformed_rules_say_what_is_wrong() {
        let cases: [(&str, RuleError); 12] = [
            ("", RuleError::Empty),
            (" , ", RuleError::Empty),
            ("capacity", RuleError::Malformed("capacity".into())),
            ("capacity=", RuleError::Malformed("capacity=".into())),
            ("capacity = 10", RuleError::Malformed("capacity".into())),
            ("burst=5", RuleError::UnknownOption("burst".into())),
            (
                "capacity=1 capacity=2 rate=1",
                RuleError::DuplicateOption("capacity"),
            ),
            (
                "capacity=-1 rate=1",
                RuleError::InvalidNumber {
                    option: "capacity",
                    value: "-1".into(),
                },
            ),
            ("capacity=0 rate=1/s", QuotaError::ZeroCapacity.into()),
            (
                "capacity=1 rate=fast",
                QuotaError::InvalidRate("fast".into()).into(),
            ),
            (
                "algorithm=fixed limit=1 window=1s",
                QuotaError::UnknownAlgorithm("fixed".into()).into(),
            ),
            (
                "capacity=99999999999999999999 rate=1/s",
                QuotaError::TooLarge.into(),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), Err(expected), "{text:?}");
        }
        assert_eq!(
            parse("algorithm=fixed_window limit=5")
                .unwrap_err()
                .to_string(),
            "`fixed_window` needs `window`; it takes `limit` and `window`"
        );
        assert_eq!(
            parse("capacity=5 rate=1/s window=1m")
                .unwrap_err()
                .to_string(),
            "`token_bucket` takes `capacity` and `rate`, not `window`"
        );
        assert!(matches!(
            parse("algorithm=sliding_log limit=5 window=1500us"),
            Err(RuleError::Quota(QuotaError::InvalidWindow(_)))
        ));
    }

    #[test]
    fn changes_are_seen_by_every_clone_and_replace_whole_quotas() {
        let rules = Rules::new();
        let clone = rules.clone();
        let small = Quota::per_second(2).unwrap();
        let large = Quota::fixed_window(50, Duration::from_secs(1)).unwrap();
        assert_eq!(rules.set("r", small), None);
        assert_eq!(clone.get("r"), Some(small));
        assert_eq!(clone.set("r", large), Some(small));
        assert_eq!(rules.get("r"), Some(large));
        rules.apply(&[("a".into(), Some(small)), ("r".into(), None)]);
        assert_eq!(clone.names(), ["a"]);
        assert_eq!(clone.remove("a"), Some(small));
        assert_eq!(clone.remove("a"), None);
        assert!(rules.is_empty());
    }

    #[test]
    fn concurrent_readers_see_one_quota_or_the_other() {
        let rules = Rules::new();
        let a = Quota::new(1, Rate::per_second(1).unwrap()).unwrap();
        let b = Quota::sliding_log(1_000, Duration::from_secs(3_600)).unwrap();
        rules.set("r", a);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        let seen = rules.get("r").expect("the rule is never missing");
                        assert!(seen == a || seen == b, "a torn quota: {seen:?}");
                    }
                });
            }
            for i in 0..2_000 {
                rules.set("r", if i % 2 == 0 { b } else { a });
                rules.set(format!("other{}", i % 7), a);
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }

    #[test]
    fn rule_names_are_words_a_message_can_carry() {
        for name in ["order_submit", "api/v1:search", "a.b-c", "X9"] {
            assert!(is_valid_name(name), "{name}");
        }
        for name in ["", "*", "a b", "a\nb", "é", &"x".repeat(129)] {
            assert!(!is_valid_name(name), "{name:?}");
        }
    }
}
