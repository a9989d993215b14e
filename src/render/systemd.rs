//! Quoting for systemd unit files (systemd.service(5), "Command lines"; systemd.syntax(7)).

/// Quotes one word of an `ExecStart=` command line. `%` starts a specifier and `$` a
/// variable substitution, so both are doubled; words with blanks, quotes, backslashes or
/// that are a lone `;` (a command separator) are double-quoted with C-style escapes.
pub fn quote_exec_word(word: &str) -> String {
    let escaped = word.replace('%', "%%").replace('$', "$$");
    let plain = !escaped.is_empty()
        && escaped != ";"
        && escaped
            .chars()
            .all(|c| !c.is_whitespace() && !matches!(c, '"' | '\'' | '\\'));
    if plain {
        escaped
    } else {
        double_quote(&escaped)
    }
}

/// Quotes a whole `Environment=` assignment `NAME=value`. Specifiers are expanded there
/// (`%` doubled) but variables are not, so `$` stays as written.
pub fn quote_environment(name: &str, value: &str) -> String {
    let assignment = format!("{name}={}", value.replace('%', "%%"));
    let plain = assignment
        .chars()
        .all(|c| !c.is_whitespace() && !matches!(c, '"' | '\'' | '\\'));
    if plain {
        assignment
    } else {
        double_quote(&assignment)
    }
}

fn double_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_words() {
        assert_eq!(quote_exec_word("--tp"), "--tp");
        assert_eq!(
            quote_exec_word("/shared/models/Qwen3.5-122B-A10B"),
            "/shared/models/Qwen3.5-122B-A10B"
        );
        assert_eq!(quote_exec_word("a b"), "\"a b\"");
        assert_eq!(quote_exec_word("50%"), "50%%");
        assert_eq!(quote_exec_word("$HOME"), "$$HOME");
        assert_eq!(quote_exec_word(";"), "\";\"");
        assert_eq!(quote_exec_word(""), "\"\"");
        assert_eq!(quote_exec_word("{\"a\": 1}"), "\"{\\\"a\\\": 1}\"");
    }

    #[test]
    fn environment_assignments() {
        assert_eq!(
            quote_environment("SGLANG_ENABLE_SPEC_V2", "1"),
            "SGLANG_ENABLE_SPEC_V2=1"
        );
        assert_eq!(quote_environment("X", "a b"), "\"X=a b\"");
        assert_eq!(quote_environment("X", "$Y"), "X=$Y");
    }
}
