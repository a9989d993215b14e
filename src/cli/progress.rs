//! Showing an apply's events as they arrive: a bar or spinner per target on a terminal, one
//! plain line per event otherwise (CI logs), or with `--json` one JSON object per event on
//! stderr (stdout keeps the one final document).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use console::Style;
use indicatif::{HumanBytes, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::agent::attach::Observer;
use crate::printer::Printer;
use crate::progress::Progress;
use crate::resources::wire::Event;

/// How the events are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Bars,
    Lines,
    Json,
}

/// The apply's live display, shared by every target's observer.
pub struct Display {
    printer: Printer,
    mode: Mode,
    multi: MultiProgress,
    bars: Mutex<HashMap<String, ProgressBar>>,
    /// (target, step) pairs whose end was shown as it happened.
    shown: Mutex<HashSet<(String, String)>>,
    /// Each target's running step, by index.
    steps: Mutex<HashMap<(String, usize), String>>,
}

impl Display {
    /// A display for `printer`'s stderr; `json` streams JSON lines instead.
    pub fn new(printer: &Printer, json: bool) -> Arc<Display> {
        let mode = if json {
            Mode::Json
        } else if printer.progress() {
            Mode::Bars
        } else {
            Mode::Lines
        };
        let target = if mode == Mode::Bars {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Arc::new(Display {
            printer: printer.clone(),
            mode,
            multi: MultiProgress::with_draw_target(target),
            bars: Mutex::new(HashMap::new()),
            shown: Mutex::new(HashSet::new()),
            steps: Mutex::new(HashMap::new()),
        })
    }

    /// The observer of the target headed `heading`.
    pub fn observer(self: &Arc<Self>, heading: String) -> Observer {
        let me = self.clone();
        Arc::new(move |e: &Event| me.event(&heading, e))
    }

    /// Whether the end of `step` on `heading` was already shown live.
    pub fn shown(&self, heading: &str, step: &str) -> bool {
        self.shown
            .lock()
            .expect("display")
            .contains(&(heading.to_string(), step.to_string()))
    }

    fn event(&self, heading: &str, e: &Event) {
        if self.mode == Mode::Json {
            let mut v = serde_json::to_value(e).unwrap_or_default();
            if let Some(map) = v.as_object_mut() {
                map.insert("target".into(), heading.into());
            }
            let _ = writeln!(std::io::stderr().lock(), "{v}");
            return;
        }
        match e {
            Event::StepStarted { index, description } => {
                self.steps
                    .lock()
                    .expect("display")
                    .insert((heading.to_string(), *index), description.clone());
                self.say_or_draw(heading, &format!("{description} ..."), None);
            }
            Event::Progress { index, progress } => {
                let step = self
                    .steps
                    .lock()
                    .expect("display")
                    .get(&(heading.to_string(), *index))
                    .cloned()
                    .unwrap_or_default();
                let (text, bytes) = match progress {
                    Progress::Line { text } => (text.clone(), None),
                    Progress::Verdict { text } => (format!("verdict: {text}"), None),
                    Progress::Checked { file } => (format!("{file} is already there, whole"), None),
                    Progress::Bytes {
                        file,
                        file_done,
                        file_size,
                        done,
                        total,
                        rate,
                        eta_secs,
                    } => (
                        format!(
                            "{file} {}/{}, total {}/{} at {}/s, eta {}",
                            HumanBytes(*file_done),
                            HumanBytes(*file_size),
                            HumanBytes(*done),
                            HumanBytes(*total),
                            HumanBytes(*rate),
                            eta_secs.map_or("?".into(), |s| {
                                crate::agent::attach::human(Duration::from_secs(s))
                            })
                        ),
                        Some((*done, *total)),
                    ),
                };
                match self.mode {
                    Mode::Bars => self.draw(heading, &format!("{step}: {text}"), bytes),
                    _ => self.printer.status(&format!("{heading}:   {text}")),
                }
            }
            Event::StepDone {
                error,
                millis,
                index,
                ..
            } => {
                let description = self
                    .steps
                    .lock()
                    .expect("display")
                    .remove(&(heading.to_string(), *index))
                    .unwrap_or_default();
                let line = step_line(
                    &self.printer,
                    heading,
                    &description,
                    error.is_none(),
                    *millis,
                );
                self.shown
                    .lock()
                    .expect("display")
                    .insert((heading.to_string(), description));
                self.println(&line);
                if let Some(b) = self.bars.lock().expect("display").get(heading) {
                    b.set_length(0);
                }
            }
            Event::Started { holder } => self.printer.verbose(&format!(
                "{heading}: the apply runs detached on the target as run {} (agent pid {})",
                holder.run, holder.agent_pid
            )),
            Event::Finished { .. } => {
                if let Some(b) = self.bars.lock().expect("display").remove(heading) {
                    b.finish_and_clear();
                    self.multi.remove(&b);
                }
            }
            _ => {}
        }
    }

    /// Clears every bar left (a run that ended without its last word), before the
    /// summary or the error is printed.
    pub fn finish(&self) {
        for (_, b) in self.bars.lock().expect("display").drain() {
            b.finish_and_clear();
            self.multi.remove(&b);
        }
    }

    fn say_or_draw(&self, heading: &str, text: &str, bytes: Option<(u64, u64)>) {
        match self.mode {
            Mode::Bars => self.draw(heading, text, bytes),
            _ => self.printer.status(&format!("{heading}: {text}")),
        }
    }

    /// The target's bar: bytes when a download reports them, else a spinner.
    fn draw(&self, heading: &str, text: &str, bytes: Option<(u64, u64)>) {
        let mut bars = self.bars.lock().expect("display");
        let bar = bars.entry(heading.to_string()).or_insert_with(|| {
            let b = self
                .multi
                .add(ProgressBar::new(0).with_prefix(heading.to_string()));
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        let style = match bytes {
            Some(_) => "{prefix} [{bar:30}] {percent:>3}% {wide_msg}",
            None => "{prefix} {spinner} {wide_msg}",
        };
        if let Ok(s) = ProgressStyle::with_template(style) {
            bar.set_style(s);
        }
        if let Some((done, total)) = bytes {
            bar.set_length(total);
            bar.set_position(done);
        }
        bar.set_message(text.to_string());
    }

    fn println(&self, line: &str) {
        match self.mode {
            Mode::Bars => {
                let _ = self.multi.println(line);
            }
            _ => self.printer.status(line),
        }
    }
}

/// `guest.t: write /etc/x ... done (0.1s)`, as every step's end is shown.
pub fn step_line(printer: &Printer, heading: &str, step: &str, ok: bool, millis: u64) -> String {
    let mark = if ok {
        printer.style_err(Style::new().green()).apply_to("done")
    } else {
        printer
            .style_err(Style::new().red().bold())
            .apply_to("FAILED")
    };
    format!(
        "{heading}: {step} ... {mark} ({:.1}s)",
        millis as f64 / 1000.0
    )
}
