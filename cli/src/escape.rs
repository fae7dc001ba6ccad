//! Stored strings made safe for a terminal: tensor names, metadata, keys, file names and the
//! errors that quote them come from storage, which anyone with write access to a bucket or a
//! directory can fill. Shown raw, an ESC sequence, a carriage return or a newline in a name
//! rewrites what the terminal shows (a forged `ok:` line); shown through [`escaped`], each
//! control character is an escape that reads as what it is. JSON output needs none of this:
//! serde_json escapes control characters itself, and a program reading it gets the exact
//! string.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with every control character, and every Unicode character that reorders the text
/// around it (bidirectional overrides and isolates), written as an escape: `\n`, `\r`, `\t`,
/// `\x1b`, `\u{202e}`. A backslash is doubled, so an escape in the output was never in the
/// name.
pub(crate) fn escaped(text: &str) -> Cow<'_, str> {
    let plain = |c: char| !c.is_control() && !reorders(c) && c != '\\';
    if text.chars().all(plain) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() && u32::from(c) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() || reorders(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Whether `c` changes the display order of the text around it (the bidirectional embedding,
/// override and isolate controls, and the marks), so a name could show as another.
fn reorders(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::escaped;

    #[test]
    fn control_characters_are_shown_as_escapes() {
        assert_eq!(escaped("layer.0.weight"), "layer.0.weight");
        assert_eq!(
            escaped("w\r\x1b[2Kok: every checksum matches\n"),
            "w\\r\\x1b[2Kok: every checksum matches\\n"
        );
        assert_eq!(escaped("a\tb\u{7f}\u{85}"), "a\\tb\\x7f\\u{85}");
        assert_eq!(escaped("abc\u{202e}gpj.exe"), "abc\\u{202e}gpj.exe");
        assert_eq!(escaped("already \\n escaped"), "already \\\\n escaped");
        assert_eq!(escaped("名前"), "名前");
    }
}
