//! Runs the work of many targets at once: independent targets concurrently, up to an
//! overall limit (`--parallelism`) and a per-node limit for Proxmox work (a node serializes
//! config locks and storage tasks, so flooding one node only queues there), while a job
//! that must follow another (a container's guest after its container) waits for it.
//!
//! Plain threads: the transports (ssh2) and the API client (blocking reqwest) block, and a
//! target's work is seconds to hours, so a thread per running job costs nothing that
//! matters.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Condvar, Mutex};

use crate::plan::Target;

/// Default overall number of targets worked on at once.
pub const DEFAULT_PARALLELISM: usize = 8;
/// Default number of container targets of one Proxmox node worked on at once.
pub const DEFAULT_PER_NODE: usize = 4;

/// How much runs at once, and whether the first failure stops the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Jobs running at once, overall (at least 1).
    pub parallelism: usize,
    /// Jobs of one Proxmox node running at once (at least 1).
    pub per_node: usize,
    /// After a job fails, start no other (those running finish).
    pub fail_fast: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            parallelism: DEFAULT_PARALLELISM,
            per_node: DEFAULT_PER_NODE,
            fail_fast: false,
        }
    }
}

impl Limits {
    /// One job at a time, stopping at the first failure: the order of a plain loop.
    pub fn serial() -> Self {
        Limits {
            parallelism: 1,
            per_node: 1,
            fail_fast: true,
        }
    }
}

/// What the scheduler needs to know about one job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Job {
    /// The Proxmox node whose API this job works through (counts against the per-node
    /// limit); `None` for work that does not load a node (a guest over SSH).
    pub node: Option<String>,
    /// An earlier job (by index) that must finish first. A later or equal index is ignored,
    /// so no cycle can form.
    pub after: Option<usize>,
}

/// Why a job did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skipped {
    /// `fail_fast` and another job had failed before it could start.
    FailFast,
    /// The job it had to follow (by index) failed or was skipped.
    After(usize),
}

/// What became of one job.
#[derive(Debug)]
pub enum Outcome<R> {
    /// It ran and returned this.
    Ran(R),
    /// It did not run.
    Skipped(Skipped),
}

/// Whether a job failing keeps the jobs that follow it from running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// Only when it succeeded (apply: a guest is not changed when its container's change
    /// failed).
    OnSuccess,
    /// In any case; only the order is kept (reading).
    Always,
}

/// The jobs for these targets, in order: a container's config is Proxmox work on its node
/// and follows the node's own target when there is one (the template and the storage it
/// needs); its guest follows it when both are there.
pub fn jobs(targets: &[&Target]) -> Vec<Job> {
    targets
        .iter()
        .map(|t| match t {
            Target::Node { node, .. } => Job {
                node: Some(node.clone()),
                after: None,
            },
            Target::Container { node, .. } => Job {
                node: Some(node.clone()),
                after: targets
                    .iter()
                    .position(|n| matches!(n, Target::Node { node: m, .. } if m == node)),
            },
            Target::Guest { name, .. } => Job {
                node: None,
                after: targets
                    .iter()
                    .position(|c| matches!(c, Target::Container { name: n, .. } if n == name)),
            },
        })
        .collect()
}

/// The jobs of reading `targets` for a plan: none waits for another (a guest is planned
/// from its node's listing, not from its container's read, so a container and its guest
/// are read at the same time); the per-node limit still holds.
pub fn read_jobs(targets: &[&Target]) -> Vec<Job> {
    jobs(targets)
        .into_iter()
        .map(|j| Job { after: None, ..j })
        .collect()
}

enum Slot<R> {
    Waiting,
    Running,
    Done { result: Option<R>, failed: bool },
    Skip(Skipped),
}

struct Board<R> {
    slots: Vec<Slot<R>>,
    per_node: HashMap<String, usize>,
    stop: bool,
}

impl<R> Board<R> {
    fn finished(&self) -> bool {
        self.slots
            .iter()
            .all(|s| matches!(s, Slot::Done { .. } | Slot::Skip(_)))
    }

    /// Takes the first job that may start now, marking the jobs that never will.
    fn take(&mut self, jobs: &[Job], limits: &Limits, follow: Follow) -> Option<usize> {
        for (i, job) in jobs.iter().enumerate() {
            if !matches!(self.slots[i], Slot::Waiting) {
                continue;
            }
            if self.stop {
                self.slots[i] = Slot::Skip(Skipped::FailFast);
                continue;
            }
            if let Some(a) = job.after.filter(|a| *a < i) {
                match &self.slots[a] {
                    Slot::Waiting | Slot::Running => continue,
                    Slot::Done { failed: true, .. } | Slot::Skip(_)
                        if follow == Follow::OnSuccess =>
                    {
                        self.slots[i] = Slot::Skip(Skipped::After(a));
                        continue;
                    }
                    _ => {}
                }
            }
            if let Some(node) = &job.node {
                let busy = self.per_node.entry(node.clone()).or_default();
                if *busy >= limits.per_node.max(1) {
                    continue;
                }
                *busy += 1;
            }
            self.slots[i] = Slot::Running;
            return Some(i);
        }
        None
    }
}

/// Runs `work(i)` for every job `i`, as [`Limits`] allow, and returns each job's outcome
/// in job order. `failed` says whether a result counts as a failure (for `fail_fast` and
/// for [`Follow::OnSuccess`]). A panic in a job lets the others finish, then propagates.
pub fn run<R: Send>(
    jobs: &[Job],
    limits: &Limits,
    follow: Follow,
    work: &(dyn Fn(usize) -> R + Sync),
    failed: &(dyn Fn(&R) -> bool + Sync),
) -> Vec<Outcome<R>> {
    let board = Mutex::new(Board {
        slots: jobs.iter().map(|_| Slot::Waiting).collect(),
        per_node: HashMap::new(),
        stop: false,
    });
    let changed = Condvar::new();
    let workers = limits.parallelism.max(1).min(jobs.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| scope.spawn(|| worker(jobs, limits, follow, work, failed, &board, &changed)))
            .collect();
        for h in handles {
            if let Err(panic) = h.join() {
                resume_unwind(panic);
            }
        }
    });
    let board = board.into_inner().unwrap_or_else(|p| p.into_inner());
    board
        .slots
        .into_iter()
        .map(|s| match s {
            Slot::Done {
                result: Some(r), ..
            } => Outcome::Ran(r),
            Slot::Skip(why) => Outcome::Skipped(why),
            // Only a panicked job has no result, and its panic was propagated above.
            _ => unreachable!("every job ends done or skipped"),
        })
        .collect()
}

fn worker<R>(
    jobs: &[Job],
    limits: &Limits,
    follow: Follow,
    work: &(dyn Fn(usize) -> R + Sync),
    failed: &(dyn Fn(&R) -> bool + Sync),
    board: &Mutex<Board<R>>,
    changed: &Condvar,
) {
    let lock = || board.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let index = {
            let mut b = lock();
            loop {
                if let Some(i) = b.take(jobs, limits, follow) {
                    break i;
                }
                if b.finished() {
                    // Wake the others so they see it too.
                    changed.notify_all();
                    return;
                }
                b = changed.wait(b).unwrap_or_else(|p| p.into_inner());
            }
        };
        let result = catch_unwind(AssertUnwindSafe(|| work(index)));
        let mut b = lock();
        if let Some(node) = &jobs[index].node
            && let Some(busy) = b.per_node.get_mut(node)
        {
            *busy -= 1;
        }
        match result {
            Ok(r) => {
                let fail = failed(&r);
                b.stop |= fail && limits.fail_fast;
                b.slots[index] = Slot::Done {
                    result: Some(r),
                    failed: fail,
                };
                drop(b);
                changed.notify_all();
            }
            Err(panic) => {
                b.stop = true;
                b.slots[index] = Slot::Done {
                    result: None,
                    failed: true,
                };
                drop(b);
                changed.notify_all();
                resume_unwind(panic);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn count_peak(jobs: &[Job], limits: Limits) -> (usize, Vec<Outcome<usize>>) {
        let now = AtomicUsize::new(0);
        let peak = AtomicUsize::new(0);
        let out = run(
            jobs,
            &limits,
            Follow::OnSuccess,
            &|i| {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(30));
                now.fetch_sub(1, Ordering::SeqCst);
                i
            },
            &|_| false,
        );
        (peak.load(Ordering::SeqCst), out)
    }

    #[test]
    fn never_runs_more_than_a_node_allows() {
        let jobs: Vec<Job> = (0..6)
            .map(|_| Job {
                node: Some("a".into()),
                after: None,
            })
            .collect();
        let limits = Limits {
            parallelism: 6,
            per_node: 2,
            fail_fast: false,
        };
        let (peak, out) = count_peak(&jobs, limits);
        assert!(peak <= 2, "peak {peak}");
        assert!(out.iter().all(|o| matches!(o, Outcome::Ran(_))));
    }

    #[test]
    fn a_failed_job_skips_its_followers_and_fail_fast_the_rest() {
        let jobs = vec![
            Job::default(),
            Job {
                node: None,
                after: Some(0),
            },
            Job::default(),
        ];
        let serial = Limits {
            parallelism: 1,
            per_node: 1,
            fail_fast: false,
        };
        let out = run(&jobs, &serial, Follow::OnSuccess, &|i| i, &|r| *r == 0);
        assert!(matches!(out[1], Outcome::Skipped(Skipped::After(0))));
        assert!(matches!(out[2], Outcome::Ran(2)));
        let fast = Limits {
            fail_fast: true,
            ..serial
        };
        let out = run(&jobs, &fast, Follow::OnSuccess, &|i| i, &|r| *r == 0);
        assert!(matches!(out[2], Outcome::Skipped(Skipped::FailFast)));
        let out = run(&jobs, &serial, Follow::Always, &|i| i, &|r| *r == 0);
        assert!(out.iter().all(|o| matches!(o, Outcome::Ran(_))));
    }

    #[test]
    fn a_follower_starts_only_after_its_job_finished() {
        let done = AtomicUsize::new(0);
        let jobs = vec![
            Job::default(),
            Job {
                node: None,
                after: Some(0),
            },
        ];
        let out = run(
            &jobs,
            &Limits::default(),
            Follow::Always,
            &|i| {
                if i == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    done.store(1, Ordering::SeqCst);
                }
                done.load(Ordering::SeqCst)
            },
            &|_| false,
        );
        assert!(matches!(out[1], Outcome::Ran(1)));
    }
}
