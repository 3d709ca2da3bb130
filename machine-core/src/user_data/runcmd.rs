//! Which layer's command, and which of its commands, a failed `runcmd` stopped at.
//!
//! cloud-init writes every layer's `runcmd` into one `sh` script and reports only
//! "Runparts: 1 failures (runcmd)". So the composer puts, before each command of a
//! layer, one more command that records `<index> <count> <layer>` in
//! [`RUNCMD_LAYER_PATH`] (a shell builtin: no process per command); the composer's
//! `set -e` stops the script at the first failure, so the file then names the command
//! that failed, and the completion check's verdict says so.
//!
//! The markers are inserted into the layer's own text, before each item of its
//! top-level `runcmd` list, so that every other byte of the part (and the way cloud-init's
//! YAML reads it) is unchanged; the result is read back and must equal the original
//! with only the markers added. Where that cannot be done (a Jinja template, whose
//! commands exist only once cloud-init renders it; a list built with an alias, a block
//! scalar item or a tag), one marker before the part records the layer with index 0:
//! the verdict then names the layer only.

use serde_json::Value;

use super::{UserDataFormat, UserDataPart};

/// Where the marker of the command that ran last records `<index> <count> <layer>`
/// (index 0: somewhere in the layer), for the completion check's verdict.
pub const RUNCMD_LAYER_PATH: &str = "/run/machine-core/runcmd-layer";

/// The command that makes the marker's directory; the composer's first `runcmd` part
/// runs it after `set -e`, before any marker.
pub(super) fn make_marker_dir() -> String {
    let dir = RUNCMD_LAYER_PATH
        .rsplit_once('/')
        .map_or("/run", |(d, _)| d);
    format!("mkdir -p {dir}")
}

/// The verdict line for a `runcmd` failure, from the marker file's content
/// (`<index> <count> <layer>`, or `<count> <layer>` from releases before the index);
/// the completion waiter on the machine writes the same line.
pub fn runcmd_failure(mark: &str) -> Option<String> {
    let mark = mark.trim();
    let (first, rest) = mark.split_once(' ')?;
    let (index, count, layer) = match rest.split_once(' ') {
        Some((count, layer))
            if first.parse::<usize>().is_ok() && count.parse::<usize>().is_ok() =>
        {
            (first.parse::<usize>().unwrap_or(0), count, layer)
        }
        _ => (0, first, rest),
    };
    Some(if index == 0 {
        format!(
            "runcmd of layer {layer} failed (the first of its {count} commands to fail stopped the list)"
        )
    } else {
        format!(
            "runcmd of layer {layer} failed at its command {index} of {count} (the first command to fail stops the list)"
        )
    })
}

/// The command that records `index` (from 1; 0 for "somewhere in the layer") of
/// `count` commands of `layer`. `printf` is a builtin of every `sh` cloud-init runs.
fn marker_command(index: usize, count: usize, layer: &str) -> String {
    let quoted = shlex::try_quote(layer).map_or_else(|_| "layer".into(), |q| q.into_owned());
    format!("printf '%s %s %s\\n' {index} {count} {quoted} > {RUNCMD_LAYER_PATH}")
}

/// The part that records, before a part whose commands cannot be marked one by one,
/// that `layer`'s commands run from here.
pub(super) fn layer_marker(layer: &str, count: usize) -> UserDataPart {
    // A JSON string is a YAML scalar whatever the layer's name holds.
    let item = serde_json::to_string(&marker_command(0, count, layer)).unwrap_or_default();
    UserDataPart::new(
        UserDataFormat::CloudConfig,
        format!("runcmd-of-{}.cloud-config.yaml", sanitize(layer)),
        format!("#cloud-config\nruncmd:\n- {item}\n"),
    )
}

/// `part` (a cloud-config whose `runcmd` holds `doc_items`) with a marker before each of
/// its commands, numbered from `first + 1` of the layer's `count`; `None` when the text
/// does not allow it (see the module docs).
pub(super) fn mark_each_command(
    layer: &str,
    part: &UserDataPart,
    doc: &serde_json::Map<String, Value>,
    first: usize,
    count: usize,
) -> Option<UserDataPart> {
    if part.format != UserDataFormat::CloudConfig {
        return None;
    }
    let Some(Value::Array(items)) = doc.get("runcmd") else {
        return None;
    };
    let text = std::str::from_utf8(&part.content).ok()?;
    let starts = crate::locate::sequence_item_starts(text, "runcmd")?;
    if starts.len() != items.len() {
        return None;
    }
    let mut marked = String::with_capacity(text.len() + starts.len() * 96);
    let mut copied = 0;
    let mut expected = Vec::with_capacity(items.len() * 2);
    for (i, (&at, item)) in starts.iter().zip(items).enumerate() {
        let marker = marker_command(first + i + 1, count, layer);
        let quoted = serde_json::to_string(&marker).ok()?;
        let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
        let prefix = &text[line_start..at];
        let insert = if is_block_item_prefix(prefix) {
            format!("{quoted}\n{prefix}")
        } else if text[..at].trim_end().ends_with(['[', ',']) {
            format!("{quoted}, ")
        } else {
            return None;
        };
        marked.push_str(&text[copied..at]);
        marked.push_str(&insert);
        copied = at;
        expected.push(Value::String(marker));
        expected.push(item.clone());
    }
    marked.push_str(&text[copied..]);
    // Read back: only the markers may have changed.
    let mut want = doc.clone();
    want.insert("runcmd".into(), Value::Array(expected));
    let got: Value = crate::spec::from_yaml_redacting(&marked, |_| true).ok()?;
    if got != Value::Object(want) {
        return None;
    }
    let mut out = part.clone();
    out.content = marked.into_bytes();
    Some(out)
}

/// Whether the text before a block sequence item on its line is an indent and `- `.
fn is_block_item_prefix(prefix: &str) -> bool {
    prefix
        .trim_start_matches(' ')
        .strip_prefix('-')
        .is_some_and(|rest| !rest.is_empty() && rest.chars().all(|c| c == ' '))
}

/// A layer name as part of a file name: other characters than `[A-Za-z0-9._-]` as `_`.
pub(super) fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(content: &str) -> UserDataPart {
        UserDataPart::new(UserDataFormat::CloudConfig, "p", content)
    }

    fn doc(text: &str) -> serde_json::Map<String, Value> {
        match serde_saphyr::from_str::<Value>(text).unwrap() {
            Value::Object(m) => m,
            other => panic!("{other:?}"),
        }
    }

    fn mark(text: &str) -> Option<String> {
        mark_each_command("app's", &cc(text), &doc(text), 1, 4)
            .map(|p| String::from_utf8(p.content).unwrap())
    }

    fn commands(text: &str) -> Vec<Value> {
        doc(text)["runcmd"].as_array().unwrap().clone()
    }

    #[test]
    fn block_and_flow_lists_get_a_marker_before_each_command_and_nothing_else_changes() {
        for text in [
            "#cloud-config\npackages: [curl]\nruncmd:\n  - echo a # why\n  - [ls, -l]\n  - \"q\"\nhostname: h\n",
            "#cloud-config\nruncmd: [echo a, [ls, -l], \"q\"]\n",
            "#cloud-config\nruncmd: [\n  echo a,\n  [ls, -l], \"q\",\n]\n",
        ] {
            let marked = mark(text).unwrap_or_else(|| panic!("not marked: {text}"));
            let cmds = commands(&marked);
            assert_eq!(cmds.len(), 6, "{marked}");
            for (i, pair) in cmds.chunks(2).enumerate() {
                let want = format!(
                    "printf '%s %s %s\\n' {} 4 \"app's\" > {RUNCMD_LAYER_PATH}",
                    i + 2
                );
                assert_eq!(pair[0], Value::String(want), "{marked}");
            }
            assert_eq!(cmds[1], Value::String("echo a".into()));
            assert_eq!(cmds[3], serde_json::json!(["ls", "-l"]));
            let mut rest = doc(&marked);
            rest.remove("runcmd");
            let mut before = doc(text);
            before.remove("runcmd");
            assert_eq!(rest, before);
        }
    }

    #[test]
    fn lists_that_cannot_be_marked_safely_are_left_as_they_are() {
        for text in [
            // A block scalar item: its value starts on the next line.
            "runcmd:\n  - |\n    echo a\n",
            // An alias, an anchor on an item, a tag.
            "x: &l [a, b]\nruncmd: *l\n",
            "runcmd:\n  - &a echo\n  - b\n",
            "runcmd:\n  - !!str yes\n",
            // The value on the line after its dash.
            "runcmd:\n  -\n    echo a\n",
        ] {
            assert_eq!(mark(text), None, "{text}");
        }
    }

    #[test]
    fn the_verdict_names_the_command_when_the_marker_has_its_index() {
        assert_eq!(
            runcmd_failure("3 5 app's\n").unwrap(),
            "runcmd of layer app's failed at its command 3 of 5 (the first command to fail stops the list)"
        );
        let layer_only = runcmd_failure("0 5 my app").unwrap();
        assert!(
            layer_only.starts_with("runcmd of layer my app failed ("),
            "{layer_only}"
        );
        // A machine made by a release before the index.
        let old = runcmd_failure("5 app").unwrap();
        assert!(old.starts_with("runcmd of layer app failed ("), "{old}");
        assert!(old.contains("its 5 commands"), "{old}");
        assert_eq!(runcmd_failure("garbage"), None);
    }

    #[test]
    fn the_markers_run_under_sh_and_the_first_failure_leaves_its_index() {
        let text = "runcmd:\n  - \"true\"\n  - \"false\"\n  - \"true\"\n";
        let marked = mark(text).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        // The script cloud-init writes: one line per item, after the composer's `set -e`.
        let script: String = std::iter::once("set -e".to_owned())
            .chain(commands(&marked).iter().map(|c| {
                c.as_str()
                    .unwrap()
                    .replace(RUNCMD_LAYER_PATH, path.to_str().unwrap())
            }))
            .map(|l| l + "\n")
            .collect();
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{out:?}");
        let mark = std::fs::read_to_string(&path).unwrap();
        assert_eq!(mark, "3 4 app's\n");
    }
}
