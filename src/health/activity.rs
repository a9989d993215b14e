//! How much a unit's processes have done: the counters the health gate watches besides the
//! journal. Real SGLang shows its weight loading as a tqdm bar, which writes carriage
//! returns and no newline; journald holds such output until a newline or its 48 KiB line
//! limit, so the journal stays silent through a load of many minutes. What the processes
//! write, read and compute moves all the while, and the kernel counts it for each process
//! (`/proc/PID/io`, `/proc/PID/stat`) no matter where their output goes; GPU memory grows
//! as weights arrive. The seeds' hang at NCCL init moved none of them (zero CPU, 1 GB per
//! GPU, no output) for ten minutes.

use std::collections::BTreeSet;
use std::fs;
use std::process::Command;

/// Cumulative counters summed over the unit's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Activity {
    /// How many processes the unit has.
    pub processes: u32,
    /// Bytes they passed to `write` (`wchar`): their output, carriage-return updates
    /// included, whether it goes to the journal, a file or a pipe.
    pub written: u64,
    /// Bytes they read (`rchar`) plus bytes fetched from storage for them (`read_bytes`,
    /// which counts the pages an mmap-ed safetensors file faults in).
    pub read: u64,
    /// CPU time, user and system, in milliseconds.
    pub cpu_ms: u64,
    /// GPU memory in use on the GPUs this machine sees, MiB; `None` without `nvidia-smi`.
    pub gpu_mib: Option<u64>,
}

/// Which counters grew between two readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Moved {
    /// Output was written.
    pub output: bool,
    /// Data was read.
    pub reads: bool,
    /// CPU time was used beyond idle (at least 1/20 of a core over the interval).
    pub cpu: bool,
    /// GPU memory grew.
    pub gpu: bool,
}

impl Moved {
    /// Whether anything moved.
    pub fn any(self) -> bool {
        self.output || self.reads || self.cpu || self.gpu
    }

    /// What moved, for people (`output, reads`).
    pub fn describe(self) -> String {
        let parts: Vec<&str> = [
            (self.output, "output"),
            (self.reads, "reads"),
            (self.cpu, "CPU"),
            (self.gpu, "GPU memory"),
        ]
        .into_iter()
        .filter_map(|(m, name)| m.then_some(name))
        .collect();
        parts.join(", ")
    }
}

impl Activity {
    /// What grew from `before` to `self`, `interval_ms` apart. A counter that fell (a
    /// process exited and took its counts along) is no progress.
    pub fn moved_since(&self, before: &Activity, interval_ms: u64) -> Moved {
        let cpu_delta = self.cpu_ms.saturating_sub(before.cpu_ms);
        Moved {
            output: self.written > before.written,
            reads: self.read > before.read,
            // A sleeping Python process uses no CPU at all; a few ticks of housekeeping
            // must not hide a hang, so less than 5% of one core does not count.
            cpu: cpu_delta > 0 && cpu_delta * 20 >= interval_ms.max(1),
            gpu: matches!((self.gpu_mib, before.gpu_mib), (Some(now), Some(then)) if now > then),
        }
    }
}

/// The unit's processes: its control group's members (cgroup v2, or the unified or
/// systemd hierarchy of a hybrid setup), else the main process and its descendants.
pub fn unit_pids(control_group: &str, main_pid: Option<u32>) -> Vec<u32> {
    let mut pids = BTreeSet::new();
    if !control_group.is_empty() {
        for root in [
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup/systemd",
        ] {
            collect_cgroup(&format!("{root}{control_group}"), &mut pids);
            if !pids.is_empty() {
                break;
            }
        }
    }
    if pids.is_empty()
        && let Some(main) = main_pid
    {
        pids.insert(main);
        pids.extend(descendants(main));
    }
    pids.into_iter().collect()
}

fn collect_cgroup(dir: &str, pids: &mut BTreeSet<u32>) {
    if let Ok(text) = fs::read_to_string(format!("{dir}/cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_cgroup(&e.path().to_string_lossy(), pids);
        }
    }
}

/// Every process whose chain of parents leads to `root`.
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat_fields(pid)?.ppid)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

struct Stat {
    ppid: u32,
    cpu_ticks: u64,
}

/// `/proc/PID/stat`: fields after the command name, which may hold spaces and parens.
fn stat_fields(pid: u32) -> Option<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is the state (field 3); ppid is field 4, utime 14, stime 15.
    Some(Stat {
        ppid: f.get(1)?.parse().ok()?,
        cpu_ticks: f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?,
    })
}

/// `(rchar + read_bytes, wchar)` from `/proc/PID/io`.
fn io_counts(pid: u32) -> Option<(u64, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    Some(parse_io(&text))
}

fn parse_io(text: &str) -> (u64, u64) {
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (get("rchar:") + get("read_bytes:"), get("wchar:"))
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// GPU memory in use on every GPU this machine sees, MiB, when `nvidia-smi` answers.
/// Summed over GPUs rather than matched by PID: inside a container nvidia-smi reports the
/// host's PIDs, which do not match the container's.
pub fn gpu_memory_mib() -> Option<u64> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().parse::<u64>().ok())
        .sum()
}

/// Reads the counters of `pids` now; `gpu` says whether to ask nvidia-smi.
pub fn read(pids: &[u32], gpu: bool) -> Activity {
    let hz = ticks_per_second();
    let mut a = Activity::default();
    for &pid in pids {
        let (Some((read, written)), Some(stat)) = (io_counts(pid), stat_fields(pid)) else {
            continue;
        };
        a.processes += 1;
        a.read += read;
        a.written += written;
        a.cpu_ms += stat.cpu_ticks * 1000 / hz;
    }
    if gpu {
        a.gpu_mib = gpu_memory_mib();
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_a_command_name_holding_parens_and_spaces() {
        let line = "4242 (python3 (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 3 0 12345 1000 100";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.ppid, 1);
        assert_eq!(s.cpu_ticks, 281);
    }

    #[test]
    fn io_counts_reads_and_storage_reads() {
        let text = "rchar: 1000\nwchar: 77\nsyscr: 3\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_io(text), (5096, 77));
    }

    #[test]
    fn what_counts_as_moving() {
        let before = Activity {
            processes: 1,
            written: 100,
            read: 1000,
            cpu_ms: 500,
            gpu_mib: Some(1024),
        };
        assert!(!before.moved_since(&before, 500).any());
        let idle_tick = Activity {
            cpu_ms: 510,
            ..before
        };
        assert!(!idle_tick.moved_since(&before, 2000).any(), "10 ms in 2 s");
        let busy = Activity {
            cpu_ms: 900,
            ..before
        };
        assert!(busy.moved_since(&before, 2000).cpu);
        let carriage_return = Activity {
            written: 180,
            ..before
        };
        assert_eq!(
            carriage_return.moved_since(&before, 500).describe(),
            "output"
        );
        let exited = Activity {
            processes: 0,
            written: 0,
            read: 0,
            cpu_ms: 0,
            gpu_mib: Some(1024),
        };
        assert!(!exited.moved_since(&before, 500).any());
        let weights = Activity {
            gpu_mib: Some(40_000),
            ..before
        };
        assert!(weights.moved_since(&before, 500).gpu);
    }

    #[test]
    fn this_process_is_counted() {
        let me = std::process::id();
        let a = read(&[me], false);
        assert_eq!(a.processes, 1);
        assert!(a.read > 0, "{a:?}");
        let _ = std::fs::read("/proc/self/status").unwrap();
        let b = read(&[me], false);
        assert!(b.read > a.read, "{a:?} {b:?}");
    }
}
