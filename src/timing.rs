//! Where a command's time goes: named phases timed from any thread into one recorder, shown
//! with `-v` (`provision check -v`): each phase's count and summed time, and when it first
//! started and last ended, so the phases on the longest path show. Recording costs a lock per
//! phase and changes nothing else.

use std::borrow::Cow;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One phase's total: how many times it ran and for how long, summed over threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    /// What ran.
    pub name: Cow<'static, str>,
    /// How many times.
    pub count: usize,
    /// Summed time (threads that overlap add up).
    pub total: Duration,
    /// When it first started.
    pub first: Instant,
    /// When it last ended.
    pub last: Instant,
}

/// Phases in the order they first ran.
#[derive(Debug, Default)]
pub struct Recorder(Mutex<Vec<Phase>>);

impl Recorder {
    /// An empty recorder.
    pub const fn new() -> Self {
        Recorder(Mutex::new(Vec::new()))
    }

    /// Adds `took` to phase `name`.
    pub fn record(&self, name: impl Into<Cow<'static, str>>, took: Duration) {
        let name = name.into();
        let end = Instant::now();
        let start = end.checked_sub(took).unwrap_or(end);
        let mut phases = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match phases.iter_mut().find(|p| p.name == name) {
            Some(p) => {
                p.count += 1;
                p.total += took;
                p.first = p.first.min(start);
                p.last = p.last.max(end);
            }
            None => phases.push(Phase {
                name,
                count: 1,
                total: took,
                first: start,
                last: end,
            }),
        }
    }

    /// The phases recorded so far, emptying the recorder.
    pub fn take(&self) -> Vec<Phase> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The process's recorder: the engine, the API client and the transports add to it.
static PHASES: Recorder = Recorder::new();

/// Adds `took` to the process's phase `name` (a phase named at run time, such as an agent's
/// probe kind, passes a `String`).
pub fn record(name: impl Into<Cow<'static, str>>, took: Duration) {
    PHASES.record(name, took);
}

/// Times `f` as phase `name`.
pub fn time<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    record(name, start.elapsed());
    out
}

/// The process's phases recorded so far, emptying its recorder.
pub fn take() -> Vec<Phase> {
    PHASES.take()
}

/// The breakdown as lines for people: each phase's count, summed time, share of the wall
/// time since `start`, and the span from its first start to its last end (ms after
/// `start`).
pub fn render(phases: &[Phase], start: Instant) -> String {
    render_at(phases, start, Instant::now())
}

fn render_at(phases: &[Phase], start: Instant, now: Instant) -> String {
    let wall = now.saturating_duration_since(start);
    let width = phases.iter().map(|p| p.name.len()).max().unwrap_or(0);
    let mut out = format!(
        "time by phase (summed over threads; wall {}; span: first start - last end, ms after the start):\n",
        ms(wall)
    );
    let at = |i: Instant| i.saturating_duration_since(start).as_secs_f64() * 1000.0;
    for p in phases {
        let share = 100.0 * p.total.as_secs_f64() / wall.as_secs_f64().max(1e-9);
        out.push_str(&format!(
            "  {:<width$}  {:>3}x  {:>9}  {share:>5.1}%  {:>6.1} - {:<6.1}\n",
            p.name,
            p.count,
            ms(p.total),
            at(p.first),
            at(p.last)
        ));
    }
    out
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_in_first_seen_order() {
        let r = Recorder::new();
        r.record("b", Duration::from_millis(3));
        r.record("a", Duration::from_millis(1));
        r.record("b", Duration::from_millis(4));
        let got = r.take();
        let counted: Vec<_> = got
            .iter()
            .map(|p| (p.name.as_ref(), p.count, p.total))
            .collect();
        assert_eq!(
            counted,
            vec![
                ("b", 2, Duration::from_millis(7)),
                ("a", 1, Duration::from_millis(1)),
            ]
        );
        assert!(r.take().is_empty());
        // b's first start is 3 ms before its first record, its last end its second record.
        assert!(got[0].first < got[1].first && got[1].last <= got[0].last);
        let start = got[0].first;
        let mut phases = got.clone();
        phases[0].first = start + Duration::from_millis(2);
        phases[0].last = start + Duration::from_millis(12);
        let text = render_at(&phases, start, start + Duration::from_millis(14));
        assert!(text.contains("wall 14.0 ms"), "{text}");
        assert!(
            text.contains("b    2x     7.0 ms   50.0%     2.0 - 12.0"),
            "{text}"
        );
    }
}
