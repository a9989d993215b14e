//! Reading an inventory file: bytes to typed [`Inventory`], every failure a [`Diagnostic`]
//! with `file:line:col`, never a panic.

use std::path::{Path, PathBuf};

use serde_saphyr::options::AliasLimits;

use super::node::Inventory;
use super::secret::INLINE_SECRET_ERROR;
use super::spanned::Pos;
use crate::diagnostic::{Diagnostic, Diagnostics, SourceLocation, source_lines};

/// Inventories are small; anything larger is a mistake (or an attack).
const MAX_INVENTORY_BYTES: usize = 4 * 1024 * 1024;

/// An inventory with the text it was read from, so later checks can point into it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The file as the user named it.
    pub path: PathBuf,
    /// The folder relative paths in the inventory are taken from.
    pub base_dir: PathBuf,
    /// The file's text.
    pub source: String,
    /// The parsed inventory.
    pub inventory: Inventory,
}

impl Loaded {
    /// A diagnostic at `pos` in this file (no location when `pos` is unknown).
    pub fn diag(&self, pos: Pos, message: impl Into<String>) -> Diagnostic {
        diagnostic_at(&self.path, &self.source, pos, message)
    }

    /// Where the top-level `key:` is written, for errors about a whole mapping (which keeps
    /// no position of its own); the file's start when it is not on a line of its own.
    pub fn top_level_pos(&self, key: &str) -> Pos {
        let line = source_lines(&self.source)
            .position(|l| l.strip_prefix(key).is_some_and(|r| r.starts_with(':')));
        Pos {
            line: line.map_or(1, |i| i as u32 + 1),
            column: 1,
        }
    }
}

/// A diagnostic at `pos` in `file` (whose text is `source`); without a known position, it
/// names the file.
pub fn diagnostic_at(
    file: &Path,
    source: &str,
    pos: Pos,
    message: impl Into<String>,
) -> Diagnostic {
    let d = Diagnostic::new(message);
    if pos.is_known() {
        d.at(SourceLocation::new(
            file,
            source,
            pos.line as usize,
            pos.column as usize,
            0,
        ))
    } else {
        d.cause(format!("in {}", file.display()))
    }
}

/// Reads and parses `path`. Only syntax and types are checked here; see
/// [`super::validate`] for the rules between values.
pub fn load(path: &Path) -> Result<Loaded, Diagnostics> {
    let bytes = std::fs::read(path).map_err(|e| {
        Diagnostics(vec![
            Diagnostic::new(format!("cannot read {}", path.display()))
                .cause(e.to_string())
                .hint("check the path; inventories usually live under inventory/"),
        ])
    })?;
    let base_dir = path
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let inventory_and_source = parse_bytes(path, &bytes).map_err(|d| Diagnostics(vec![d]))?;
    let (inventory, source) = inventory_and_source;
    Ok(Loaded {
        path: path.to_path_buf(),
        base_dir,
        source,
        inventory,
    })
}

/// Parses inventory text; `path` is only used in messages.
pub fn parse_bytes(path: &Path, bytes: &[u8]) -> Result<(Inventory, String), Diagnostic> {
    if bytes.len() > MAX_INVENTORY_BYTES {
        return Err(Diagnostic::new(format!(
            "{} is {} bytes; an inventory is at most {} bytes",
            path.display(),
            bytes.len(),
            MAX_INVENTORY_BYTES
        ))
        .hint("is this the right file?"));
    }
    let source = match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(e) => {
            let good = std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default();
            let line = source_lines(good).count();
            let column = source_lines(good).last().unwrap_or("").chars().count() + 1;
            return Err(Diagnostic::new("the inventory is not UTF-8 text")
                .at(SourceLocation {
                    file: path.to_path_buf(),
                    line,
                    column,
                    width: 1,
                    line_text: String::new(),
                })
                .cause(format!("invalid byte at offset {}", e.valid_up_to()))
                .hint("an inventory is a YAML text file; is this the right file?"));
        }
    };
    if source.trim().is_empty()
        || source_lines(&source).all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        return Err(Diagnostic::new(format!("{} is empty", path.display()))
            .at(SourceLocation::new(path, &source, 1, 1, 0))
            .hint("an inventory needs at least `nodes:`; see inventory/llm-two.yaml"));
    }
    parse_yaml::<Inventory>(path, &source).map(|inv| (inv, source))
}

/// Parses YAML text into `T` with the project's options (duplicate keys refused, alias
/// bombs refused, strict booleans); every error a [`Diagnostic`] pointing into `path`.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(
    path: &Path,
    source: &str,
) -> Result<T, Diagnostic> {
    // Inventories and roles are small; a document that expands past these limits is an
    // alias bomb.
    let mut alias_limits = AliasLimits::default();
    alias_limits.max_total_replayed_events = 100_000;
    alias_limits.max_replay_stack_depth = 16;
    alias_limits.max_alias_expansions_per_anchor = 1_000;
    let options = serde_saphyr::options! {
        alias_limits: alias_limits,
        strict_booleans: true,
    };
    serde_saphyr::from_str_with_options::<T>(source, options)
        .map_err(|e| to_diagnostic(path, source, &e))
}

fn to_diagnostic(path: &Path, source: &str, err: &serde_saphyr::Error) -> Diagnostic {
    use serde_saphyr::Error as E;
    let mut hints = Vec::new();
    let mut width = 0;
    // Errors arrive wrapped (with a snippet, or as raised inside an alias): use the inner one.
    let mut inner = err.without_snippet();
    while let E::AliasError { error, .. } = inner {
        inner = error.without_snippet();
    }
    let message = match inner {
        E::SerdeUnknownField {
            field, expected, ..
        } => {
            if let Some(best) = did_you_mean(field, expected) {
                hints.push(format!("did you mean `{best}`?"));
            } else if !expected.is_empty() {
                hints.push(format!("known fields here: {}", expected.join(", ")));
            }
            width = field.chars().count();
            format!("unknown field `{field}`")
        }
        E::SerdeUnknownVariant {
            variant, expected, ..
        } => {
            if let Some(best) = did_you_mean(variant, expected) {
                hints.push(format!("did you mean `{best}`?"));
            } else {
                hints.push(format!("expected one of: {}", expected.join(", ")));
            }
            format!("unknown value `{variant}`")
        }
        E::DuplicateMappingKey { key, .. } => {
            hints.push(
                "each key may appear once in a mapping; remove or merge the repeated one".into(),
            );
            match key {
                Some(k) => format!("duplicate key `{k}`"),
                None => "duplicate key".to_string(),
            }
        }
        E::SerdeMissingField { field, .. } => {
            hints.push(format!("add `{field}:` to this mapping"));
            format!("missing field `{field}`")
        }
        E::SerdeInvalidType {
            unexpected,
            expected,
            ..
        } => {
            format!("expected {expected}, found {unexpected}")
        }
        E::SerdeInvalidValue {
            unexpected,
            expected,
            ..
        } => {
            format!("invalid value {unexpected}, expected {expected}")
        }
        E::Message { msg, .. } => explain_unknown(msg, &mut hints, &mut width),
        E::Unexpected { expected, location } => {
            let found = source_lines(source)
                .nth((location.line() as usize).saturating_sub(1))
                .and_then(|l| {
                    l.chars()
                        .nth((location.column() as usize).saturating_sub(1))
                });
            match found {
                Some('[') | Some('-') => "expected a single value here, found a list".to_string(),
                Some('{') => "expected a single value here, found a mapping".to_string(),
                _ => format!("expected {expected}"),
            }
        }
        E::Eof { .. } => "unexpected end of the file".to_string(),
        E::AliasReplayLimitExceeded { .. }
        | E::AliasExpansionLimitExceeded { .. }
        | E::AliasReplayStackDepthExceeded { .. }
        | E::Budget { .. } => {
            hints.push("the file expands to far more data than an inventory holds (an alias bomb?); remove the repeated aliases".into());
            format!(
                "refused: {}",
                strip_location(&format!("{:?}", err.without_snippet()))
            )
        }
        other => explain_unknown(
            &strip_location(&format!("{other:?}")),
            &mut hints,
            &mut width,
        ),
    };
    if message.starts_with("unclosed") || message.starts_with("unexpected end") {
        hints.push("the file ends in the middle of a value; is it truncated?".into());
    }
    // Our own value checks carry their hints inside serde's text (see `text::ValueError`).
    let value = super::text::ValueError::from_message(&message);
    let head = value.message;
    hints.splice(0..0, value.hints);
    let mut diag = Diagnostic::new(head.clone());
    if let Some(loc) = err.location().filter(|l| l.line() > 0) {
        let mut loc = SourceLocation::new(
            path,
            source,
            loc.line() as usize,
            loc.column() as usize,
            width,
        );
        if head.starts_with(INLINE_SECRET_ERROR) {
            // The line holds the secret itself: point at it, never print it.
            loc.line_text.clear();
        }
        diag = diag.at(loc);
    }
    for h in hints {
        diag = diag.hint(h);
    }
    diag
}

/// Errors from inside nested values can arrive as serde's text rather than as typed
/// variants: turn `unknown field `x`, expected one of ...` into a message and a hint.
fn explain_unknown(msg: &str, hints: &mut Vec<String>, width: &mut usize) -> String {
    let Some((what, word, expected)) = parse_unknown(msg) else {
        return msg.to_string();
    };
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    match did_you_mean(&word, &expected) {
        Some(best) => hints.push(format!("did you mean `{best}`?")),
        None if !expected.is_empty() => {
            hints.push(format!("expected one of: {}", expected.join(", ")))
        }
        None => {}
    }
    if what == "field" {
        *width = word.chars().count();
        format!("unknown field `{word}`")
    } else {
        format!("unknown value `{word}`")
    }
}

/// Reads serde's `unknown field `x`, expected one of `a`, `b`` (or `unknown variant`) text:
/// what was unknown, the word, and the expected words.
fn parse_unknown(msg: &str) -> Option<(&'static str, String, Vec<String>)> {
    let (what, rest) = if let Some(r) = msg.strip_prefix("unknown field `") {
        ("field", r)
    } else if let Some(r) = msg.strip_prefix("unknown variant `") {
        ("variant", r)
    } else {
        return None;
    };
    let (word, tail) = rest.split_once('`')?;
    let expected = tail
        .split_once("expected one of ")
        .or_else(|| tail.split_once("expected "))
        .map(|(_, list)| {
            list.split(", ")
                .map(|w| w.trim_matches(|c| c == '`' || c == ' ').to_string())
                .filter(|w| !w.is_empty())
                .collect()
        })
        .unwrap_or_default();
    Some((what, word.to_string(), expected))
}

/// Drops the crate's trailing ` at line L, column C`, which the snippet already shows.
fn strip_location(s: &str) -> String {
    match s.rfind(" at line ") {
        Some(i) if s[i..].contains(", column ") => s[..i].to_string(),
        _ => s.to_string(),
    }
}

/// The closest candidate to `word`, if one is close enough to be a likely typo.
pub fn did_you_mean<'a, S: AsRef<str>>(word: &str, candidates: &'a [S]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (c.as_ref(), strsim::jaro_winkler(word, c.as_ref())))
        .filter(|(_, score)| *score > 0.8)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(yaml: &str) -> String {
        parse_bytes(Path::new("t.yaml"), yaml.as_bytes())
            .unwrap_err()
            .render(false)
    }

    #[test]
    fn unknown_field_suggests() {
        let e = err("nodez: {}\n");
        assert!(e.contains("unknown field `nodez`"), "{e}");
        assert!(e.contains("did you mean `nodes`?"), "{e}");
        assert!(e.contains("t.yaml:1:1"), "{e}");
    }

    #[test]
    fn duplicate_key_and_empty_and_binary() {
        assert!(err("nodes: {}\nnodes: {}\n").contains("duplicate key `nodes`"));
        // A lone `\r` ends a line in YAML: the file is not only a comment.
        let cr = err("# a comment\rnodes: {}\rnodes: {}\r");
        assert!(
            cr.contains("duplicate key") && cr.contains("t.yaml:3:1"),
            "{cr}"
        );
        let empty = err("# only a comment\n");
        // Found by fuzzing: the one error without a position.
        assert!(
            empty.contains("is empty") && empty.contains("t.yaml:1:1"),
            "{empty}"
        );
        let bin = parse_bytes(Path::new("t.yaml"), b"nodes:\n  \xff\xfe")
            .unwrap_err()
            .render(false);
        assert!(
            bin.contains("not UTF-8") && bin.contains("t.yaml:2:3"),
            "{bin}"
        );
    }

    #[test]
    fn no_nodes_points_at_the_nodes_key() {
        // The fuzz target's invariant (every error has a position): `nodes: {}` had none.
        let (inventory, source) =
            parse_bytes(Path::new("t.yaml"), b"# an inventory\nnodes: {}\n").unwrap();
        let loaded = Loaded {
            path: "t.yaml".into(),
            base_dir: ".".into(),
            source,
            inventory,
        };
        let e = super::super::validate::validate(&loaded, &[])
            .unwrap_err()
            .render(false);
        assert!(
            e.contains("declares no nodes") && e.contains("t.yaml:2:1"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_pip_pin_points_at_the_inventory() {
        // Found by fuzzing: `numpy==2.q.3` passed validation and failed in the ml-env role,
        // pointing at the built-in role instead of the inventory.
        let yaml = "path: /root/ml-env\npython: \"3.12\"\npackages:\n  - numpy==2.q.3\n";
        let e = parse_yaml::<crate::inventory::software::MlEnv>(Path::new("t.yaml"), yaml)
            .unwrap_err()
            .render(false);
        assert!(
            e.contains("not a PEP 508 requirement") && e.contains("t.yaml:4:"),
            "{e}"
        );
    }

    #[test]
    fn alias_bombs_are_refused_even_where_any_value_fits() {
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let mut prev = 'a';
        for n in "bcdefghi".chars() {
            bomb += &format!(
                "{n}: &{n} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            );
            prev = n;
        }
        let started = std::time::Instant::now();
        let e = parse_yaml::<serde_json::Value>(Path::new("b.yaml"), &bomb).unwrap_err();
        // Expanded, the bomb is 10^9 values: minutes at the least. A generous bound keeps
        // the test meaningful on a loaded two-core CI machine without racing it.
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
        let text = e.render(false);
        assert!(
            text.contains("refused") && text.contains("alias bomb"),
            "{text}"
        );
    }

    #[test]
    fn did_you_mean_needs_a_close_match() {
        assert_eq!(did_you_mean("tpp", &["tp", "port"]), Some("tp"));
        assert_eq!(did_you_mean("zzzz", &["tp", "port"]), None);
    }
}
