//! Text that came from the machine, made safe to show: command output in errors and
//! in the debug log, process names, file owners. A terminal interprets ESC, BEL, CR and
//! the other control characters; like OpenSSH, they are shown escaped instead.

/// `bytes` as text (invalid UTF-8 replaced), with every control character but newline
/// and tab escaped as `\xNN` (`\u{NN}` above 0xff, for the C1 controls).
pub(crate) fn shown(bytes: &[u8]) -> String {
    escape_controls(&String::from_utf8_lossy(bytes))
}

/// `text` with every control character but newline and tab escaped (see [`shown`]).
pub(crate) fn escape_controls(text: &str) -> String {
    if !text.chars().any(needs_escape) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if needs_escape(c) {
            let n = u32::from(c);
            if n <= 0xff {
                out.push_str(&format!("\\x{n:02x}"));
            } else {
                out.push_str(&format!("\\u{{{n:x}}}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn needs_escape(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_but_newline_and_tab_are_escaped() {
        assert_eq!(
            shown(b"a\x1b[31mred\x07\r\n\tb\x7f"),
            "a\\x1b[31mred\\x07\\x0d\n\tb\\x7f"
        );
        assert_eq!(escape_controls("\u{9b}x"), "\\x9bx");
        assert_eq!(escape_controls("plain é"), "plain é");
        assert_eq!(shown(b"\xff"), "\u{fffd}");
    }
}
