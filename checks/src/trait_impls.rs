//! Implementations that name every method of their trait. A trait method with a default body
//! is a trap for a wrapper: one that forwards what it thinks of and leaves a method out gets the
//! default, which for `Storage::list` answers `Unsupported`, and a feature that starts to call
//! it through the wrapper fails only when it runs. So every `impl … Trait for …` block in the
//! workspace, tests included, names each method, forwarding or answering on purpose.

use crate::source::without_comments_and_literals;

/// The methods `trait_name`'s definition (`pub trait Name …{ … }`) in `source` declares, in
/// order; empty when `source` does not define it.
pub fn trait_methods(source: &str, trait_name: &str) -> Vec<String> {
    let code = without_comments_and_literals(source);
    block_after(&code, &format!("trait {trait_name}")).map_or_else(Vec::new, fn_names)
}

/// Each `impl … {trait_name} for Type { … }` in `source` that leaves out some of `methods`:
/// the implementing type as written, and the methods it leaves out.
pub fn impls_leaving_out(
    source: &str,
    trait_name: &str,
    methods: &[String],
) -> Vec<(String, Vec<String>)> {
    let code = without_comments_and_literals(source);
    let mut found = Vec::new();
    let needle = format!("{trait_name} for ");
    let mut offset = 0;
    while let Some(at) = code[offset..].find(&needle).map(|at| offset + at) {
        offset = at + needle.len();
        // `impl<S: Storage> Storage for Faulty<S>` and `impl weightbay::Storage for X` alike:
        // the line starts with `impl`, and the trait's name is a whole path segment.
        let line_start = code[..at].rfind('\n').map_or(0, |n| n + 1);
        let head = code[line_start..at].trim_start();
        let segment_start = code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if !head.starts_with("impl") || !segment_start {
            continue;
        }
        let Some(open) = code[offset..].find('{').map(|o| offset + o) else {
            break;
        };
        let implementor = code[offset..open].trim().to_owned();
        let Some(body) = block_at(&code, open) else {
            break;
        };
        let mut named = fn_names(body);
        named.extend(forwarded_names(body));
        let left_out: Vec<String> = methods
            .iter()
            .filter(|method| !named.contains(method))
            .cloned()
            .collect();
        if !left_out.is_empty() {
            found.push((implementor, left_out));
        }
    }
    found
}

/// The body of the block that follows the first `head` in `code`.
fn block_after<'a>(code: &'a str, head: &str) -> Option<&'a str> {
    let after = code.find(head)? + head.len();
    let open = after + code[after..].find('{')?;
    block_at(code, open)
}

/// The text between the brace at `open` and its matching closing brace.
fn block_at(code: &str, open: usize) -> Option<&str> {
    let mut depth = 0usize;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&code[open + 1..open + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The methods a block forwards by name with `weightbay`'s `forward_storage!` or
/// `forward_sink!` (`forward_storage!(inner => capabilities, open)`): named on purpose too.
fn forwarded_names(body: &str) -> Vec<String> {
    let mut names = Vec::new();
    for macro_name in ["forward_storage!", "forward_sink!"] {
        let mut rest = body;
        while let Some(at) = rest.find(macro_name) {
            rest = &rest[at + macro_name.len()..];
            let Some(arguments) = rest.split(')').next() else {
                break;
            };
            if let Some((_, methods)) = arguments.split_once("=>") {
                names.extend(
                    methods
                        .split(',')
                        .map(str::trim)
                        .filter(|name| !name.is_empty())
                        .map(str::to_owned),
                );
            }
        }
    }
    names
}

/// The names of the functions a block declares at its own level (not those nested in their
/// bodies).
fn fn_names(body: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut rest = body;
    while let Some(at) = rest.find(['{', '}', 'f']) {
        let c = rest[at..].chars().next().unwrap_or(' ');
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            _ => {
                let word_start = rest[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
                if depth == 0 && word_start && rest[at..].starts_with("fn ") {
                    let name: String = rest[at + 3..]
                        .trim_start()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    names.push(name);
                }
            }
        }
        rest = &rest[at + 1..];
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRAIT: &str = "
pub trait Storage: Send + Sync {
    /// What it can do.
    fn capabilities(&self) -> u8;
    fn open(&self, key: &str) -> u8;
    /// Its default answers Unsupported { like this }.
    fn list(&self, prefix: &str) -> u8 {
        let inner = || { 0 };
        inner()
    }
}
";

    #[test]
    fn the_trait_s_methods_are_read_and_a_left_out_one_is_named() {
        let methods = trait_methods(TRAIT, "Storage");
        assert_eq!(methods, ["capabilities", "open", "list"]);
        let source = "
impl Storage for Whole {
    fn capabilities(&self) -> u8 { 1 }
    fn open(&self, key: &str) -> u8 { fn helper() {} 2 }
    fn list(&self, prefix: &str) -> u8 { 3 }
}
// impl Storage for InAComment { }
#[deny(clippy::missing_trait_methods)]
impl<S: Storage> weightbay::Storage for Wrapper<S> {
    fn capabilities(&self) -> u8 { self.0.capabilities() }
    fn open(&self, key: &str) -> u8 { let s = \"fn list(\"; self.0.open(key) }
}
impl SomeStorage for Other { fn capabilities(&self) -> u8 { 0 } }
impl Storage for Forwarding {
    fn open(&self, key: &str) -> u8 { 2 }
    weightbay::forward_storage!(gate.inner => capabilities, list);
}
impl Storage for ForwardingTooLittle {
    forward_storage!(inner => capabilities, open);
}
";
        assert_eq!(
            impls_leaving_out(source, "Storage", &methods),
            [
                ("Wrapper<S>".to_owned(), vec!["list".to_owned()]),
                ("ForwardingTooLittle".to_owned(), vec!["list".to_owned()])
            ]
        );
    }
}
