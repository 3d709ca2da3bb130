//! Placing template values into a YAML (or JSON) document so that no value can change
//! its structure, whatever the position of the `{{ }}`.
//!
//! Escaping a value as it is written cannot work: `curl-{{ v }}` puts it in the middle
//! of a plain scalar, where YAML has no escapes, and `x, y` or `ok #rest` would split or
//! cut it. So a template is rendered with a unique placeholder token for every value
//! (an alphanumeric word, a plain scalar anywhere); the parser then says which scalar,
//! key or comment holds each token, and each such scalar is written again, whole, as a
//! JSON string with the values in place. A value that is the whole of a plain scalar and
//! not a string (a number, a list) is written as JSON, so it keeps its type. Finally the
//! result is parsed again and must have exactly the structure the placeholders had,
//! with the values as scalar contents; anything else is refused, never emitted.

use std::cell::RefCell;
use std::ops::Range;

use granit_parser::{Event, Options, Parser, ScalarStyle};
use serde_json::Value;

/// Every token starts with this and the render's nonce: a template cannot guess it.
const TOKEN_START: &str = "tmplslot";

thread_local! {
    /// The values of the render under way on this thread, when its output is YAML.
    static SLOTS: RefCell<Option<Slots>> = const { RefCell::new(None) };
}

/// The values one render wrote, in order, and its nonce.
pub(crate) struct Slots {
    prefix: String,
    values: Vec<Value>,
}

/// Runs `render` with slot recording on, returning its output and the recorded slots.
/// The recorder is removed even if `render` panics.
pub(crate) fn recording<T>(render: impl FnOnce() -> T) -> (T, Slots) {
    struct Take;
    impl Drop for Take {
        fn drop(&mut self) {
            SLOTS.with(|s| s.borrow_mut().take());
        }
    }
    let mut nonce = [0u8; 8];
    // Without OS randomness the address of a stack value still varies per render;
    // guessing it only lets a template author confuse their own template.
    if getrandom::fill(&mut nonce).is_err() {
        nonce = (&nonce as *const _ as usize as u64).to_le_bytes();
    }
    let prefix = format!("{TOKEN_START}{}n", hex(&nonce));
    SLOTS.with(|s| {
        *s.borrow_mut() = Some(Slots {
            prefix,
            values: Vec::new(),
        })
    });
    let guard = Take;
    let out = render();
    let slots = SLOTS.with(|s| s.borrow_mut().take()).unwrap_or(Slots {
        prefix: String::new(),
        values: Vec::new(),
    });
    drop(guard);
    (out, slots)
}

/// Records `value` and returns its token, when a recording render is under way.
pub(crate) fn record(value: Value) -> Option<String> {
    SLOTS.with(|s| {
        let mut s = s.borrow_mut();
        let slots = s.as_mut()?;
        let token = format!("{}{}z", slots.prefix, slots.values.len());
        slots.values.push(value);
        Some(token)
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// JSON text with the characters a YAML 1.1 reader (PyYAML) refuses or folds (C1
/// controls, NEL, LS/PS, BOM, U+FFFE/U+FFFF) escaped; JSON only escapes C0 controls.
pub(crate) fn yaml_safe_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        let bad = matches!(
            c,
            '\u{7f}'..='\u{9f}' | '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
        );
        if bad {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

fn json_string(s: &str) -> String {
    // Serializing a str cannot fail.
    yaml_safe_json(&serde_json::to_string(s).unwrap_or_default())
}

/// A value as text inside a longer scalar: strings as they are, the rest as JSON.
fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// What the document is made of, for comparing the filled output with the
/// placeholder render: scalar contents, plainness (which decides their type) and tags.
#[derive(Debug, PartialEq)]
enum Shape {
    Scalar {
        value: String,
        plain: bool,
        tag: Option<String>,
    },
    SeqStart,
    SeqEnd,
    MapStart,
    MapEnd,
    DocStart,
    DocEnd,
    Alias(usize),
}

fn shape(event: &Event<'_>) -> Option<Shape> {
    Some(match event {
        Event::Scalar(value, style, _, tag) => Shape::Scalar {
            value: value.to_string(),
            plain: *style == ScalarStyle::Plain,
            tag: tag.as_ref().map(|t| format!("{t:?}")),
        },
        Event::SequenceStart(..) => Shape::SeqStart,
        Event::SequenceEnd => Shape::SeqEnd,
        Event::MappingStart(..) => Shape::MapStart,
        Event::MappingEnd => Shape::MapEnd,
        Event::DocumentStart(..) => Shape::DocStart,
        Event::DocumentEnd => Shape::DocEnd,
        Event::Alias(id) => Shape::Alias(*id),
        _ => return None,
    })
}

fn shapes(text: &str) -> Result<Vec<Shape>, String> {
    let mut parser = Parser::new_from_str(text);
    let mut out = Vec::new();
    while let Some(ev) = parser.next_event() {
        let (ev, _) = ev.map_err(|e| e.to_string())?;
        out.extend(shape(&ev));
    }
    Ok(out)
}

fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].matches('\n').count() + 1
}

/// Replaces the tokens in `text` (the render's output) with `slots`' values as
/// described in the module docs. Errors give the line of the rendered output and never
/// a value.
pub(crate) fn fill(text: &str, slots: &Slots) -> Result<String, String> {
    let prefix = slots.prefix.as_str();
    if slots.values.is_empty() || !text.contains(prefix) {
        return Ok(text.to_owned());
    }
    // The token at `at` (just past the prefix): its index and its length after `at`.
    let token_at = |s: &str, at: usize| -> Option<(usize, usize)> {
        let digits = s[at..].bytes().take_while(u8::is_ascii_digit).count();
        let index: usize = s[at..at + digits].parse().ok()?;
        (s[at + digits..].starts_with('z') && index < slots.values.len())
            .then_some((index, digits + 1))
    };
    let substitute = |s: &str, inline: fn(&Value) -> String| -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(i) = rest.find(prefix) {
            let at = i + prefix.len();
            out.push_str(&rest[..i]);
            match token_at(rest, at) {
                Some((index, len)) => {
                    out.push_str(&inline(&slots.values[index]));
                    rest = &rest[at + len..];
                }
                None => {
                    out.push_str(&rest[i..at]);
                    rest = &rest[at..];
                }
            }
        }
        out.push_str(rest);
        out
    };
    let whole_token = |s: &str| -> Option<usize> {
        let at = s.strip_prefix(prefix)?;
        let (index, len) = token_at(s, prefix.len())?;
        (len == at.len()).then_some(index)
    };

    let mut options = Options::default();
    options.emit_comments = true;
    let mut parser = Parser::new_from_str_with_options(text, options);
    let mut edits: Vec<(Range<usize>, String)> = Vec::new();
    let mut expected = Vec::new();
    let mut prev_end = 0;
    while let Some(ev) = parser.next_event() {
        let (ev, span) = ev.map_err(|e| {
            format!("the template's output is not YAML even with every value left out: {e}")
        })?;
        let range = span
            .byte_range()
            .ok_or("the YAML parser gave no source offsets")?;
        match &ev {
            Event::Comment(..) => {
                let source = &text[range.clone()];
                if source.contains(prefix) {
                    // In a comment a value only has to stay on its line.
                    let inline = |v: &Value| {
                        let j = json_string(&as_text(v));
                        j[1..j.len() - 1].to_owned()
                    };
                    edits.push((range, substitute(source, inline)));
                }
                continue;
            }
            Event::Scalar(value, style, _, tag) if value.contains(prefix) => {
                let typed = whole_token(value)
                    .filter(|_| *style == ScalarStyle::Plain && tag.is_none())
                    .map(|i| &slots.values[i])
                    .filter(|v| !v.is_string());
                if let Some(v) = typed {
                    let json = yaml_safe_json(&v.to_string());
                    expected.extend(
                        shapes(&json)?
                            .into_iter()
                            .filter(|s| !matches!(s, Shape::DocStart | Shape::DocEnd)),
                    );
                    edits.push((range.clone(), json));
                } else {
                    let filled = substitute(value, as_text);
                    let mut replacement = json_string(&filled);
                    let mut start = range.start;
                    if matches!(style, ScalarStyle::Literal | ScalarStyle::Folded) {
                        // The span holds only the content: replace from the `|` or `>`
                        // indicator (the first one after white space; tags and anchors
                        // come before it), and keep the line break and indentation the
                        // span swallowed at its end.
                        let gap = &text[prev_end..range.start];
                        let indicator = gap
                            .char_indices()
                            .zip(std::iter::once(' ').chain(gap.chars()))
                            .find(|((_, c), before)| {
                                matches!(c, '|' | '>') && before.is_whitespace()
                            })
                            .map(|((i, _), _)| prev_end + i)
                            .ok_or_else(|| {
                                format!(
                                    "line {}: cannot find this block scalar's indicator",
                                    line_of(text, range.start)
                                )
                            })?;
                        start = indicator;
                        let source = &text[range.clone()];
                        if let Some(nl) = source.rfind('\n') {
                            replacement.push('\n');
                            replacement.push_str(&source[nl + 1..]);
                        }
                    }
                    expected.push(Shape::Scalar {
                        value: filled,
                        plain: false,
                        tag: tag.as_ref().map(|t| format!("{t:?}")),
                    });
                    edits.push((start..range.end, replacement));
                }
            }
            other => expected.extend(shape(other)),
        }
        prev_end = prev_end.max(range.end);
    }
    edits.sort_by_key(|(r, _)| r.start);
    // Every token must lie in an edited scalar or comment.
    let mut from = 0;
    while let Some(i) = text[from..].find(prefix) {
        let at = from + i;
        if !edits.iter().any(|(r, _)| r.contains(&at)) {
            return Err(format!(
                "line {}: a value can fill a YAML scalar, key or comment, not an anchor, tag, alias or directive",
                line_of(text, at)
            ));
        }
        from = at + prefix.len();
    }
    let mut out = String::with_capacity(text.len() + 64);
    let mut last = 0;
    for (range, replacement) in &edits {
        // A comment inside a replaced block scalar header goes with it.
        if range.start < last {
            continue;
        }
        out.push_str(&text[last..range.start]);
        out.push_str(replacement);
        last = range.end;
    }
    out.push_str(&text[last..]);
    let got = shapes(&out).map_err(|e| format!("values made the output unreadable: {e}"))?;
    if got != expected {
        let at = got
            .iter()
            .zip(&expected)
            .position(|(g, e)| g != e)
            .unwrap_or(got.len().min(expected.len()));
        return Err(format!(
            "a value would change the document's structure (at the {}th node); put each {{{{ value }}}} inside a scalar",
            at + 1
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn filled(template: &str, values: &[Value]) -> Result<String, String> {
        let (text, slots) = recording(|| {
            let mut t = template.to_owned();
            for v in values {
                let token = record(v.clone()).unwrap();
                t = t.replacen("@", &token, 1);
            }
            t
        });
        fill(&text, &slots)
    }

    #[test]
    fn scalars_keys_comments_and_blocks_are_rewritten_whole() {
        let out = filled(
            "#cloud-config\n# for @\npackages: [curl-@, jq]\n@: 1\nport: @\nb: |\n  line @\n  two\nc: x\n",
            &[
                json!("a\nb"),
                json!("x, evil, y"),
                json!("k: v"),
                json!(80),
                json!("#rest"),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            "#cloud-config\n# for a\\nb\npackages: [\"curl-x, evil, y\", jq]\n\"k: v\": 1\nport: 80\nb: \"line #rest\\ntwo\\n\"\nc: x\n"
        );
    }

    #[test]
    fn values_in_anchors_or_tags_are_refused() {
        let e = filled("a: &@ x\n", &[json!("n")]).unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = filled("a: !@ x\n", &[json!("n")]).unwrap_err();
        assert!(e.contains("anchor, tag"), "{e}");
    }
}
