//! The one quoting function every command built from inventory values goes through.

/// Quotes `s` as one POSIX shell word. Words made only of safe characters stay readable;
/// anything else is single-quoted, with embedded single quotes closed, escaped and reopened,
/// so `$()`, backticks, `;`, globs and newlines stay inert.
pub fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'_' | b'.' | b'/' | b':' | b'=' | b'@' | b',' | b'+' | b'%'
                )
        });
    if safe {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// Quotes each word and joins them with spaces.
pub fn shell_join<I, S>(words: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    words
        .into_iter()
        .map(|w| shell_quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Each hostile word must come back from a real shell exactly as it went in.
    #[test]
    fn hostile_words_round_trip_through_sh() {
        let words = [
            "plain",
            "",
            "it's",
            "$(touch /tmp/provision-pwned)",
            "`id`",
            "a; rm -rf /",
            "line\nbreak",
            "*",
            "~root",
            "'''",
            "\\",
            "-n",
            "ünïcode",
            "a\tb",
        ];
        let script = format!("printf '%s\\0' {}", shell_join(words));
        let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
        assert!(out.status.success());
        let got: Vec<String> = out
            .stdout
            .split(|&b| b == 0)
            .filter(|_| true)
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
            .collect();
        let mut expected: Vec<String> = words.iter().map(|s| s.to_string()).collect();
        expected.push(String::new()); // after the final NUL
        assert_eq!(got, expected);
        assert!(!std::path::Path::new("/tmp/provision-pwned").exists());
    }

    #[test]
    fn safe_words_stay_readable() {
        assert_eq!(shell_quote("/usr/local/cuda-13.0"), "/usr/local/cuda-13.0");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
