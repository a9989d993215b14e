//! String types that check themselves while the inventory is parsed, so a bad value is
//! reported with its position and can never reach a command line or a unit file.
//!
//! A refused value is a [`ValueError`]: its message and hints, as data.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

/// Describes the first control character in `s`, if any (newline, tab, escape, NUL ...).
pub fn control_char(s: &str) -> Option<String> {
    s.chars().find(|c| c.is_control()).map(|c| match c {
        '\n' => "a newline".to_string(),
        '\r' => "a carriage return".to_string(),
        '\t' => "a tab".to_string(),
        '\0' => "a NUL byte".to_string(),
        c => format!("the control character U+{:04X}", c as u32),
    })
}

/// Why a value in the inventory is refused: a message and what to do about it.
///
/// serde carries a value's error only as text (`de::Error::custom`), so `Display` writes
/// each hint after a `\nhint: ` separator and [`ValueError::from_message`] reads them back
/// where the loader turns the error into a diagnostic; the separator exists only here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    /// What is wrong.
    pub message: String,
    /// What to do about it.
    pub hints: Vec<String>,
}

const HINT_SEPARATOR: &str = "\nhint: ";

impl ValueError {
    /// An error without hints.
    pub fn new(message: impl Into<String>) -> Self {
        ValueError {
            message: message.into(),
            hints: Vec::new(),
        }
    }

    /// Adds a hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hints.push(hint.into());
        self
    }

    /// The error a message written by `Display` (and carried through serde) came from.
    pub fn from_message(text: &str) -> Self {
        let mut parts = text.split(HINT_SEPARATOR);
        ValueError {
            message: parts.next().unwrap_or_default().to_string(),
            hints: parts.map(str::to_string).collect(),
        }
    }
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        for h in &self.hints {
            write!(f, "{HINT_SEPARATOR}{h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValueError {}

fn no_control(s: &str) -> Result<(), ValueError> {
    match control_char(s) {
        Some(what) => Err(ValueError::new(format!(
            "this value contains {what}, which would reach a command line or a unit file"
        ))
        .hint("write it on one line, without control characters")),
        None => Ok(()),
    }
}

macro_rules! checked_string {
    ($(#[$doc:meta])* $name:ident, $schema_desc:expr, $pattern:expr, $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[derive(serde_with::DeserializeFromStr, serde_with::SerializeDisplay)]
        pub struct $name(String);

        impl $name {
            /// Checks `s` and wraps it.
            pub fn parse(s: &str) -> Result<Self, ValueError> {
                let check: fn(&str) -> Result<(), ValueError> = $check;
                no_control(s)?;
                check(s)?;
                Ok($name(s.to_string()))
            }

            /// The text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = ValueError;
            fn from_str(s: &str) -> Result<Self, ValueError> {
                $name::parse(s)
            }
        }

        impl JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }
            fn schema_name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                let pattern: Option<&str> = $pattern;
                match pattern {
                    Some(p) => json_schema!({"type": "string", "description": $schema_desc, "pattern": p}),
                    None => json_schema!({"type": "string", "description": $schema_desc}),
                }
            }
        }
    };
}

checked_string!(
    /// Free text on one line: no newlines or other control characters.
    Text,
    "Text on one line (no control characters).",
    Some("^[^\\x00-\\x1f\\x7f]*$"),
    |_| Ok(())
);

checked_string!(
    /// A name: letters, digits, `.`, `_` and `-`, starting with a letter or digit.
    Name,
    "A name: letters, digits, '.', '_' and '-', starting with a letter or digit.",
    Some("^[A-Za-z0-9][A-Za-z0-9._-]*$"),
    |s| {
        let mut chars = s.chars();
        let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if ok && s.len() <= 128 {
            Ok(())
        } else {
            Err(ValueError::new(format!("`{s}` is not a valid name")).hint("use letters, digits, '.', '_' and '-', starting with a letter or digit (at most 128)"))
        }
    }
);

checked_string!(
    /// An absolute, normalised path on a target (no `..`, no `//`, no trailing `/`).
    AbsPath,
    "An absolute path on the target, e.g. /shared/models.",
    Some("^/"),
    |s| {
        if !s.starts_with('/') {
            return Err(ValueError::new(format!(
                "`{s}` is a relative path; paths on a target must be absolute"
            ))
            .hint(format!(
                "write it from the root, e.g. `/{}`",
                s.trim_start_matches("./")
            )));
        }
        if s.split('/').any(|part| part == ".." || part == ".") {
            return Err(ValueError::new(format!("`{s}` contains `.` or `..`")).hint("write the path without `.` and `..` components"));
        }
        if s.len() > 1 && (s.ends_with('/') || s.contains("//")) {
            return Err(ValueError::new(format!("`{s}` is not normalised"))
                .hint(format!("write `{}`", normalise(s))));
        }
        Ok(())
    }
);

fn normalise(s: &str) -> String {
    let parts: Vec<&str> = s.split('/').filter(|p| !p.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

impl AbsPath {
    /// Whether `self` is `base` or lies below it.
    pub fn starts_with(&self, base: &AbsPath) -> bool {
        base.0 == "/"
            || self.0 == base.0
            || (self.0.starts_with(&base.0) && self.0.as_bytes().get(base.0.len()) == Some(&b'/'))
    }

    /// `self/child`.
    pub fn join(&self, child: &str) -> AbsPath {
        if self.0 == "/" {
            AbsPath(format!("/{child}"))
        } else {
            AbsPath(format!("{}/{child}", self.0))
        }
    }
}

checked_string!(
    /// A path on the machine running provision (a CA file, a key); relative paths are
    /// taken from the inventory file's folder, and `~/` from the home directory.
    LocalPath,
    "A path on the machine running provision, relative to the inventory file or starting with ~/.",
    None,
    |s| if s.is_empty() { Err(ValueError::new("the path is empty")) } else { Ok(()) }
);

checked_string!(
    /// An environment variable name.
    EnvName,
    "An environment variable name: letters, digits and '_', not starting with a digit.",
    Some("^[A-Za-z_][A-Za-z0-9_]*$"),
    |s| {
        let mut chars = s.chars();
        let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if ok {
            Ok(())
        } else {
            Err(ValueError::new(format!("`{s}` is not a valid environment variable name")).hint("use letters, digits and '_', e.g. SGLANG_ENABLE_SPEC_V2"))
        }
    }
);

checked_string!(
    /// A systemd directive name, such as `LimitNOFILE` or `OOMScoreAdjust`.
    DirectiveName,
    "A systemd directive name: a capital letter, then letters and digits, e.g. OOMScoreAdjust.",
    Some("^[A-Z][A-Za-z0-9]*$"),
    |s| {
        let mut chars = s.chars();
        let ok = chars.next().is_some_and(|c| c.is_ascii_uppercase())
            && chars.all(|c| c.is_ascii_alphanumeric());
        if ok {
            Ok(())
        } else {
            Err(ValueError::new(format!("`{s}` is not a systemd directive name")).hint("directives are written as systemd.exec(5) spells them, e.g. LimitMEMLOCK"))
        }
    }
);

checked_string!(
    /// A host name or IP address.
    Host,
    "A host name or IP address.",
    Some("^[A-Za-z0-9.:_-]+$"),
    |s| {
        let ok = !s.is_empty()
            && !s.starts_with('-')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '_' | '-'));
        if ok {
            Ok(())
        } else {
            Err(ValueError::new(format!("`{s}` is not a host name or IP address")))
        }
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abs_path_rules() {
        assert!(AbsPath::parse("/shared/models").is_ok());
        assert!(AbsPath::parse("/").is_ok());
        assert!(
            AbsPath::parse("shared")
                .unwrap_err()
                .to_string()
                .contains("relative")
        );
        assert!(
            AbsPath::parse("/a/../b")
                .unwrap_err()
                .to_string()
                .contains("..")
        );
        assert!(
            AbsPath::parse("/a//b")
                .unwrap_err()
                .to_string()
                .contains("`/a/b`")
        );
        assert!(
            AbsPath::parse("/a/\nb")
                .unwrap_err()
                .to_string()
                .contains("newline")
        );
    }

    #[test]
    fn abs_path_prefix_is_by_component() {
        let p = AbsPath::parse("/shared/models/x").unwrap();
        assert!(p.starts_with(&AbsPath::parse("/shared").unwrap()));
        assert!(!p.starts_with(&AbsPath::parse("/sha").unwrap()));
        assert!(p.starts_with(&AbsPath::parse("/").unwrap()));
    }

    #[test]
    fn names_and_env_names() {
        assert!(Name::parse("llm-two").is_ok());
        assert!(Name::parse("-x").is_err());
        assert!(Name::parse("a b").is_err());
        assert!(EnvName::parse("SGLANG_ENABLE_SPEC_V2").is_ok());
        assert!(EnvName::parse("1X").is_err());
        assert!(
            Text::parse("a\u{1b}[2J")
                .unwrap_err()
                .to_string()
                .contains("U+001B")
        );
        assert!(Host::parse("10.1.2.6").is_ok());
        assert!(Host::parse("-oProxyCommand=x").is_err());
    }
}
