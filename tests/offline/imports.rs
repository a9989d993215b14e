//! The import graph between the top-level modules of `src/`, read from the source (every
//! `crate::NAME` and `crate::{NAME, ..}` outside comments): it has no cycle once the
//! listed known back edges are set aside, every listed edge still exists (so the list
//! only shrinks), and `docs/architecture.md` shows exactly the graph measured.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Edges that still close a cycle, each with where it comes from. Removing one from the
/// source makes this test fail until it is removed here too.
const KNOWN_BACK_EDGES: &[(&str, &str, &str)] = &[(
    "plan",
    "resources",
    "a plan's Change carries its ResourceSpec and its read stamp the wire's Probes, while every kind's diff builds plan::Change (the typed delta of issue 23 is the fix)",
)];

/// The top-level modules: `src/NAME.rs` and `src/NAME/`.
fn modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(name.strip_suffix(".rs").unwrap_or(&name).to_string())
        })
        .filter(|m| m != "lib" && m != "main")
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The identifier at the start of `s` (after blanks).
fn ident(s: &str) -> &str {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level names one line refers to through `crate::`.
fn referred(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::X, b, c::{..}}`: the names right after `{` and each `,` at depth 1.
            let mut depth = 1;
            let mut start = true;
            for (i, c) in group.char_indices() {
                if start && !c.is_whitespace() {
                    out.push(ident(&group[i..]).to_string());
                    start = false;
                }
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => start = true,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
            }
        } else {
            out.push(ident(rest).to_string());
        }
    }
    out
}

/// `from -> to` with the first `file:line` that makes it.
fn graph() -> BTreeMap<(String, String), String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mods = modules(&src);
    let mut edges = BTreeMap::new();
    for m in &mods {
        let mut files = Vec::new();
        if src.join(m).is_dir() {
            rust_files(&src.join(m), &mut files);
        }
        if src.join(format!("{m}.rs")).is_file() {
            files.push(src.join(format!("{m}.rs")));
        }
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for to in referred(line) {
                    if &to != m && mods.contains(&to) {
                        let at = format!("{}:{}", f.strip_prefix(root).unwrap().display(), n + 1);
                        edges.entry((m.clone(), to)).or_insert(at);
                    }
                }
            }
        }
    }
    edges
}

/// A cycle in `edges`, as the path of modules, if there is one.
fn cycle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    fn visit(
        v: &str,
        edges: &BTreeSet<(String, String)>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(v.to_string(), 1);
        path.push(v.to_string());
        for (_, w) in edges.iter().filter(|(a, _)| a == v) {
            match state.get(w) {
                Some(1) => {
                    let from = path.iter().position(|p| p == w).unwrap();
                    let mut c = path[from..].to_vec();
                    c.push(w.clone());
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(w, edges, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(v.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    let starts: BTreeSet<&String> = edges.iter().map(|(a, _)| a).collect();
    for v in starts {
        if !state.contains_key(v.as_str())
            && let Some(c) = visit(v, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_reader_sees_plain_and_grouped_paths() {
    assert_eq!(referred("use crate::plan::Action;"), ["plan"]);
    assert_eq!(
        referred("use crate::{plan::{Action, Change}, resources, render::x};"),
        ["plan", "resources", "render"]
    );
    assert_eq!(
        referred("a: crate::gpu::X, b: crate::hub::Y"),
        ["gpu", "hub"]
    );
}

#[test]
fn the_finder_finds_a_cycle() {
    let e = |a: &str, b: &str| (a.to_string(), b.to_string());
    let edges: BTreeSet<_> = [e("a", "b"), e("b", "c"), e("c", "a"), e("c", "d")].into();
    assert_eq!(cycle(&edges).unwrap(), ["a", "b", "c", "a"]);
    let edges: BTreeSet<_> = [e("a", "b"), e("b", "c"), e("a", "c")].into();
    assert_eq!(cycle(&edges), None);
}

#[test]
fn top_level_modules_import_each_other_without_a_cycle() {
    let measured = graph();
    for (from, to, why) in KNOWN_BACK_EDGES {
        assert!(
            measured.contains_key(&(from.to_string(), to.to_string())),
            "{from} -> {to} is gone ({why}): remove it from KNOWN_BACK_EDGES and docs/architecture.md"
        );
    }
    let edges: BTreeSet<(String, String)> = measured
        .keys()
        .filter(|(a, b)| !KNOWN_BACK_EDGES.iter().any(|(f, t, _)| a == f && b == t))
        .cloned()
        .collect();
    if let Some(c) = cycle(&edges) {
        let steps: Vec<String> = c
            .windows(2)
            .map(|w| {
                let at = &measured[&(w[0].clone(), w[1].clone())];
                format!("{} -> {} ({at})", w[0], w[1])
            })
            .collect();
        panic!(
            "import cycle between top-level modules:\n  {}",
            steps.join("\n  ")
        );
    }
}

#[test]
fn the_architecture_doc_shows_the_measured_graph() {
    let measured = graph();
    let mut by_module: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in measured.keys() {
        by_module.entry(a).or_default().push(b);
    }
    let want: Vec<String> = by_module
        .iter()
        .map(|(a, bs)| format!("{a} -> {}", bs.join(" ")))
        .collect();
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .unwrap();
    let block = doc
        .split_once("<!-- imports: measured by tests/offline/imports.rs -->\n```\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .expect("docs/architecture.md has the measured import block");
    let shown: Vec<String> = block.lines().map(str::to_string).collect();
    assert_eq!(
        shown,
        want,
        "docs/architecture.md's import block is not the measured graph; it should read:\n{}",
        want.join("\n")
    );
}
