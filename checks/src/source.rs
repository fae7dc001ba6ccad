//! Reading Rust sources as the checks need them: every file under a directory, and the code
//! of a file without its comments and the contents of its literals.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
///
/// # Errors
/// The file system's.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The source without comments, the contents of string and character literals, and a
/// trailing inline test module. Literals are followed across lines (a message continued with
/// `\` may hold words such as `use`, which are no code) and raw strings to their own closing
/// `"#`; a `'` starts a character literal only where one closes (`'a'`, `'\n'`), otherwise it
/// is a lifetime. Line breaks stay, so the test module is still found line by line.
pub(crate) fn code_of(text: &str) -> String {
    let stripped = without_comments_and_literals(text);
    let mut lines: Vec<&str> = stripped.lines().collect();
    if let Some(at) = lines.windows(2).position(|pair| {
        pair[0].trim() == "#[cfg(test)]" && pair[1].trim_start().starts_with("mod ")
    }) {
        lines.truncate(at);
    }
    lines.join("\n")
}

/// `text` without comments and with string and character literals emptied (`""`, `' '`),
/// line breaks kept: see [`code_of`].
pub(crate) fn without_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let word_before = |out: &str| {
        out.chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '/' if next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                let (mut depth, mut j) = (0usize, i);
                while j < chars.len() {
                    if chars[j] == '/' && chars.get(j + 1) == Some(&'*') {
                        depth += 1;
                        j += 2;
                    } else if chars[j] == '*' && chars.get(j + 1) == Some(&'/') {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        if chars[j] == '\n' {
                            out.push('\n');
                        }
                        j += 1;
                    }
                }
                i = j;
            }
            'r' if !word_before(&out) && matches!(next, Some('#' | '"')) => {
                let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
                if chars.get(i + 1 + hashes) != Some(&'"') {
                    out.push(c);
                    i += 1;
                    continue;
                }
                out.push_str("\"\"");
                let mut j = i + 2 + hashes;
                while j < chars.len() {
                    let closes = chars[j] == '"'
                        && chars[j + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|&&c| c == '#')
                            .count()
                            == hashes;
                    if closes {
                        j += 1 + hashes;
                        break;
                    }
                    if chars[j] == '\n' {
                        out.push('\n');
                    }
                    j += 1;
                }
                i = j;
            }
            '"' => {
                out.push_str("\"\"");
                let mut j = i + 1;
                while j < chars.len() && chars[j] != '"' {
                    if chars[j] == '\n' {
                        out.push('\n');
                    }
                    j += if chars[j] == '\\' { 2 } else { 1 };
                }
                i = j + 1;
            }
            '\'' => {
                // A character literal is `'x'` or `'\…'`; anything else is a lifetime.
                let close = match next {
                    Some('\\') => chars[i + 2..]
                        .iter()
                        .position(|&c| c == '\'')
                        .map(|at| i + 2 + at),
                    Some(_) if chars.get(i + 2) == Some(&'\'') => Some(i + 2),
                    _ => None,
                };
                match close {
                    Some(end) => {
                        out.push_str("' '");
                        i = end + 1;
                    }
                    None => {
                        out.push(c);
                        i += 1;
                    }
                }
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}
