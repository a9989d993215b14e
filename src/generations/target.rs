//! On the target: what the stable paths are, the atomic switch (a symlink made beside and
//! renamed over), the adoption of a real folder found at a stable path, the record's
//! reading and writing, and pruning.
//!
//! Adoption: the seeds' box has `/root/ml-env` as a real venv. It is never copied or
//! rebuilt: it is exchanged with the new symlink in one `renameat2(RENAME_EXCHANGE)`, so
//! the stable path is never missing, and then renamed into the generations folder beside
//! it, kept as generation "adopted". Its scripts and its editable install still name
//! `/root/ml-env` and `/root/sglang-main`: it works again exactly when those point at it,
//! which is what a rollback to it does.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::record::{Gate, Generation, Record};
use super::{GENERATIONS_DIR, KEEP, RECORD, UnitFile};
use crate::machine::{HostError, write_file_atomic};

/// What is at a stable path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "is", content = "target", rename_all = "snake_case")]
pub enum LinkState {
    /// Nothing.
    Missing,
    /// A real folder (not yet adopted).
    Folder,
    /// A symlink to this folder.
    Link(String),
    /// Something else (a file).
    Other,
}

/// What the stable path `stable` is.
pub fn state(stable: &str) -> LinkState {
    match fs::symlink_metadata(stable) {
        Err(_) => LinkState::Missing,
        Ok(m) if m.file_type().is_symlink() => fs::read_link(stable)
            .map(|t| LinkState::Link(t.display().to_string()))
            .unwrap_or(LinkState::Other),
        Ok(m) if m.is_dir() => LinkState::Folder,
        Ok(_) => LinkState::Other,
    }
}

/// The record (empty when there is none yet).
pub fn load() -> Result<Record, HostError> {
    match fs::read(RECORD) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| HostError::Unexpected {
            what: RECORD.into(),
            detail: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Record::default()),
        Err(e) => Err(HostError::io("read", Path::new(RECORD))(e)),
    }
}

/// Writes the record atomically, read back.
pub fn save(record: &Record) -> Result<(), HostError> {
    let bytes = serde_json::to_vec_pretty(record).expect("a record serializes");
    write_file_atomic(Path::new(RECORD), &bytes, "root", "root", 0o644)
}

/// The folders the stable paths of the record's newest generation point at now (a real
/// folder or nothing is left out): what runs.
pub fn current_links(record: &Record) -> BTreeMap<String, String> {
    let stables: std::collections::BTreeSet<&String> = record
        .generations
        .iter()
        .flat_map(|g| g.links.keys())
        .collect();
    stables
        .into_iter()
        .filter_map(|s| match state(s) {
            LinkState::Link(t) => Some((s.clone(), t)),
            _ => None,
        })
        .collect()
}

fn io(action: &'static str, path: &str) -> impl FnOnce(std::io::Error) -> HostError {
    HostError::io(action, Path::new(path))
}

fn cstr(p: &str) -> CString {
    CString::new(Path::new(p).as_os_str().as_bytes()).expect("paths have no NUL")
}

/// Swaps two paths in one step (`renameat2(RENAME_EXCHANGE)`, Linux 3.15).
fn exchange(a: &str, b: &str) -> Result<(), HostError> {
    let (ca, cb) = (cstr(a), cstr(b));
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves them as given.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io("exchange with", b)(std::io::Error::last_os_error()))
    }
}

fn sync_parent(path: &str) -> Result<(), HostError> {
    let parent = Path::new(path).parent().unwrap_or(Path::new("/"));
    fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(HostError::io("sync", parent))
}

fn tmp_of(stable: &str) -> String {
    format!("{}.provision-switch", stable.trim_end_matches('/'))
}

fn adopted(dir: &str) -> bool {
    super::short(dir).contains("-adopted-")
}

/// The order to switch `links` in, so that a kill between two switches leaves a venv that
/// works: a built generation's venv names its own folders (its scripts, its editable
/// install), so it goes first; an adopted one names the stable paths, so its checkout
/// goes first and its venv last.
fn order(links: &BTreeMap<String, String>) -> Vec<(&String, &String)> {
    let mut order: Vec<(&String, &String)> = links.iter().collect();
    order.sort_by_key(|(_, dir)| {
        Path::new(dir.as_str()).join("pyvenv.cfg").exists() == adopted(dir)
    });
    order
}

/// Points `stable` at `dir` by a symlink made beside and renamed over it; a real folder
/// there is exchanged with the link and moved to `adopt_to`.
fn point(stable: &str, dir: &str, adopt_to: Option<&str>) -> Result<(), HostError> {
    let tmp = tmp_of(stable);
    if let LinkState::Link(_) | LinkState::Other = state(&tmp) {
        fs::remove_file(&tmp).map_err(io("remove", &tmp))?;
    }
    std::os::unix::fs::symlink(dir, &tmp).map_err(io("make the symlink", &tmp))?;
    match adopt_to {
        Some(to) => {
            exchange(&tmp, stable)?;
            sync_parent(stable)?;
            fs::create_dir_all(Path::new(to).parent().expect("beside a stable path"))
                .map_err(io("create", to))?;
            fs::rename(&tmp, to).map_err(io("move the adopted folder to", to))?;
        }
        None => fs::rename(&tmp, stable).map_err(io("switch", stable))?,
    }
    sync_parent(stable)
}

/// A folder an adoption left at `<stable>.provision-switch` (killed between the exchange
/// and the move) is moved where the record says it goes.
fn finish_adoptions(record: &Record) -> Result<(), HostError> {
    for g in record
        .generations
        .iter()
        .filter(|g| g.gate == Gate::Adopted)
    {
        for (stable, dir) in &g.links {
            let tmp = tmp_of(stable);
            if state(&tmp) == LinkState::Folder && !Path::new(dir).exists() {
                fs::rename(&tmp, dir).map_err(io("move the adopted folder to", dir))?;
            }
        }
    }
    Ok(())
}

/// Whether a generation with these folders names only its own folders (a built one), so a
/// unit pinned to them starts it whatever the stable paths say; an adopted venv names the
/// stable paths and is whole only through them.
fn self_contained(links: &BTreeMap<String, String>) -> bool {
    !links.is_empty() && links.values().all(|d| !adopted(d))
}

fn write_unit(u: &UnitFile, content: &str) -> Result<(), HostError> {
    write_file_atomic(
        Path::new(&u.path),
        content.as_bytes(),
        &u.owner,
        &u.group,
        u.mode,
    )
}

/// `systemctl daemon-reload`, so a restart by hand loads what is on disk now.
fn daemon_reload() -> Result<(), HostError> {
    let out = std::process::Command::new("systemctl")
        .arg("daemon-reload")
        .output()
        .map_err(HostError::io(
            "run systemctl daemon-reload",
            Path::new("systemctl"),
        ))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(HostError::Unexpected {
            what: "systemctl daemon-reload".into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Where a test holds a switch at one of its points (see [`hold`]); `/run` is emptied at a
/// boot, so a hold never outlives the boot it was made in.
pub const HOLD_DIR: &str = "/run/provision/hold-switch";

/// A test's hold on a switch at `point` (`pinned`, `one-link`, `linked`, `written`): while
/// `HOLD_DIR/<point>` exists, the switch says so in `HOLD_DIR/<point>.reached` and waits
/// there until it is killed or the file is removed. The lab's kill -9 test uses it to kill
/// at each step of a switch; without the file it costs one `stat`.
fn hold(point: &str) {
    let file = Path::new(HOLD_DIR).join(point);
    if !file.exists() {
        return;
    }
    let _ = fs::write(Path::new(HOLD_DIR).join(format!("{point}.reached")), b"");
    while file.exists() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Moves the stable paths from `before` to `links` with `units` (the arriving generation's
/// unit files) written as part of it, so that at every point on disk, and in what systemd
/// has loaded, each unit starts one whole generation (a reboot or a `systemctl restart` by
/// hand between any two steps included):
/// 1. each unit is written pinned ([`super::pin`]) to the folders of a generation that is
///    whole by itself — the arriving one when it was built, else (going back to an adopted
///    folder) the leaving one — and systemd reloads it;
/// 2. the links are switched, one rename each (a pinned unit does not read them);
/// 3. each unit is written as declared (naming the stable paths, now the arriving's).
///
/// Each write is atomic and read back. What was done, in words.
fn move_links(
    before: &BTreeMap<String, String>,
    links: &BTreeMap<String, String>,
    units: &[UnitFile],
    adopt: &BTreeMap<String, String>,
) -> Result<Vec<String>, HostError> {
    let mut notes = Vec::new();
    if !units.is_empty() {
        let mut pinned = false;
        for u in units {
            let content = if self_contained(links) {
                Some(super::pin(&u.content, links))
            } else if self_contained(before) {
                fs::read_to_string(&u.path)
                    .ok()
                    .map(|c| super::pin(&c, before))
            } else {
                None
            };
            if let Some(c) = content {
                write_unit(u, &c)?;
                pinned = true;
            }
        }
        if pinned {
            daemon_reload()?;
        }
        hold("pinned");
    }
    for (stable, dir) in order(links) {
        if before.get(stable) == Some(dir) {
            continue;
        }
        if !notes.is_empty() {
            hold("one-link");
        }
        point(stable, dir, adopt.get(stable).map(String::as_str))?;
        notes.push(format!("{stable} -> {dir}"));
    }
    hold("linked");
    for u in units {
        write_unit(u, &u.content)?;
        notes.push(format!("{} written with the switch", u.path));
    }
    hold("written");
    Ok(notes)
}

/// Makes `links` current: adopts real folders found at stable paths (recorded first),
/// switches every link, records the new generation as not gated yet, and prunes. What
/// was done, in words.
pub fn switch(
    links: &BTreeMap<String, String>,
    units: &[UnitFile],
    at: String,
) -> Result<Vec<String>, HostError> {
    let mut record = load()?;
    finish_adoptions(&record)?;
    for dir in links.values() {
        if !Path::new(dir).is_dir() {
            return Err(HostError::Unexpected {
                what: dir.clone(),
                detail: "the generation to switch to is not built".into(),
            });
        }
    }
    let mut notes = Vec::new();
    // What runs now, as a generation: links as they are, real folders to be adopted.
    let mut before = BTreeMap::new();
    let mut adopt = BTreeMap::new();
    for stable in links.keys() {
        match state(stable) {
            LinkState::Link(t) => {
                before.insert(stable.clone(), t);
            }
            LinkState::Folder => {
                let to = super::generation_dir(stable, &format!("adopted-{}", at.replace(':', "")));
                before.insert(stable.clone(), to.clone());
                adopt.insert(stable.clone(), to);
            }
            LinkState::Missing => {}
            LinkState::Other => {
                return Err(HostError::Unexpected {
                    what: stable.clone(),
                    detail: "a file is where the generation's symlink goes; provision does not remove it".into(),
                });
            }
        }
    }
    if &before == links {
        // Nothing to move: each unit is one atomic write.
        for u in units {
            write_unit(u, &u.content)?;
        }
        return Ok(notes);
    }
    if !adopt.is_empty() {
        record.push(at.clone(), before.clone(), BTreeMap::new(), Gate::Adopted);
        for (stable, to) in &adopt {
            notes.push(format!("{stable} (a real folder) adopted as {to}"));
        }
    }
    // Recorded, not gated, before anything moves: an apply killed at any point of the
    // switch leaves it pending, so the next apply switches (or finishes switching) to it
    // and gates it. A generation already in the record (a rollback's target, a re-switch)
    // is not a new one; it is gated again.
    match record
        .generations
        .iter_mut()
        .rev()
        .find(|g| &g.links == links)
    {
        Some(g) if g.gate != Gate::Adopted => g.gate = Gate::Pending,
        Some(_) => {}
        None => {
            record.push(at, links.clone(), BTreeMap::new(), Gate::Pending);
        }
    }
    save(&record)?;
    notes.extend(move_links(&before, links, units, &adopt)?);
    notes.extend(prune(&mut record, links)?);
    Ok(notes)
}

/// What the generations folders beside `stables` hold (folders only, full paths).
pub fn folders(stables: &[String]) -> Vec<String> {
    let mut out: Vec<String> = stables
        .iter()
        .map(|s| super::generation_dir(s, ""))
        .filter_map(|d| Path::new(&d).parent().map(Path::to_path_buf))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter_map(|d| fs::read_dir(d).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path().display().to_string())
        .collect();
    out.sort();
    out
}

/// Whether a process runs from `dir`: its working folder, its program or a file it maps
/// is inside it, or its command line names it (a pinned unit's). A folder a process uses
/// is never pruned, whatever the record says.
fn in_use(dir: &str) -> bool {
    let inside = |p: &str| p == dir || p.starts_with(&format!("{dir}/"));
    let Ok(procs) = fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|p| {
        let pid = p.path();
        ["cwd", "exe"]
            .iter()
            .any(|l| fs::read_link(pid.join(l)).is_ok_and(|t| inside(&t.display().to_string())))
            || fs::read(pid.join("cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0)
                    .any(|a| inside(&String::from_utf8_lossy(a)))
            })
            || fs::read_to_string(pid.join("maps")).is_ok_and(|m| {
                m.lines()
                    .any(|l| l.split_whitespace().nth(5).is_some_and(inside))
            })
    })
}

/// Deletes the folders of generations no longer kept ([`KEEP`]) and of generations built
/// but never switched to, never one outside a generations folder nor one a process runs
/// from. What was deleted, in words.
pub fn prune(
    record: &mut Record,
    current: &BTreeMap<String, String>,
) -> Result<Vec<String>, HostError> {
    let stables: Vec<String> = current.keys().cloned().collect();
    let recorded: std::collections::BTreeSet<String> = record
        .generations
        .iter()
        .flat_map(|g| g.links.values().cloned())
        .collect();
    let gone = record.prune_with(current, KEEP, &folders(&stables));
    save(record)?;
    let mut notes = Vec::new();
    for dir in gone {
        if !dir.contains(&format!("/{GENERATIONS_DIR}/")) || !Path::new(&dir).exists() {
            continue;
        }
        if in_use(&dir) {
            notes.push(format!("kept {dir}: a process runs from it"));
            continue;
        }
        fs::remove_dir_all(&dir).map_err(io("remove the old generation", &dir))?;
        let why = if recorded.contains(&dir) {
            "an older generation"
        } else {
            "built, never switched to"
        };
        notes.push(format!("pruned {dir} ({why})"));
    }
    Ok(notes)
}

/// After a health gate on what runs now: records `unit`'s file and the verdict on the
/// generation the stable paths point at. Nothing when there are no generations.
pub fn gated(unit: &str, unit_file: &str, passed: bool, at: String) -> Result<(), HostError> {
    let mut record = load()?;
    let now = current_links(&record);
    if now.is_empty() {
        return Ok(());
    }
    let gate = if passed { Gate::Passed } else { Gate::Failed };
    let units = BTreeMap::from([(unit.to_string(), unit_file.to_string())]);
    match record.generations.iter_mut().rev().find(|g| g.links == now) {
        // Switched to in this apply, or gated again with the same unit: this is it.
        Some(g) if g.gate == Gate::Pending || g.units.get(unit).is_none_or(|u| u == unit_file) => {
            g.units.insert(unit.to_string(), unit_file.to_string());
            if !(g.gate == Gate::Adopted && passed) {
                g.gate = gate;
            }
        }
        // The same software with another unit (a new flag, another model): a generation of
        // its own, so a rollback can come back to either.
        _ => {
            record.push(at, now, units, gate);
        }
    }
    save(&record)
}

/// The generation a failed gate (or `rollback`) goes back to for `unit` now running with
/// `unit_file`, if there is one.
pub fn previous_good(unit: &str, unit_file: &str) -> Result<Option<Generation>, HostError> {
    let record = load()?;
    let now = current_links(&record);
    if now.is_empty() {
        return Ok(None);
    }
    Ok(record.previous_good(&now, unit, unit_file).cloned())
}

/// Points the stable paths back at `g`'s folders with its unit files written as part of it
/// (as a switch does; no record entry: the gate that follows records it).
pub fn restore(g: &Generation, units: &[UnitFile]) -> Result<(), HostError> {
    let mut before = BTreeMap::new();
    for (stable, dir) in &g.links {
        if !Path::new(dir).is_dir() {
            return Err(HostError::Unexpected {
                what: dir.clone(),
                detail: "the generation to go back to is no longer there".into(),
            });
        }
        if let LinkState::Link(t) = state(stable) {
            before.insert(stable.clone(), t);
        }
    }
    move_links(&before, &g.links, units, &BTreeMap::new()).map(|_| ())
}

/// Marks the newest generation with `links` with a note (what a rollback did).
pub fn note(links: &BTreeMap<String, String>, text: String) -> Result<(), HostError> {
    let mut record = load()?;
    if let Some(g) = record
        .generations
        .iter_mut()
        .rev()
        .find(|g| &g.links == links)
    {
        g.note = Some(text);
        save(&record)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_folder_is_exchanged_with_the_link_and_never_missing() {
        let t = tempfile::tempdir().unwrap();
        let stable = t.path().join("ml-env").display().to_string();
        fs::create_dir(&stable).unwrap();
        fs::write(format!("{stable}/pyvenv.cfg"), "version = 3.11.2\n").unwrap();
        let new = super::super::generation_dir(&stable, "n1");
        fs::create_dir_all(&new).unwrap();
        let to = super::super::generation_dir(&stable, "adopted-x");
        point(&stable, &new, Some(&to)).unwrap();
        assert_eq!(state(&stable), LinkState::Link(new.clone()));
        assert!(Path::new(&to).join("pyvenv.cfg").exists());
        assert_eq!(state(&tmp_of(&stable)), LinkState::Missing);
        // And back, by a plain switch.
        point(&stable, &to, None).unwrap();
        assert_eq!(
            fs::read_to_string(format!("{stable}/pyvenv.cfg")).unwrap(),
            "version = 3.11.2\n"
        );
    }
}
