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

/// Splits a list as `systemctl show` prints it (`Environment=`, `ExecStart`'s `argv[]=`)
/// into its words: blanks separate words, double quotes group with backslash escapes
/// (`\"`, `\\`, `\$`, C escapes such as `\n` and `\x41`), single quotes group
/// literally. Comparing these parsed words, never the quoted text, is what lets a value
/// with a space, a quote, `$`, `%` or a backslash match what was written.
pub fn split_shown(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return words;
        }
        let mut word = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() {
                break;
            }
            chars.next();
            match c {
                '"' => {
                    while let Some(c) = chars.next() {
                        match c {
                            '"' => break,
                            '\\' => unescape(&mut chars, &mut word),
                            c => word.push(c),
                        }
                    }
                }
                '\'' => {
                    for c in chars.by_ref() {
                        if c == '\'' {
                            break;
                        }
                        word.push(c);
                    }
                }
                '\\' => unescape(&mut chars, &mut word),
                c => word.push(c),
            }
        }
        words.push(word);
    }
}

/// One escape after a backslash, C style (systemd's `cunescape`).
fn unescape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>, out: &mut String) {
    let Some(c) = chars.next() else {
        out.push('\\');
        return;
    };
    match c {
        'n' => out.push('\n'),
        't' => out.push('\t'),
        'r' => out.push('\r'),
        'a' => out.push('\u{7}'),
        'b' => out.push('\u{8}'),
        'f' => out.push('\u{c}'),
        'v' => out.push('\u{b}'),
        's' => out.push(' '),
        'x' => {
            let hex: String = (0..2)
                .filter_map(|_| chars.next_if(char::is_ascii_hexdigit))
                .collect();
            match u8::from_str_radix(&hex, 16) {
                Ok(b) => out.push(b as char),
                Err(_) => out.push_str(&format!("\\x{hex}")),
            }
        }
        '0'..='7' => {
            let mut oct = c.to_string();
            oct.extend((0..2).filter_map(|_| chars.next_if(|d| ('0'..='7').contains(d))));
            match u8::from_str_radix(&oct, 8) {
                Ok(b) => out.push(b as char),
                Err(_) => out.push_str(&oct),
            }
        }
        other => out.push(other),
    }
}

/// `NAME=value` assignments as a map, the last one of a name winning, as in systemd.
pub fn assignments<'a>(
    words: impl IntoIterator<Item = &'a String>,
) -> std::collections::BTreeMap<String, String> {
    words
        .into_iter()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
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

    #[test]
    fn shown_lists_split_into_the_values_written() {
        assert_eq!(
            split_shown(
                r#"A=1 "B=two words" C=x\ y 'D=it''s' "E=say \"hi\" \$HOME 50% back\\slash""#
            ),
            vec![
                "A=1",
                "B=two words",
                "C=x y",
                "D=its",
                r#"E=say "hi" $HOME 50% back\slash"#
            ]
        );
        assert_eq!(split_shown(r"X=a\x41\tb"), vec!["X=aA\tb"]);
        assert!(split_shown("   ").is_empty());
        let words = split_shown(r#"A=1 "B=x y" A=2"#);
        let map = assignments(&words);
        assert_eq!(map["A"], "2");
        assert_eq!(map["B"], "x y");
    }
}
