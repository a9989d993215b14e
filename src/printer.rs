//! Every byte the CLI prints goes through one [`Printer`]: it knows quiet and verbose, and
//! drops colour and progress bars when the stream is not a terminal.

use std::io::{IsTerminal, Write};

use console::Style;

/// How much to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    /// Results and errors only.
    Quiet,
    /// Results, progress and status lines.
    Normal,
    /// Also the steps taken and the commands run.
    Verbose,
}

/// When to colour output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum ColorChoice {
    /// Colour when the stream is a terminal and `NO_COLOR` is unset.
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

/// The one place output is written.
#[derive(Debug, Clone)]
pub struct Printer {
    verbosity: Verbosity,
    color_out: bool,
    color_err: bool,
    progress: bool,
}

impl Printer {
    /// A printer for this process's stdout and stderr.
    pub fn new(verbosity: Verbosity, color: ColorChoice, no_progress: bool) -> Self {
        let no_color_env = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let decide = |is_tty: bool| match color {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => is_tty && !no_color_env,
        };
        let err_tty = std::io::stderr().is_terminal();
        Printer {
            verbosity,
            color_out: decide(std::io::stdout().is_terminal()),
            color_err: decide(err_tty),
            progress: !no_progress && err_tty && verbosity != Verbosity::Quiet,
        }
    }

    /// A printer that never colours and never draws progress (tests, `--json`).
    pub fn plain() -> Self {
        Printer {
            verbosity: Verbosity::Normal,
            color_out: false,
            color_err: false,
            progress: false,
        }
    }

    /// The verbosity chosen on the command line.
    pub fn verbosity(&self) -> Verbosity {
        self.verbosity
    }

    /// Whether stdout is coloured.
    pub fn color_out(&self) -> bool {
        self.color_out
    }

    /// Whether stderr is coloured.
    pub fn color_err(&self) -> bool {
        self.color_err
    }

    /// Whether progress bars may be drawn (stderr is a terminal, not quiet, not disabled).
    pub fn progress(&self) -> bool {
        self.progress
    }

    /// A style for stdout, inert when stdout is not coloured.
    pub fn style_out(&self, style: Style) -> Style {
        style.force_styling(self.color_out)
    }

    /// A style for stderr, inert when stderr is not coloured.
    pub fn style_err(&self, style: Style) -> Style {
        style.force_styling(self.color_err)
    }

    /// A result: always printed to stdout, even with `-q`.
    pub fn result(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        // A closed pipe (`provision plan | head`) is not an error worth a panic.
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }

    /// A status line on stderr, hidden by `-q`.
    pub fn status(&self, text: &str) {
        if self.verbosity >= Verbosity::Normal {
            let _ = writeln!(std::io::stderr().lock(), "{text}");
        }
    }

    /// A detail on stderr, shown only with `-v`.
    pub fn verbose(&self, text: &str) {
        if self.verbosity >= Verbosity::Verbose {
            let _ = writeln!(std::io::stderr().lock(), "{text}");
        }
    }

    /// A warning on stderr, shown unless `-q`.
    pub fn warn(&self, text: &str) {
        if self.verbosity >= Verbosity::Normal {
            let yellow = self.style_err(Style::new().yellow().bold());
            let _ = writeln!(
                std::io::stderr().lock(),
                "{}: {text}",
                yellow.apply_to("warning")
            );
        }
    }

    /// An error on stderr, always shown.
    pub fn error(&self, rendered: &str) {
        let _ = write!(std::io::stderr().lock(), "{rendered}");
    }
}
