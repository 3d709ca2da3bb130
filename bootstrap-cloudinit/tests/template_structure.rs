//! Template values never change a document's structure, in any YAML position: a
//! corpus of hostile values is rendered into flow and block positions, whole scalars and
//! parts of scalars, quoted and block scalars, keys and comments, and the output is read
//! back by PyYAML (cloud-init's own reader) and by serde-saphyr.

mod peers;

use bootstrap_cloudinit::Templates;
use machine_core::ErrorKind;
use serde_json::{Value, json};

const TEMPLATE: &str = "#cloud-config
# for {{ v }} only
final_message: {{ v }}
packages: [curl-{{ v }}, \"q-{{ v }}\", 'sq-{{ v }}', jq]
bootcmd:
  - done-{{ v }}
  - \"dq {{ v }} end\"
  - 'sq {{ v }} end'
  - |
    literal {{ v }}
    second
  - >-
    folded {{ v }}
  - last
runcmd:
  - [echo, {{ v }}, x-{{ v }}]
  - {{ v }}
x_map: {k-{{ v }}: 1, b: x-{{ v }}, {{ v }}: {{ n }}}
x_list: {{ l }}
";

/// What the template must read as, for value `v` (n = 7, l = [1, "a"]).
fn expected(v: &str) -> Value {
    json!({
        "final_message": v,
        "packages": [format!("curl-{v}"), format!("q-{v}"), format!("sq-{v}"), "jq"],
        "bootcmd": [
            format!("done-{v}"),
            format!("dq {v} end"),
            format!("sq {v} end"),
            format!("literal {v}\nsecond\n"),
            format!("folded {v}"),
            "last",
        ],
        "runcmd": [["echo", v, format!("x-{v}")], v],
        "x_map": {format!("k-{v}"): 1, "b": format!("x-{v}"), v: 7},
        "x_list": [1, "a"],
    })
}

fn corpus() -> Vec<String> {
    let mut c: Vec<String> = [
        "x, evilpkg, y",
        "ok #rest",
        "ok#notacomment",
        "a: b",
        "key: value\nhostname: evil",
        "line1\nline2\n",
        "\n\nleading newlines",
        "trailing\n\n",
        "it's",
        "say \"hi\"",
        "'single'",
        "\"double\"",
        "{a: 1}",
        "{",
        "}",
        "[x, y]",
        "[",
        "]",
        "*anchor",
        "&anchor x",
        "!!binary aGk=",
        "!tag",
        "- item",
        "-",
        "--- doc",
        "...",
        "| literal",
        "> folded",
        "|\n  indented",
        "? complex",
        "%YAML 1.2",
        "@reserved",
        "`backtick`",
        "tab\there",
        "cr\rhere",
        "nel\u{85}here",
        "ls\u{2028}ps\u{2029}",
        "bom\u{feff}",
        "  spaces around  ",
        " ",
        "null",
        "~",
        "true",
        "no",
        "0644",
        "1e3",
        "0x1F",
        "2001-01-01",
        "=",
        "<<",
        "#cloud-config",
        "\\backslash\\",
        "unicode é 漢字 🚀",
        "a,b",
        "a]b}c",
        "x # y: z, [w]",
    ]
    .map(String::from)
    .to_vec();
    // Combinations of the worst characters.
    c.push(": , # [ ] { } * & ! | > ' \" % @ ` - ?\n".repeat(3));
    c
}

#[test]
fn hostile_values_land_exactly_as_text_in_every_position() {
    let mut t = Templates::new();
    t.add("doc.yaml", TEMPLATE).unwrap();
    let mut docs = Vec::new();
    for v in corpus() {
        let ctx = json!({"v": v, "n": 7, "l": [1, "a"]});
        let text = t
            .render("doc.yaml", &ctx)
            .unwrap_or_else(|e| panic!("{v:?}: {e}"));
        let body = text.strip_prefix("#cloud-config\n").expect("header kept");
        let ours: Value =
            serde_saphyr::from_str(body).unwrap_or_else(|e| panic!("{v:?}: {e}\n{text}"));
        assert_eq!(ours, expected(&v), "{v:?}:\n{text}");
        docs.push((v, text));
    }
    // PyYAML, which cloud-init uses, reads the same.
    let texts: Vec<String> = docs.iter().map(|(_, t)| t.clone()).collect();
    for ((v, text), py) in docs.iter().zip(peers::pyyaml_load_all(&texts)) {
        assert_eq!(py, expected(v), "PyYAML read otherwise, {v:?}:\n{text}");
    }
}

#[test]
fn the_issues_two_examples_keep_one_value_each() {
    let mut t = Templates::new();
    t.add(
        "p.yaml",
        "#cloud-config\npackages: [curl-{{ v }}]\nruncmd:\n  - done-{{ w }}\n",
    )
    .unwrap();
    let text = t
        .render("p.yaml", &json!({"v": "x, evilpkg, y", "w": "ok #rest"}))
        .unwrap();
    let py = &peers::pyyaml_load_all(std::slice::from_ref(&text))[0];
    assert_eq!(py["packages"], json!(["curl-x, evilpkg, y"]), "{text}");
    assert_eq!(py["runcmd"], json!(["done-ok #rest"]), "{text}");
    // As a cloud-config the package name is then refused by validation, not split.
    let e = t
        .render_cloud_config("p.yaml", &json!({"v": "x, evilpkg, y", "w": "ok"}), &[])
        .unwrap_err();
    assert_eq!(e.field(), Some("packages[0]"), "{e}");
}

#[test]
fn json_templates_stay_json_with_values_inside_strings() {
    let mut t = Templates::new();
    t.add(
        "c.json",
        "{\"a\": \"x-{{ v }}\", \"b\": {{ v }}, \"n\": {{ n }}}",
    )
    .unwrap();
    for v in corpus() {
        let text = t.render("c.json", &json!({"v": v, "n": 5})).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(
            back,
            json!({"a": format!("x-{v}"), "b": v, "n": 5}),
            "{text}"
        );
    }
}

#[test]
fn values_where_no_scalar_can_hold_them_are_refused_not_emitted() {
    for (source, what) in [
        ("#cloud-config\na: &{{ v }} x\n", "anchor"),
        ("#cloud-config\na: !{{ v }} x\n", "tag"),
    ] {
        let mut t = Templates::new();
        t.add("t.yaml", source).unwrap();
        let e = t.render("t.yaml", &json!({"v": "hunter2"})).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidSpec, "{what}");
        assert_eq!(e.field(), Some("template t.yaml"), "{what}");
        let msg = e.to_string();
        assert!(msg.contains("line 2"), "{what}: {msg}");
        assert!(!msg.contains("hunter2"), "{what}: {msg}");
    }
}
