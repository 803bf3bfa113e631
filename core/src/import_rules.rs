//! The import rules of ARCHITECTURE.md ("Import rules"), checked on the
//! sources.
//!
//! The crate's top-level modules are layered: the leaf modules, then the
//! pure decisions (`decide`), then the cache port and the observer, then the
//! environment (`env`: clock, randomness, observer), then the components that
//! use them. A module names only modules below it, so the
//! port never depends on its consumers and there is no import cycle. Nothing
//! in the compiler keeps it so — a `use` in the wrong direction compiles — so
//! this test reads every `.rs` file under `src/` and fails, naming the file
//! and the line, on a path that breaks the rules.
//!
//! It reads `crate::…` paths, in `use` lines and in code alike, and `super::…`
//! paths that climb out of their top-level module; a name the crate root
//! re-exports (`crate::CircuitState`) counts as the module it comes from.
//! Comments and string literals are skipped: a doc link is no dependency.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The leaf modules: each names no module but other leaves.
const LEAVES: &[&str] = &["time", "tenant", "error", "clock", "random", "mutants"];

/// Which top-level modules each top-level module may name, besides itself
/// and the leaves. A module missing here fails the test: a new module must
/// be given its place.
const RULES: &[(&str, &[&str])] = &[
    ("time", &[]),
    ("tenant", &[]),
    ("error", &[]),
    ("clock", &[]),
    ("random", &[]),
    ("mutants", &[]),
    ("decide", &[]),
    ("cache", &["decide"]),
    ("observe", &["decide"]),
    ("env", &["observe"]),
    ("limiter", &["decide", "cache", "observe", "env"]),
    ("breaker", &["decide", "cache", "observe", "env"]),
    ("retry", &["decide", "cache", "observe", "env", "limiter"]),
    (
        "provider",
        &["decide", "cache", "observe", "env", "limiter", "breaker", "retry"],
    ),
    (
        "testing",
        &[
            "decide", "cache", "observe", "env", "limiter", "breaker", "retry", "provider",
        ],
    ),
    (
        "tower",
        &[
            "decide", "cache", "observe", "env", "limiter", "breaker", "retry", "provider",
        ],
    ),
    ("metrics", &["decide", "observe"]),
    ("import_rules", &[]),
];

/// One path that names another top-level module.
#[derive(Debug, PartialEq, Eq)]
struct Import {
    line: usize,
    /// The top-level module named.
    target: String,
    /// The path as written, for the message.
    path: String,
}

/// A broken rule: which file, which line, what it named.
fn violations(file: &str, module: &str, imports: &[Import]) -> Vec<String> {
    let allowed = match RULES.iter().find(|(m, _)| *m == module) {
        Some((_, allowed)) => *allowed,
        None => return vec![format!("{file}: module `{module}` has no place in the import rules")],
    };
    imports
        .iter()
        .filter(|i| i.target != module)
        .filter(|i| !allowed.contains(&i.target.as_str()) && !LEAVES.contains(&i.target.as_str()))
        .map(|i| {
            format!(
                "{file}:{}: `{module}` may not import `{}` (`{}`)",
                i.line, i.target, i.path
            )
        })
        .collect()
}

/// `src` with comments and the insides of string and character literals
/// blanked, newlines kept (so line numbers stay), `"…"` left as `""`.
fn code_only(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push_str("\"\"");
            j += 1;
            while j < chars.len() {
                if chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                if chars[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            i = j;
        } else if c == '"' {
            out.push_str("\"\"");
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if chars.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{..}'), or a lifetime.
            if next == Some('\\') {
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether the character before `i` continues an identifier (so an `r` at
/// `i` is not a raw string's prefix).
fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// A token of the code: an identifier, `::`, or one other character.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Path,
    Punct(char),
}

fn tokens(code: &str) -> Vec<(usize, Token)> {
    let mut out = Vec::new();
    let mut line = 1;
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((line, Token::Ident(chars[start..i].iter().collect())));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push((line, Token::Path));
            i += 2;
        } else {
            out.push((line, Token::Punct(c)));
            i += 1;
        }
    }
    out
}

/// The top-level modules `code` names, for a file of module `file_module`
/// (its path from the crate root: `["cache", "memory"]`). `root_names` maps
/// a name the crate root re-exports to the module it comes from.
fn imports(code: &str, file_module: &[String], root_names: &HashMap<String, String>) -> Vec<Import> {
    let toks = tokens(&code_only(code));
    let mut found = Vec::new();
    // Inline modules (`mod tests { … }`) open inside the file: their names,
    // with the brace depth each closes at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let ident = |k: usize| match toks.get(k) {
        Some((_, Token::Ident(s))) => Some(s.as_str()),
        _ => None,
    };
    let mut k = 0;
    while k < toks.len() {
        let (line, tok) = &toks[k];
        match tok {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            Token::Ident(kw) if kw == "mod" => {
                if let (Some(name), Some((_, Token::Punct('{')))) = (ident(k + 1), toks.get(k + 2)) {
                    inline.push((name.to_owned(), depth + 1));
                }
            }
            Token::Ident(start)
                if (start == "crate" || start == "super")
                    && toks.get(k + 1).map(|t| &t.1) == Some(&Token::Path)
                    && !matches!(toks.get(k.wrapping_sub(1)).map(|t| &t.1), Some(Token::Path)) =>
            {
                // `j` moves to the path's first segment past its start.
                let mut j = k;
                if start == "super" {
                    // The module the path climbs to.
                    let mut base = file_module.to_vec();
                    base.extend(inline.iter().map(|(n, _)| n.clone()));
                    while ident(j) == Some("super") && toks.get(j + 1).map(|t| &t.1) == Some(&Token::Path) {
                        base.pop();
                        j += 2;
                    }
                    if !base.is_empty() {
                        // Still inside a top-level module: not a crate path.
                        k = j;
                        continue;
                    }
                } else {
                    j += 2;
                }
                let prefix: String = toks[k..j]
                    .iter()
                    .map(|(_, t)| match t {
                        Token::Ident(s) => s.clone(),
                        Token::Path => "::".to_owned(),
                        Token::Punct(c) => c.to_string(),
                    })
                    .collect();
                for first in first_segments(&toks, j) {
                    let path = format!("{prefix}{first}");
                    // A module by its name; a name the root re-exports, by
                    // the module it comes from.
                    let target = if RULES.iter().any(|(m, _)| *m == first) {
                        first
                    } else {
                        root_names.get(&first).cloned().unwrap_or(first)
                    };
                    found.push(Import {
                        line: *line,
                        target,
                        path,
                    });
                }
                k = j;
                continue;
            }
            _ => {}
        }
        k += 1;
    }
    found
}

/// The first segment of each path that starts at token `j`: one for
/// `limiter::X`, one per member for a group `{limiter::X, cache}`.
fn first_segments(toks: &[(usize, Token)], j: usize) -> Vec<String> {
    match toks.get(j).map(|t| &t.1) {
        Some(Token::Ident(s)) => vec![s.clone()],
        Some(Token::Punct('{')) => {
            let mut out = Vec::new();
            let mut depth = 0;
            let mut expect_first = true;
            for (_, t) in &toks[j..] {
                match t {
                    Token::Punct('{') => {
                        depth += 1;
                        if depth == 1 {
                            expect_first = true;
                        }
                    }
                    Token::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Token::Punct(',') if depth == 1 => expect_first = true,
                    Token::Ident(s) if depth == 1 && expect_first => {
                        out.push(s.clone());
                        expect_first = false;
                    }
                    _ => {
                        if depth == 1 {
                            expect_first = false;
                        }
                    }
                }
            }
            out
        }
        _ => Vec::new(),
    }
}

/// The names the crate root re-exports (`pub use breaker::{CircuitBreaker, …}`),
/// each mapped to the module it comes from.
fn root_names(lib: &str) -> HashMap<String, String> {
    let toks = tokens(&code_only(lib));
    let mut names = HashMap::new();
    let mut k = 0;
    while k < toks.len() {
        let is_use = matches!((&toks[k].1, toks.get(k + 1).map(|t| &t.1)), (Token::Ident(p), Some(Token::Ident(u))) if p == "pub" && u == "use");
        if let (true, Some((_, Token::Ident(module)))) = (is_use, toks.get(k + 2)) {
            let mut j = k + 3;
            while j < toks.len() && toks[j].1 != Token::Punct(';') {
                if let Token::Ident(name) = &toks[j].1 {
                    names.entry(name.clone()).or_insert_with(|| module.clone());
                }
                j += 1;
            }
            k = j;
        }
        k += 1;
    }
    names
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's module path from the crate root: `cache/memory/mod.rs` is
/// `["cache", "memory"]`, `observe.rs` is `["observe"]`, `lib.rs` is `[]`.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

#[test]
fn no_module_imports_against_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let roots = root_names(&fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut broken = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(&src).unwrap();
        let module = module_of(relative);
        let Some(top) = module.first() else {
            continue; // lib.rs declares and re-exports every module.
        };
        let code = fs::read_to_string(path).unwrap();
        let found = imports(&code, &module, &roots);
        broken.extend(violations(&relative.display().to_string(), top, &found));
    }
    assert!(
        files.len() > 40,
        "read only {} files under {}",
        files.len(),
        src.display()
    );
    assert!(broken.is_empty(), "imports against the rules:\n{}", broken.join("\n"));
}

#[test]
fn the_checker_sees_a_forbidden_path_however_it_is_written() {
    let roots = HashMap::from([("CircuitState".to_owned(), "breaker".to_owned())]);
    let cache = ["cache".to_owned(), "memory".to_owned()];
    let targets = |code: &str| -> Vec<(usize, String)> {
        imports(code, &cache, &roots)
            .into_iter()
            .map(|i| (i.line, i.target))
            .collect()
    };
    let t = |line: usize, target: &str| (line, target.to_owned());
    assert_eq!(targets("use crate::limiter::SlotOutcome;"), [t(1, "limiter")]);
    assert_eq!(
        targets("use crate::{\n    decide::window::decide,\n    retry::BudgetStep,\n};"),
        [t(1, "decide"), t(1, "retry")]
    );
    assert_eq!(
        targets("fn f() { crate::provider::route::least_loaded(&[], &[]); }"),
        [t(1, "provider")]
    );
    assert_eq!(targets("use crate::CircuitState;"), [t(1, "breaker")]);
    assert_eq!(targets("\n\nuse super::super::breaker::Permit;"), [t(3, "breaker")]);
    // Within the module, and in comments, strings and characters: nothing.
    assert_eq!(targets("use super::ring::Ring;\nmod tests {\n    use super::*;\n}"), []);
    assert_eq!(
        targets(
            "// crate::limiter\n/* crate::retry */ let s = \"crate::provider\"; let c = '\"'; let r = r#\"crate::breaker\"#;"
        ),
        []
    );
    assert_eq!(
        violations(
            "cache/memory/mod.rs",
            "cache",
            &imports("\nuse crate::limiter::SlotOutcome;", &cache, &roots)
        ),
        ["cache/memory/mod.rs:2: `cache` may not import `limiter` (`crate::limiter`)"]
    );
    assert!(violations("x.rs", "cache", &imports("use crate::clock::Clock;", &cache, &roots)).is_empty());
    assert_eq!(
        violations("clock.rs", "clock", &imports("use crate::decide::window;", &[], &roots)),
        ["clock.rs:1: `clock` may not import `decide` (`crate::decide`)"]
    );
    assert_eq!(
        violations("new.rs", "new", &[]),
        ["new.rs: module `new` has no place in the import rules"]
    );
}
