//! One round trip for many read-only commands: each runs in its own marked section of one
//! shell script, so a node or guest is read with a single `exec` over any transport.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::transport::{Transport, TransportError};

const BEGIN: &str = "@@provision-begin ";
const END: &str = "@@provision-end ";

/// What one section's command printed (stdout and stderr together) and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// stdout and stderr, interleaved as the command wrote them.
    pub output: String,
    /// The command's exit status.
    pub status: i32,
}

impl Section {
    /// Whether the command exited 0.
    pub fn ok(&self) -> bool {
        self.status == 0
    }

    /// Whether the shell could not find the program (status 127) or it was not executable (126).
    pub fn not_found(&self) -> bool {
        self.status == 127 || self.status == 126
    }
}

/// A batch of named read-only commands.
#[derive(Debug, Clone, Default)]
pub struct CommandBatch {
    sections: Vec<(String, String)>,
}

impl CommandBatch {
    /// An empty batch.
    pub fn new() -> Self {
        CommandBatch::default()
    }

    /// Adds a section: `name` (letters, digits, `-`) runs the shell command line `command`.
    pub fn section(mut self, name: &str, command: &str) -> Self {
        debug_assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "section names are plain words"
        );
        self.sections.push((name.to_string(), command.to_string()));
        self
    }

    /// The script that runs every section in order.
    pub fn script(&self) -> String {
        let mut s = String::new();
        for (name, command) in &self.sections {
            // A subshell, so an `exit` in one section cannot end the script. The newline
            // before the end marker keeps it on its own line whatever the command printed;
            // the parser removes exactly that newline again.
            s += &format!(
                "printf '%s\\n' '{BEGIN}{name}'\n( {command}\n) 2>&1 </dev/null\nprintf '\\n{END}{name} %s\\n' \"$?\"\n"
            );
        }
        s
    }

    /// Runs the batch through `transport` (the script goes on stdin to `sh -s`).
    pub fn run(
        &self,
        transport: &dyn Transport,
        timeout: Duration,
    ) -> Result<Sections, TransportError> {
        Ok(parse_sections(&self.run_raw(transport, timeout)?))
    }

    /// Runs the batch and returns its raw output, for [`parse_sections`] (and for captures).
    pub fn run_raw(
        &self,
        transport: &dyn Transport,
        timeout: Duration,
    ) -> Result<String, TransportError> {
        let out = transport.exec("sh -s", self.script().as_bytes(), timeout)?;
        Ok(out.stdout_text())
    }
}

/// The sections of one probe's output, by name.
pub type Sections = BTreeMap<String, Section>;

/// Splits a probe's output into its sections. A section whose end marker is missing (the
/// script was cut short) is left out, so a reader sees it as not run rather than as empty.
pub fn parse_sections(text: &str) -> Sections {
    let mut out = Sections::new();
    let mut current: Option<(String, String)> = None;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n');
        if let Some(name) = bare.strip_prefix(BEGIN) {
            current = Some((name.to_string(), String::new()));
            continue;
        }
        if let Some(rest) = bare.strip_prefix(END)
            && let Some((name, status)) = rest.rsplit_once(' ')
            && let Some((open, mut body)) = current.take()
        {
            if open == name {
                if body.ends_with('\n') {
                    body.pop();
                }
                let status = status.parse().unwrap_or(-1);
                out.insert(
                    name.to_string(),
                    Section {
                        output: body,
                        status,
                    },
                );
            }
            continue;
        }
        if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::local::LocalTransport;

    #[test]
    fn sections_keep_output_status_and_trailing_newlines() {
        let probe = CommandBatch::new()
            .section("a", "echo one; echo two >&2")
            .section("b", "printf 'no newline'; exit 3")
            .section("c", "false")
            .section("d", "definitely-not-a-program-xyz");
        let got = probe
            .run(&LocalTransport::default(), Duration::from_secs(10))
            .unwrap();
        assert_eq!(got["a"].output, "one\ntwo\n");
        assert!(got["a"].ok());
        assert_eq!(got["b"].output, "no newline");
        assert_eq!(got["b"].status, 3);
        assert_eq!(got["c"].status, 1);
        assert!(got["d"].not_found(), "{:?}", got["d"]);
    }

    #[test]
    fn a_cut_short_section_is_absent() {
        let text = "@@provision-begin a\nx\n\n@@provision-end a 0\n@@provision-begin b\npartial\n";
        let got = parse_sections(text);
        assert_eq!(got["a"].output, "x\n");
        assert!(!got.contains_key("b"));
    }
}
