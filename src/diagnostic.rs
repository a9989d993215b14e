//! User-facing errors that point at their source: `file:line:col`, the offending line with a
//! caret underline, `Caused by:` lines and `hint:` lines that say what to do.

use std::fmt;
use std::path::{Path, PathBuf};

use console::Style;

/// A place in a source file (1-based line and column, counted in characters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLocation {
    /// The file as the user named it.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// Characters to underline (at least one).
    pub width: usize,
    /// The text of the line, for the snippet; empty when unknown.
    pub line_text: String,
}

/// The lines of `source` as YAML counts them (and so every position in a diagnostic): a
/// line ends at `\n`, `\r\n` or a lone `\r`. `str::lines` keeps a lone `\r` inside a line,
/// which put positions past the end of a file written with old Mac line endings.
pub fn source_lines(source: &str) -> impl Iterator<Item = &str> {
    source
        .split('\n')
        .flat_map(|l| l.strip_suffix('\r').unwrap_or(l).split('\r'))
}

impl SourceLocation {
    /// A location in `source` (the whole file text) at `line:column`, underlining `width`
    /// characters or, when `width` is 0, the token that starts there.
    pub fn new(file: &Path, source: &str, line: usize, column: usize, width: usize) -> Self {
        let line_text = source_lines(source)
            .nth(line.saturating_sub(1))
            .unwrap_or("")
            .to_string();
        let width = if width > 0 {
            width
        } else {
            token_width(&line_text, column)
        };
        SourceLocation {
            file: file.to_path_buf(),
            line,
            column: column.max(1),
            width: width.max(1),
            line_text,
        }
    }
}

/// Width of the YAML token starting at `column` (1-based): a key up to its colon, a quoted
/// string to its closing quote, or a plain scalar to the end of the line or a comment.
fn token_width(line: &str, column: usize) -> usize {
    let rest: Vec<char> = line.chars().skip(column.saturating_sub(1)).collect();
    let Some(&first) = rest.first() else { return 1 };
    if first == '"' || first == '\'' {
        let close = rest.iter().skip(1).position(|&c| c == first);
        return close.map_or(rest.len(), |i| i + 2);
    }
    let mut width = 0;
    for (i, &c) in rest.iter().enumerate() {
        let next = rest.get(i + 1).copied();
        if (c == ':' && matches!(next, None | Some(' '))) || (c == ' ' && next == Some('#')) {
            break;
        }
        if matches!(c, ',' | ']' | '}') {
            break;
        }
        width = i + 1;
    }
    // Trailing spaces are not part of the value.
    while width > 1 && rest[width - 1] == ' ' {
        width -= 1;
    }
    width.max(1)
}

/// One error for a person to read and act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// What is wrong, in one line.
    pub message: String,
    /// Where, when the error comes from a file (boxed: errors travel in `Result`s).
    pub location: Option<Box<SourceLocation>>,
    /// Lower-level reasons, outermost first.
    pub causes: Vec<String>,
    /// What the user can do about it.
    pub hints: Vec<String>,
}

impl Diagnostic {
    /// An error with a message only.
    pub fn new(message: impl Into<String>) -> Self {
        Diagnostic {
            message: message.into(),
            location: None,
            causes: Vec::new(),
            hints: Vec::new(),
        }
    }

    /// Attaches a source location.
    pub fn at(mut self, location: SourceLocation) -> Self {
        self.location = Some(Box::new(location));
        self
    }

    /// Adds a hint line.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hints.push(hint.into());
        self
    }

    /// Adds several hints, in order.
    pub fn hints(mut self, hints: impl IntoIterator<Item = String>) -> Self {
        self.hints.extend(hints);
        self
    }

    /// Adds a cause line.
    pub fn cause(mut self, cause: impl Into<String>) -> Self {
        self.causes.push(cause.into());
        self
    }

    /// Renders the diagnostic, styled when `color` is set.
    pub fn render(&self, color: bool) -> String {
        let red = Style::new().red().bold().force_styling(color);
        let blue = Style::new().blue().bold().force_styling(color);
        let bold = Style::new().bold().force_styling(color);
        let cyan = Style::new().cyan().bold().force_styling(color);
        let mut out = format!(
            "{}{} {}\n",
            red.apply_to("error"),
            bold.apply_to(":"),
            bold.apply_to(&self.message)
        );
        if let Some(loc) = &self.location {
            let gutter = loc.line.to_string().len();
            let pad = " ".repeat(gutter);
            out += &format!(
                "{pad}{} {}:{}:{}\n",
                blue.apply_to("-->"),
                loc.file.display(),
                loc.line,
                loc.column
            );
            if !loc.line_text.is_empty() {
                let shown = printable(&loc.line_text);
                out += &format!("{pad} {}\n", blue.apply_to("|"));
                out += &format!(
                    "{} {} {}\n",
                    blue.apply_to(loc.line),
                    blue.apply_to("|"),
                    shown
                );
                let lead: String = loc
                    .line_text
                    .chars()
                    .take(loc.column - 1)
                    .map(|c| if c == '\t' { '\t' } else { ' ' })
                    .collect();
                out += &format!(
                    "{pad} {} {lead}{}\n",
                    blue.apply_to("|"),
                    red.apply_to("^".repeat(loc.width))
                );
            }
        }
        if !self.causes.is_empty() {
            out += &format!("  {}\n", bold.apply_to("Caused by:"));
            for cause in &self.causes {
                out += &format!("    {cause}\n");
            }
        }
        for hint in &self.hints {
            out += &format!("  {} {hint}\n", cyan.apply_to("hint:"));
        }
        out
    }
}

/// Replaces control characters so a hostile line cannot rewrite the terminal.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() && c != '\t' {
                char::REPLACEMENT_CHARACTER
            } else {
                c
            }
        })
        .collect()
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.render(false).trim_end())
    }
}

impl std::error::Error for Diagnostic {}

/// An error and its sources on one line, outermost first (`error: source: source …`): a
/// library error's own message alone often says little ("error sending request"), and a
/// cause line of a run over many targets must carry the whole chain.
pub fn one_line(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        text += &format!(": {e}");
        next = e.source();
    }
    text
}

/// Several diagnostics reported together (validation reports every problem it finds).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// Renders all, separated by blank lines, and a count when there is more than one.
    pub fn render(&self, color: bool) -> String {
        let mut out = self
            .0
            .iter()
            .map(|d| d.render(color))
            .collect::<Vec<_>>()
            .join("\n");
        if self.0.len() > 1 {
            out += &format!("\n{} errors\n", self.0.len());
        }
        out
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.render(false).trim_end())
    }
}

impl std::error::Error for Diagnostics {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_location_snippet_and_hint() {
        let src = "a: 1\n  tpp: 4\n";
        let d = Diagnostic::new("unknown field `tpp`")
            .at(SourceLocation::new(Path::new("inv.yaml"), src, 2, 3, 0))
            .hint("did you mean `tp`?");
        let text = d.render(false);
        assert_eq!(
            text,
            "error: unknown field `tpp`\n --> inv.yaml:2:3\n  |\n2 |   tpp: 4\n  |   ^^^\n  hint: did you mean `tp`?\n"
        );
    }

    #[test]
    fn token_width_stops_at_key_colon_comment_and_quote() {
        assert_eq!(token_width("  port: 30000", 3), 4);
        assert_eq!(token_width("  port: 30000 # x", 9), 5);
        assert_eq!(token_width("  x: \"a b\" # c", 6), 5);
        assert_eq!(token_width("  url: http://a:8006/x", 8), 15);
    }

    #[test]
    fn lines_end_at_carriage_returns_as_in_yaml() {
        // Found by fuzzing: a file with lone `\r` line breaks had positions past its end.
        let lines: Vec<&str> = source_lines("a\rb\r\nc\n\rd").collect();
        assert_eq!(lines, ["a", "b", "c", "", "d"]);
        let loc = SourceLocation::new(Path::new("f"), "x: 1\ry: 2\r", 2, 1, 0);
        assert_eq!(loc.line_text, "y: 2");
    }

    #[test]
    fn one_line_names_every_source_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        assert_eq!(
            one_line(&Outer(std::io::Error::other("inner"))),
            "outer: inner"
        );
    }

    #[test]
    fn control_characters_are_not_echoed() {
        let src = "a: \"\u{1b}[2J\"\n";
        let d = Diagnostic::new("bad").at(SourceLocation::new(Path::new("f"), src, 1, 4, 0));
        assert!(!d.render(false).contains('\u{1b}'));
    }
}
