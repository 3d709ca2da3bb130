//! Where a field path lies in a YAML or JSON document, so that a mistake found after the
//! document was read (by a `validate`) is reported with its line, like a mistake found
//! while reading it.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use crate::error::Error;

/// Adds the line and column of `error`'s field in `document` (YAML, or JSON, which is
/// YAML) to its message: `invalid spec: hosts[1].address: "-x" is not ... (line 7,
/// column 14)`. An error without a field, one whose message already gives a line, or a
/// field the document does not hold is returned as it is.
///
/// Every `from_yaml` and `from_json` of the project passes its `validate` errors through
/// it; call it likewise after validating a document of your own.
///
/// ```
/// use machine_core::{Error, at_document_line};
///
/// let doc = "owner: a\nhosts:\n  - name: h\n    address: \"-x\"\n";
/// let e = at_document_line(Error::invalid_spec("hosts[0].address", "bad"), doc);
/// assert!(e.message().ends_with("(line 4, column 14)"), "{e}");
/// ```
pub fn at_document_line(error: Error, document: &str) -> Error {
    let Some(field) = error.field() else {
        return error;
    };
    if gives_a_line(error.message()) {
        return error;
    }
    match locate(document, field) {
        Some((line, column)) => {
            let suffix = format!(" (line {line}, column {column})");
            error.with_message_suffix(&suffix)
        }
        None => error,
    }
}

/// Whether `message` already says where (`line 3`), as the readers' messages do.
fn gives_a_line(message: &str) -> bool {
    message
        .match_indices("line ")
        .any(|(at, _)| message[at + 5..].starts_with(|c: char| c.is_ascii_digit()))
}

/// Whether `document` (YAML or JSON) holds a value at `field` itself, not only an
/// enclosing one: a reader that defers checks (a builder) uses it to refuse, with the
/// line, a bad value the document wrote.
///
/// ```
/// let doc = "region: us-east-1\ndefaults: {subnetId: x}\n";
/// assert!(machine_core::field_in_document(doc, "defaults.subnetId"));
/// assert!(!machine_core::field_in_document(doc, "owner"));
/// ```
pub fn field_in_document(document: &str, field: &str) -> bool {
    let Ok(root) = crate::spec::from_yaml_within::<Spanned<Node>>(
        document,
        |_| false,
        &crate::spec::DocumentLimits::DEFAULT,
    ) else {
        return false;
    };
    let (_, rest) = walk_to(&root, field);
    rest.trim_start_matches('.').is_empty()
}

/// The line and column of the value at `field` (`hosts[1].address`, `labels.team`) in
/// `document`, or of the deepest enclosing value the document holds.
fn locate(document: &str, field: &str) -> Option<(u64, u64)> {
    let root: Spanned<Node> =
        crate::spec::from_yaml_within(document, |_| false, &crate::spec::DocumentLimits::DEFAULT)
            .ok()?;
    let (found, _) = walk_to(&root, field);
    let at = found.referenced;
    (at.line() > 0).then(|| (at.line(), at.column()))
}

/// The deepest value on `path` the document holds, and what is left of the path below it.
fn walk_to<'a, 'p>(node: &'a Spanned<Node>, path: &'p str) -> (&'a Spanned<Node>, &'p str) {
    let path = path.strip_prefix('.').unwrap_or(path);
    if path.is_empty() {
        return (node, path);
    }
    match &node.value {
        Node::Seq(items) => {
            let Some((index, rest)) = path
                .strip_prefix('[')
                .and_then(|p| p.split_once(']'))
                .and_then(|(i, rest)| Some((i.parse::<usize>().ok()?, rest)))
            else {
                return (node, path);
            };
            items
                .get(index)
                .map_or((node, path), |item| walk_to(item, rest))
        }
        Node::Map(entries) => {
            // The longest key that the path continues from: keys may hold dots.
            let child = entries
                .iter()
                .filter(|(key, _)| {
                    path.strip_prefix(key.as_str())
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
                })
                .max_by_key(|(key, _)| key.len());
            match child {
                Some((key, value)) => walk_to(value, &path[key.len()..]),
                None => (node, path),
            }
        }
        Node::Leaf => (node, path),
    }
}

/// A document's shape with the place of every value.
enum Node {
    Map(Vec<(String, Spanned<Node>)>),
    Seq(Vec<Spanned<Node>>),
    Leaf,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Key>()? {
            let value = map.next_value::<Spanned<Node>>()?;
            entries.push((key.0, value));
        }
        Ok(Node::Map(entries))
    }
}

/// A mapping key as a field path spells it; keys that are not scalars match nothing.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
                Ok(Key(String::new()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Key, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(Key(String::from("\0")))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Key, A::Error> {
                while map
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Key(String::from("\0")))
            }
        }
        d.deserialize_any(KeyVisitor)
    }
}

/// Where each item of the top-level sequence `key` of `document` begins (byte offsets),
/// with the item's [`Spanned::referenced`] and [`Spanned::defined`] places the same (no
/// alias); `None` when the document cannot be read, `key` is not a sequence, or it or
/// an item comes from an alias.
pub(crate) fn sequence_item_starts(document: &str, key: &str) -> Option<Vec<usize>> {
    let root: Spanned<Node> =
        crate::spec::from_yaml_within(document, |_| false, &crate::spec::DocumentLimits::DEFAULT)
            .ok()?;
    let Node::Map(entries) = &root.value else {
        return None;
    };
    let (_, seq) = entries.iter().find(|(k, _)| k == key)?;
    let Node::Seq(items) = &seq.value else {
        return None;
    };
    if seq.referenced != seq.defined {
        return None;
    }
    items
        .iter()
        .map(|item| {
            (item.referenced == item.defined)
                .then(|| item.referenced.span().byte_offset())
                .flatten()
                .and_then(|at| usize::try_from(at).ok())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
owner: a
hosts:
  - name: h1
    address: x
  - name: h2
    address: \"-x\"
    labels: {a.b: c, a: d}
";

    #[test]
    fn a_path_is_found_at_its_line() {
        assert_eq!(locate(DOC, "owner"), Some((1, 8)));
        assert_eq!(locate(DOC, "hosts[1].address"), Some((6, 14)));
        assert_eq!(locate(DOC, "hosts[1].labels.a.b"), Some((7, 19)));
        assert_eq!(locate(DOC, "hosts[1].labels.a"), Some((7, 25)));
        // What the document does not hold is placed at the nearest value it does.
        assert_eq!(locate(DOC, "hosts[1].port"), Some((5, 5)));
        assert_eq!(locate(DOC, "hosts[9]"), Some((3, 3)));
    }

    #[test]
    fn json_documents_are_located_too() {
        let json = "{\n  \"name\": \"a\",\n  \"labels\": {\n    \"k\": \"a b\"\n  }\n}";
        assert_eq!(locate(json, "labels.k").map(|l| l.0), Some(4));
    }

    #[test]
    fn a_message_mentioning_a_key_line_still_gains_the_line() {
        let e = Error::invalid_spec(
            "hosts[1].address",
            "not one OpenSSH public key line (\"ssh-ed25519 ...\")",
        );
        let e = at_document_line(e, DOC);
        assert!(e.message().ends_with("(line 6, column 14)"), "{e}");
    }

    #[test]
    fn errors_gain_the_line_once() {
        let e = at_document_line(Error::invalid_spec("hosts[1].address", "bad"), DOC);
        assert_eq!(e.message(), "bad (line 6, column 14)");
        let e = at_document_line(e, DOC);
        assert_eq!(e.message(), "bad (line 6, column 14)");
        let e = at_document_line(Error::permanent("no field"), DOC);
        assert_eq!(e.message(), "no field");
    }
}
