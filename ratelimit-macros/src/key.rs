//! Key templates: `"order:submit:<user_id>"` split into literal text and
//! placeholders, with the separator rule that keeps keys injective.

use std::fmt;

use ratelimit_core::key::__in_escaped_value as in_escaped_value;

/// A template as written in `key = "..."`, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    pub segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Text copied into every key as written.
    Literal(String),
    Placeholder(Placeholder),
}

/// `<root.field.path>`: a parameter (or `self`), then fields of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placeholder {
    pub root: String,
    /// Named fields or tuple indices, as written.
    pub fields: Vec<String>,
}

impl fmt::Display for Placeholder {
    /// Formats as written in the template, for messages: `<user.id>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{}", self.root)?;
        for field in &self.fields {
            write!(f, ".{field}")?;
        }
        f.write_str(">")
    }
}

/// Why a template does not parse. Each variant carries the offending text as
/// written, so the message can quote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TemplateError {
    Empty,
    EmptyPlaceholder,
    Unclosed(String),
    InvalidPlaceholder(String),
    /// A tuple index Rust would not accept (`<pair.00>`, `<pair.99999999999>`):
    /// the placeholder as written, and the index.
    TupleIndex(String, String),
    NoSeparator(Placeholder, Placeholder),
    /// A placeholder with text right before (`false`) or after (`true`) it
    /// that starts with a character a value can hold.
    Glued(Placeholder, bool, char),
    Tilde,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateError::Empty => f.write_str(
                "`key` must not be empty; name the bucket, such as `key = \"login:<user_id>\"`",
            ),
            TemplateError::EmptyPlaceholder => f.write_str(
                "empty placeholder `<>`; name a parameter inside it, such as `<user_id>`",
            ),
            TemplateError::Unclosed(text) => write!(
                f,
                "unclosed placeholder `{text}`; add `>` after the parameter name"
            ),
            TemplateError::InvalidPlaceholder(text) => write!(
                f,
                "invalid placeholder `{text}`; expected a parameter name, optionally followed \
                 by fields, such as `<user_id>` or `<user.id>`"
            ),
            TemplateError::TupleIndex(text, index) => write!(
                f,
                "invalid tuple index `.{index}` in placeholder `{text}`; a tuple index is \
                 written as Rust writes it, without leading zeros and below 2^32, such as `.0`"
            ),
            TemplateError::Tilde => f.write_str(
                "`~` in key text is the attribute's own separator (a quota of another \
                 algorithm decides on `key~<algorithm>`); use another, such as `:`",
            ),
            TemplateError::NoSeparator(a, b) => write!(
                f,
                "placeholders `{a}` and `{b}` need a separator between them, such as `:`; \
                 otherwise two different values could build the same key"
            ),
            TemplateError::Glued(placeholder, after, c) => {
                let (side, example) = if *after {
                    ("after", format!("{placeholder}:"))
                } else {
                    ("before", format!(":{placeholder}"))
                };
                write!(
                    f,
                    "placeholder `{placeholder}` needs a separator {side} it, such as `:` \
                     (`{example}`): a value can hold `{c}`, so a value here could spell the text \
                     beside it, and build the key of another template"
                )
            }
        }
    }
}

impl Template {
    /// Parses the value of a `key = "..."` literal.
    pub(crate) fn parse(text: &str) -> Result<Self, TemplateError> {
        if text.is_empty() {
            return Err(TemplateError::Empty);
        }
        let mut segments = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('<') {
            if open > 0 {
                segments.push(Segment::Literal(rest[..open].to_owned()));
            }
            let after = &rest[open + 1..];
            let close = after.find('>');
            let reopen = after.find('<');
            let close = match (close, reopen) {
                (Some(close), Some(reopen)) if reopen < close => None,
                (close, _) => close,
            };
            let Some(close) = close else {
                let end = reopen.unwrap_or(after.len());
                return Err(TemplateError::Unclosed(format!("<{}", &after[..end])));
            };
            let inner = &after[..close];
            if inner.is_empty() {
                return Err(TemplateError::EmptyPlaceholder);
            }
            let placeholder = parse_placeholder(inner)
                .ok_or_else(|| TemplateError::InvalidPlaceholder(format!("<{inner}>")))?;
            if let Some(index) = placeholder.fields.iter().find(|f| is_bad_tuple_index(f)) {
                return Err(TemplateError::TupleIndex(
                    format!("<{inner}>"),
                    index.clone(),
                ));
            }
            segments.push(Segment::Placeholder(placeholder));
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            segments.push(Segment::Literal(rest.to_owned()));
        }
        let template = Template { segments };
        // Written in a key, it could spell the key of another algorithm's
        // state, or of a stacked check's (`key~2`).
        if template
            .segments
            .iter()
            .any(|segment| matches!(segment, Segment::Literal(text) if text.contains('~')))
        {
            return Err(TemplateError::Tilde);
        }
        template.check_separators()?;
        template.check_edges()?;
        Ok(template)
    }

    /// Each placeholder is bounded by the template's ends or by characters
    /// no escaped value holds: then a key splits into its values and its
    /// text one way only. Else `"api:<tenant>"` with `acme.writes` builds
    /// the key `"api:<tenant>.writes"` builds with `acme`.
    fn check_edges(&self) -> Result<(), TemplateError> {
        for (i, segment) in self.segments.iter().enumerate() {
            let Segment::Placeholder(placeholder) = segment else {
                continue;
            };
            let before = match i.checked_sub(1).map(|i| &self.segments[i]) {
                Some(Segment::Literal(text)) => text.chars().next_back(),
                _ => None,
            };
            if let Some(c) = before.filter(|&c| in_escaped_value(c)) {
                return Err(TemplateError::Glued(placeholder.clone(), false, c));
            }
            let after = match self.segments.get(i + 1) {
                Some(Segment::Literal(text)) => text.chars().next(),
                _ => None,
            };
            if let Some(c) = after.filter(|&c| in_escaped_value(c)) {
                return Err(TemplateError::Glued(placeholder.clone(), true, c));
            }
        }
        Ok(())
    }

    /// Escaped values only contain `[A-Za-z0-9_.-%]`, so a character outside
    /// that set between two placeholders tells where one value ends. Without
    /// one, `<a>-<b>` builds `x-y-z` from both ("x-y", "z") and ("x", "y-z").
    fn check_separators(&self) -> Result<(), TemplateError> {
        let mut previous: Option<&Placeholder> = None;
        let mut separated = true;
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => {
                    separated |= text.chars().any(|c| !in_escaped_value(c));
                }
                Segment::Placeholder(placeholder) => {
                    if let (Some(previous), false) = (previous, separated) {
                        return Err(TemplateError::NoSeparator(
                            previous.clone(),
                            placeholder.clone(),
                        ));
                    }
                    previous = Some(placeholder);
                    separated = false;
                }
            }
        }
        Ok(())
    }
}

/// The first placeholder written in `text` (`<user>`, `<user.id>`), as
/// written: text a key expression holds that only a template would fill.
pub(crate) fn first_placeholder(text: &str) -> Option<&str> {
    let mut rest = text;
    while let Some(open) = rest.find('<') {
        let after = &rest[open + 1..];
        let close = after.find('>')?;
        if parse_placeholder(&after[..close]).is_some() {
            return Some(&rest[open..open + close + 2]);
        }
        rest = after;
    }
    None
}

/// `user.id` or `pair.0` -> root and fields; `None` if not of that form.
fn parse_placeholder(inner: &str) -> Option<Placeholder> {
    let mut parts = inner.split('.');
    let root = parts.next().filter(|root| is_identifier(root))?;
    let fields = parts
        .map(|field| {
            let is_index = !field.is_empty() && field.bytes().all(|b| b.is_ascii_digit());
            (is_index || is_identifier(field)).then(|| field.to_owned())
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Placeholder {
        root: root.to_owned(),
        fields,
    })
}

/// Whether a field is digits that Rust would not take as a tuple index: one
/// with a leading zero (`.00`, which would otherwise be read as `.0`), or
/// one too large for a `u32`.
fn is_bad_tuple_index(field: &str) -> bool {
    field.bytes().all(|b| b.is_ascii_digit())
        && ((field.len() > 1 && field.starts_with('0')) || field.parse::<u32>().is_err())
}

fn is_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placeholder(root: &str, fields: &[&str]) -> Segment {
        Segment::Placeholder(Placeholder {
            root: root.to_owned(),
            fields: fields.iter().map(|f| (*f).to_owned()).collect(),
        })
    }

    fn literal(text: &str) -> Segment {
        Segment::Literal(text.to_owned())
    }

    #[test]
    fn templates_split_into_literals_and_placeholders() {
        let template = Template::parse("order:submit:<user_id>").unwrap();
        assert_eq!(
            template.segments,
            [literal("order:submit:"), placeholder("user_id", &[])]
        );
        let template = Template::parse("<self.tenant.id>/{hot}/<pair.0>:end").unwrap();
        assert_eq!(
            template.segments,
            [
                placeholder("self", &["tenant", "id"]),
                literal("/{hot}/"),
                placeholder("pair", &["0"]),
                literal(":end"),
            ]
        );
    }

    #[test]
    fn templates_without_placeholders_are_one_literal() {
        let template = Template::parse("login>attempts").unwrap();
        assert_eq!(template.segments, [literal("login>attempts")]);
    }

    #[test]
    fn placeholders_format_as_written() {
        let template = Template::parse("<a.b.0>").unwrap();
        let Segment::Placeholder(placeholder) = &template.segments[0] else {
            panic!("a placeholder: {template:?}")
        };
        assert_eq!(placeholder.to_string(), "<a.b.0>");
    }

    #[test]
    fn malformed_placeholders_are_rejected_with_their_text() {
        let cases = [
            ("", TemplateError::Empty),
            ("a:<>", TemplateError::EmptyPlaceholder),
            ("a:<user_id", TemplateError::Unclosed("<user_id".into())),
            ("<a:<b>", TemplateError::Unclosed("<a:".into())),
            (
                "<user id>",
                TemplateError::InvalidPlaceholder("<user id>".into()),
            ),
            (
                "<1user>",
                TemplateError::InvalidPlaceholder("<1user>".into()),
            ),
            (
                "<user.>",
                TemplateError::InvalidPlaceholder("<user.>".into()),
            ),
            (
                "<user..id>",
                TemplateError::InvalidPlaceholder("<user..id>".into()),
            ),
            (
                "< user >",
                TemplateError::InvalidPlaceholder("< user >".into()),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(Template::parse(text), Err(expected), "template {text:?}");
        }
    }

    /// `<x.99999999999>` (no `u32`, which `Ident::new_raw` would panic on)
    /// and `<x.00>` (which Rust does not read as `.0`) are reported, quoting
    /// the index.
    #[test]
    fn tuple_indices_rust_would_not_accept_are_rejected() {
        for (text, inner, index) in [
            ("a:<x.99999999999>", "<x.99999999999>", "99999999999"),
            ("a:<x.4294967296>", "<x.4294967296>", "4294967296"),
            ("a:<x.00>", "<x.00>", "00"),
            ("a:<x.y.01>", "<x.y.01>", "01"),
        ] {
            assert_eq!(
                Template::parse(text),
                Err(TemplateError::TupleIndex(inner.into(), index.into())),
                "template {text:?}"
            );
        }
        for text in ["a:<x.0>", "a:<x.10>", "a:<x.4294967295>", "a:<x.y0>"] {
            assert!(Template::parse(text).is_ok(), "{text:?} must be accepted");
        }
        assert_eq!(
            Template::parse("<x.00>").unwrap_err().to_string(),
            "invalid tuple index `.00` in placeholder `<x.00>`; a tuple index is written as \
             Rust writes it, without leading zeros and below 2^32, such as `.0`"
        );
    }

    #[test]
    fn placeholders_are_found_in_text() {
        assert_eq!(first_placeholder("c:<user>"), Some("<user>"));
        assert_eq!(first_placeholder("a < b, c:<user.id>:d"), Some("<user.id>"));
        assert_eq!(first_placeholder("<<x>"), Some("<x>"));
        for text in ["", "a<b", "a < b > c", "<{user}>", "<>", "a>b<"] {
            assert_eq!(first_placeholder(text), None, "{text:?}");
        }
    }

    #[test]
    fn adjacent_placeholders_need_a_separator_outside_the_value_alphabet() {
        for text in ["<a><b>", "<a>-<b>", "x:<a>_.%9<b>:y", "<a>:<b><c>"] {
            assert!(
                matches!(Template::parse(text), Err(TemplateError::NoSeparator(..))),
                "{text:?} must be rejected"
            );
        }
        for text in [
            "<a>:<b>",
            "<a>/<b>",
            "<a>:x-y:<b>",
            "<a> <b>",
            "<a>{<b>}",
            "<a>é<b>",
        ] {
            assert!(Template::parse(text).is_ok(), "{text:?} must be accepted");
        }
    }

    /// Text a value could spell, right beside a placeholder, lets one
    /// template's value build another template's key: `"api:<t>"` with
    /// `acme.writes` and `"api:<t>.writes"` with `acme`; `"v2-<id>"` with
    /// `x-7` and `"v2-x-<id>"` with `7`.
    #[test]
    fn a_placeholder_is_bounded_by_separators_or_the_ends() {
        for (text, placeholder, after, c) in [
            ("api:<t>.writes", "t", true, '.'),
            ("order<id>", "id", false, 'r'),
            ("v2-<id>", "id", false, '-'),
            ("<a>%", "a", true, '%'),
            ("<a>:x-y-<b>", "b", false, '-'),
            ("{<user>}a<b>", "b", false, 'a'),
        ] {
            assert_eq!(
                Template::parse(text),
                Err(TemplateError::Glued(
                    Placeholder {
                        root: placeholder.into(),
                        fields: vec![],
                    },
                    after,
                    c
                )),
                "{text:?}"
            );
        }
        for text in ["<a>", "api:<t>:writes", "{<user>}:burst", "a/<b>/c", "<a>é"] {
            assert!(Template::parse(text).is_ok(), "{text:?} must be accepted");
        }
        assert_eq!(
            Template::parse("api:<tenant>.writes")
                .unwrap_err()
                .to_string(),
            "placeholder `<tenant>` needs a separator after it, such as `:` (`<tenant>:`): a \
             value can hold `.`, so a value here could spell the text beside it, and build \
             the key of another template"
        );
    }

    #[test]
    fn separator_error_names_both_placeholders() {
        let err = Template::parse("<a.x>-<b>").unwrap_err();
        assert_eq!(
            err.to_string(),
            "placeholders `<a.x>` and `<b>` need a separator between them, such as `:`; \
             otherwise two different values could build the same key"
        );
    }
}
