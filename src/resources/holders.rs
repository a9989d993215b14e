//! Which running processes hold files under a folder, open or mapped. Deleting a model
//! folder frees its space only when none does: the kernel keeps an unlinked file's blocks
//! while a descriptor or a mapping refers to it (unlink(2)). A server's `ExecStart` need not
//! name the folder (a symlink, an environment file, a wrapper script), so the plan's fit
//! check asks the kernel, as `lsof +D` and `fuser` do: every `/proc/PID/fd` link and every
//! mapped file in `/proc/PID/maps`. A holder is named by the systemd service its process
//! runs in (its cgroup), which is what `--allow-downtime` can stop, or as `process COMM`
//! when it runs in none.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::machine::HostError;

/// Probe: the services (or processes) that hold files under a folder (a model folder no
/// longer declared, for the plan's fit check).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct HoldersProbe {
    /// The folder.
    pub path: String,
}

impl crate::resources::wire::AgentProbe for HoldersProbe {
    fn answer(
        &self,
        _verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        Ok(crate::resources::wire::Fact::Holders(Some(holders(
            Path::new(&self.path),
        )?)))
    }
}

/// The names of what holds files under `dir`, sorted: `NAME.service`, or `process COMM`
/// for a process outside any service. Empty when `dir` does not exist.
pub fn holders(dir: &Path) -> Result<Vec<String>, HostError> {
    let mut names = BTreeSet::new();
    for pid in holder_pids(dir)? {
        if let Some(name) = name_of(pid) {
            names.insert(name);
        }
    }
    Ok(names.into_iter().collect())
}

/// The processes (other than this one) with a descriptor or a mapping of a file under
/// `dir`. A process that ends while it is read is skipped.
pub fn holder_pids(dir: &Path) -> Result<Vec<u32>, HostError> {
    let dir = match std::fs::canonicalize(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(HostError::io("resolve", dir)(e)),
        Ok(d) => d,
    };
    let proc = Path::new("/proc");
    let me = std::process::id();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(proc).map_err(HostError::io("read", proc))? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != me && holds(pid, &dir) {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

/// Whether process `pid` has a file under `dir` open (a descriptor) or mapped.
fn holds(pid: u32, dir: &Path) -> bool {
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && under(&target, dir)
            {
                return true;
            }
        }
    }
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|maps| {
            maps.lines()
                .filter_map(mapped_path)
                .any(|p| under(Path::new(p), dir))
        })
        .unwrap_or(false)
}

/// Whether `path` (as the kernel prints it: a deleted file keeps its old path with
/// ` (deleted)` after it) is `dir` or under it.
fn under(path: &Path, dir: &Path) -> bool {
    let text = path.to_string_lossy();
    let path = PathBuf::from(text.strip_suffix(" (deleted)").unwrap_or(&text));
    path.starts_with(dir)
}

/// The file a `/proc/PID/maps` line maps (`ADDR PERMS OFFSET DEV INODE PATH`), if it names
/// one: anonymous mappings and `[heap]`-style names have no path.
fn mapped_path(line: &str) -> Option<&str> {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start();
        rest = &rest[rest.find(char::is_whitespace)?..];
    }
    let path = rest.trim_start();
    path.starts_with('/').then_some(path)
}

/// What `pid` is named as a holder: its service, or `process COMM`.
fn name_of(pid: u32) -> Option<String> {
    if let Some(unit) = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|c| service_of_cgroup(&c))
    {
        return Some(unit);
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(format!("process {}", comm.trim_end()))
}

/// The systemd service a `/proc/PID/cgroup` places its process in: the unified hierarchy's
/// line (`0::/system.slice/x.service`), else cgroup v1's `name=systemd` one; the innermost
/// `.service` of the path (a service's own sub-cgroups sit below it).
fn service_of_cgroup(text: &str) -> Option<String> {
    let path_of = |want: &dyn Fn(&str, &str) -> bool| {
        text.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            want(id, controllers).then_some(path)
        })
    };
    let path = path_of(&|id, c| id == "0" && c.is_empty())
        .or_else(|| path_of(&|_, c| c.split(',').any(|c| c == "name=systemd")))?;
    path.rsplit('/')
        .find(|part| part.ends_with(".service"))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_maps_line_names_its_file_and_anonymous_ones_none() {
        let file = "7f0e2c000000-7f0e2c400000 r--s 00000000 fd:01 1234   /shared/models/a/model-00001.safetensors";
        assert_eq!(
            mapped_path(file),
            Some("/shared/models/a/model-00001.safetensors")
        );
        let spaced =
            "7f0e2c000000-7f0e2c400000 r--p 00000000 fd:01 99 /shared/my models/x (deleted)";
        assert_eq!(mapped_path(spaced), Some("/shared/my models/x (deleted)"));
        assert!(under(
            Path::new("/shared/my models/x (deleted)"),
            Path::new("/shared/my models")
        ));
        assert_eq!(
            mapped_path("7ffd1000-7ffd3000 rw-p 00000000 00:00 0 [stack]"),
            None
        );
        assert_eq!(mapped_path("7ffd1000-7ffd3000 rw-p 00000000 00:00 0"), None);
        assert!(!under(
            Path::new("/shared/models/ab"),
            Path::new("/shared/models/a")
        ));
    }

    #[test]
    fn a_cgroup_names_the_innermost_service_on_v2_and_v1() {
        assert_eq!(
            service_of_cgroup("0::/system.slice/sglang-qwen.service\n").as_deref(),
            Some("sglang-qwen.service")
        );
        let v1 = "12:memory:/lxc/150/system.slice/a.service\n1:name=systemd:/system.slice/sglang-a.service/payload\n";
        assert_eq!(service_of_cgroup(v1).as_deref(), Some("sglang-a.service"));
        assert_eq!(service_of_cgroup("0::/user.slice/session-3.scope\n"), None);
    }

    /// A real process holding a file under a folder, open and then deleted: found by its
    /// pid until it ends.
    #[test]
    fn a_process_holding_a_file_under_the_folder_is_found_even_once_the_file_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.safetensors");
        std::fs::write(&file, b"weights").unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::fs::File::open(&file).unwrap())
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(holder_pids(dir.path()).unwrap().contains(&pid));
        std::fs::remove_file(&file).unwrap();
        assert!(holder_pids(dir.path()).unwrap().contains(&pid));
        let names = holders(dir.path()).unwrap();
        assert!(
            names
                .iter()
                .any(|n| n.ends_with(".service") || n == "process sleep"),
            "{names:?}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!holder_pids(dir.path()).unwrap().contains(&pid));
        assert!(holders(&dir.path().join("absent")).unwrap().is_empty());
    }
}
