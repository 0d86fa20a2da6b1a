//! Text shared between the cached children of many QuestDBs.
//!
//! A child's compared spec (canonical JSON: about 4 KiB for a defaulted StatefulSet) differs
//! from database to database in a few tokens only: the QuestDB's name (claim, config map and
//! service names, selector labels), the hashes of its config and credentials, the instance a
//! dedicated pod is pinned to, a Service's cluster IP. Held with those tokens cut out and
//! interned, a thousand StatefulSets made from one spec cost one copy instead of a thousand.

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

/// What stands for the i-th token in a template. serde_json escapes control characters inside
/// strings and writes none outside them, so a JSON text holds none of these and the cut is
/// exact; a text that does hold one is kept whole.
const MARKS: [char; 8] = [
    '\u{0}', '\u{1}', '\u{2}', '\u{3}', '\u{4}', '\u{5}', '\u{6}', '\u{7}',
];

/// A text with some tokens cut out, shared with every other text that differs from it only in
/// those tokens.
#[derive(Clone, Debug)]
pub(crate) struct Templated {
    template: Arc<str>,
    /// The tokens cut out of `template`, in the order they were cut.
    tokens: Box<[Box<str>]>,
}

impl Templated {
    /// `text` with every occurrence of each token cut out (in order), interned. Tokens are
    /// names, hashes and addresses: one that is empty or holds a character JSON would escape
    /// is left in the text.
    pub(crate) fn new(text: &str, tokens: Vec<&str>) -> Self {
        Self::in_table(&SHARED, text, tokens)
    }

    fn in_table<'a>(table: &Table, text: &str, tokens: impl IntoIterator<Item = &'a str>) -> Self {
        let whole = || Self {
            template: table.intern(text.to_string()),
            tokens: Box::default(),
        };
        if text.contains(&MARKS[..]) {
            return whole();
        }
        let tokens: Vec<&str> = tokens
            .into_iter()
            .filter(|t| !t.is_empty() && t.chars().all(plain))
            .take(MARKS.len())
            .collect();
        let mut template = text.to_string();
        for (token, mark) in tokens.iter().zip(MARKS) {
            template = template.replace(token, mark.encode_utf8(&mut [0; 4]));
        }
        Self {
            template: table.intern(template),
            tokens: tokens.into_iter().map(Box::from).collect(),
        }
    }

    /// The text as it was given.
    pub(crate) fn text(&self) -> Cow<'_, str> {
        if self.tokens.is_empty() {
            return Cow::Borrowed(&self.template);
        }
        let mut text = self.template.to_string();
        for (token, mark) in self.tokens.iter().zip(MARKS).rev() {
            text = text.replace(mark, token);
        }
        Cow::Owned(text)
    }

    #[cfg(test)]
    pub(crate) fn shares_with(&self, other: &Templated) -> bool {
        Arc::ptr_eq(&self.template, &other.template)
    }
}

/// A character a JSON string holds as itself: tokens made of these appear in the text as they
/// are.
fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._/:".contains(c)
}

static SHARED: LazyLock<Table> = LazyLock::new(Table::default);

type Table = super::interned::Table<str>;

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(text: &str, tokens: &[&str]) {
        let t = Templated::in_table(&Table::default(), text, tokens.iter().copied());
        assert_eq!(t.text(), text, "{text:?} without {tokens:?}");
    }

    #[test]
    fn the_text_comes_back_exactly_whatever_the_tokens() {
        let spec = r#"{"serviceName":"db1-headless","claimName":"db1-data","hash":"ab12db1","image":"questdb/questdb:9.0.0"}"#;
        for tokens in [
            &["db1"][..],
            &["db1", "ab12db1"],
            &["ab12db1", "db1"],
            &["db", "b1", "1"],
            &["questdb", "questdb/questdb"],
            &["absent"],
            &["", "db1"],
            &[r#"":""#, "db1"],
            &[],
            &["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"],
        ] {
            round_trip(spec, tokens);
        }
        round_trip("aaaa", &["aa"]);
        round_trip("aaa", &["aa", "a"]);
        round_trip("", &["a"]);
        round_trip("a\u{0}b\u{1}", &["a", "b"]);
    }

    #[test]
    fn databases_that_differ_only_in_their_tokens_share_one_text() {
        let table = Table::default();
        let spec = |n: &str, h: &str| format!(r#"{{"claim":"{n}-data","configHash":"{h}"}}"#);
        let one = Templated::in_table(&table, &spec("payments", "9f86d0"), ["payments", "9f86d0"]);
        let two = Templated::in_table(&table, &spec("orders", "60303a"), ["orders", "60303a"]);
        assert!(one.shares_with(&two));
        assert_eq!(one.text(), spec("payments", "9f86d0"));
        assert_eq!(two.text(), spec("orders", "60303a"));
        assert_eq!(table.held(), 1);
    }
}
