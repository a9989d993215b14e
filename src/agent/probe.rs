//! Answers probes on the target itself: read-only, and mostly without starting programs
//! (dpkg's status file, a venv's dist-info folders and a file's bytes are read directly).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::engine::facts::{
    CudaFact, Fact, GitFact, PathFact, PathKind, Probe, UnitFact, VenvFact,
};
use crate::inventory::software::normalize_package_name;

/// Files up to this size are hashed; larger ones (not config files) are only stat'ed.
const HASH_LIMIT: u64 = 256 * 1024 * 1024;
/// Files up to this size are sent back whole when they are text, for diffs.
const CONTENT_LIMIT: u64 = 256 * 1024;

/// The unit properties the service resource and the health gate read.
pub const UNIT_PROPERTIES: &[&str] = &[
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "UnitFileState",
    "NRestarts",
    "ExecMainStatus",
    "ExecMainPID",
    "MainPID",
    "NeedDaemonReload",
    "FragmentPath",
    "ExecStart",
    "Environment",
    "Result",
    "DropInPaths",
    "ExecMainStartTimestampMonotonic",
];

/// Answers one probe. Errors reading what exists are reported in the fact's absence only
/// when the thing is truly absent; anything else is an `Err`.
pub fn answer(probe: &Probe, verify_full: bool) -> Result<Fact, String> {
    Ok(match probe {
        Probe::Path { path } => Fact::Path(path_fact(Path::new(path))?),
        Probe::Packages { names } => Fact::Packages(packages(names)?),
        Probe::Venv { path } => Fact::Venv(venv(Path::new(path))?),
        Probe::Git { path } => Fact::Git(git(Path::new(path))?),
        Probe::Cuda { home } => Fact::Cuda(cuda(Path::new(home))),
        Probe::Unit { name } => Fact::Unit(unit(name)?),
        Probe::Readiness {
            url,
            served_model_name,
        } => Fact::Readiness(Some(crate::health::process::readiness(
            url,
            served_model_name,
        ))),
        Probe::Model { path } => {
            Fact::Model(crate::agent::model_fact(Path::new(path), verify_full)?)
        }
        Probe::PveContainer { .. } => {
            return Err(
                "a container's Proxmox config is read through the node's API, not the agent".into(),
            );
        }
    })
}

/// Owner and group names from /etc/passwd and /etc/group (uid/gid as text when unnamed).
fn id_names() -> (BTreeMap<u32, String>, BTreeMap<u32, String>) {
    let read = |file: &str| -> BTreeMap<u32, String> {
        fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?;
                let id = f.nth(1)?.parse().ok()?;
                Some((id, name.to_string()))
            })
            .collect()
    };
    (read("/etc/passwd"), read("/etc/group"))
}

/// What is at `path` (not following a final symlink).
pub fn path_fact(path: &Path) -> Result<Option<PathFact>, String> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot stat {}: {e}", path.display())),
    };
    let ft = meta.file_type();
    let kind = if ft.is_file() {
        PathKind::File
    } else if ft.is_dir() {
        PathKind::Dir
    } else if ft.is_symlink() {
        PathKind::Symlink
    } else {
        PathKind::Other
    };
    let (users, groups) = id_names();
    let name =
        |map: &BTreeMap<u32, String>, id: u32| map.get(&id).cloned().unwrap_or(id.to_string());
    let mut fact = PathFact {
        kind,
        mode: meta.permissions().mode() & 0o7777,
        owner: name(&users, meta.uid()),
        group: name(&groups, meta.gid()),
        size: meta.len(),
        sha256: None,
        content: None,
    };
    if kind == PathKind::File && meta.len() <= HASH_LIMIT {
        let mut file =
            fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut hasher = Sha256::new();
        let mut small = Vec::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file
                .read(&mut buf)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            if meta.len() <= CONTENT_LIMIT {
                small.extend_from_slice(&buf[..n]);
            }
        }
        fact.sha256 = Some(hex::encode(hasher.finalize()));
        if meta.len() <= CONTENT_LIMIT {
            fact.content = String::from_utf8(small).ok();
        }
    }
    Ok(Some(fact))
}

/// Installed versions from dpkg's status file (no `dpkg-query` process needed).
pub fn packages(names: &[String]) -> Result<BTreeMap<String, Option<String>>, String> {
    let status = match fs::read_to_string("/var/lib/dpkg/status") {
        Ok(s) => s,
        Err(e) => {
            return Err(format!(
                "cannot read /var/lib/dpkg/status (is this Debian or Ubuntu?): {e}"
            ));
        }
    };
    Ok(parse_dpkg_status(&status, names))
}

/// The versions of `names` installed according to a dpkg status file's text.
pub fn parse_dpkg_status(status: &str, names: &[String]) -> BTreeMap<String, Option<String>> {
    let mut out: BTreeMap<String, Option<String>> =
        names.iter().map(|n| (n.clone(), None)).collect();
    for stanza in status.split("\n\n") {
        let mut package = None;
        let mut installed = false;
        let mut version = None;
        for line in stanza.lines() {
            if let Some(v) = line.strip_prefix("Package: ") {
                package = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Status: ") {
                installed = v.trim().ends_with(" installed");
            } else if let Some(v) = line.strip_prefix("Version: ") {
                version = Some(v.trim().to_string());
            }
        }
        if let (Some(p), true) = (package, installed)
            && let Some(slot) = out.get_mut(p)
        {
            *slot = version;
        }
    }
    out
}

/// A venv: Python release from `pyvenv.cfg`, distributions from `*.dist-info`.
pub fn venv(path: &Path) -> Result<Option<VenvFact>, String> {
    let cfg = match fs::read_to_string(path.join("pyvenv.cfg")) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}/pyvenv.cfg: {e}", path.display())),
    };
    let version = cfg
        .lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| matches!(k.trim(), "version" | "version_info"))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let python = version.split('.').take(2).collect::<Vec<_>>().join(".");
    let mut packages = BTreeMap::new();
    let mut editable = BTreeMap::new();
    let lib = path.join("lib");
    let pythons = fs::read_dir(&lib).map_err(|e| format!("cannot read {}: {e}", lib.display()))?;
    for py in pythons.flatten() {
        let site = py.path().join("site-packages");
        let Ok(entries) = fs::read_dir(&site) else {
            continue;
        };
        for entry in entries.flatten() {
            let p = entry.path();
            if p.extension().is_none_or(|e| e != "dist-info") {
                continue;
            }
            let Ok(meta) = fs::read_to_string(p.join("METADATA")) else {
                continue;
            };
            let field = |name: &str| {
                meta.lines()
                    .take_while(|l| !l.is_empty())
                    .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            };
            let (Some(name), Some(ver)) = (field("Name:"), field("Version:")) else {
                continue;
            };
            let key = normalize_package_name(&name);
            if let Ok(direct) = fs::read_to_string(p.join("direct_url.json"))
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&direct)
                && v["dir_info"]["editable"] == serde_json::Value::Bool(true)
                && let Some(url) = v["url"].as_str()
            {
                // pip writes a file URL, percent-encoded: the folder is its decoded path.
                let folder = url::Url::parse(url)
                    .ok()
                    .and_then(|u| u.to_file_path().ok())
                    .map_or_else(|| url.to_string(), |p| p.display().to_string());
                editable.insert(key.clone(), folder);
            }
            packages.insert(key, ver);
        }
    }
    Ok(Some(VenvFact {
        python,
        packages,
        editable,
    }))
}

/// A git checkout through git itself (HEAD, origin, local changes to tracked files).
pub fn git(path: &Path) -> Result<Option<GitFact>, String> {
    if !path.join(".git").exists() {
        return Ok(None);
    }
    let run = |args: &[&str]| -> Result<String, String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(path)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run git: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(format!(
                "git {} in {} failed: {}",
                args.join(" "),
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    let head = run(&["rev-parse", "HEAD"])?;
    let origin = run(&["config", "--get", "remote.origin.url"]).ok();
    let dirty = !run(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Ok(Some(GitFact {
        head,
        origin,
        dirty,
    }))
}

/// A CUDA toolkit: `version.json` and what its nvcc reports.
pub fn cuda(home: &Path) -> Option<CudaFact> {
    if !home.is_dir() {
        return None;
    }
    let version_json = fs::read_to_string(home.join("version.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["cuda"]["version"].as_str().map(str::to_string));
    let nvcc_release = Command::new(home.join("bin/nvcc"))
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| parse_nvcc_release(&String::from_utf8_lossy(&o.stdout)));
    Some(CudaFact {
        nvcc_release,
        version_json,
    })
}

/// `13.0` from nvcc's `Cuda compilation tools, release 13.0, V13.0.88`.
pub fn parse_nvcc_release(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.split_once("release ").map(|(_, r)| r))
        .and_then(|r| r.split(',').next())
        .map(|r| r.trim().to_string())
}

/// A unit's state from `systemctl show`; `None` when systemd does not know it.
pub fn unit(name: &str) -> Result<Option<UnitFact>, String> {
    let out = Command::new("systemctl")
        .arg("show")
        .arg(format!("--property={}", UNIT_PROPERTIES.join(",")))
        .arg("--")
        .arg(name)
        .output()
        .map_err(|e| format!("cannot run systemctl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "systemctl show {name} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let properties: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if properties.get("LoadState").map(String::as_str) == Some("not-found") {
        return Ok(None);
    }
    let process = crate::health::process::main_process(&properties);
    Ok(Some(UnitFact {
        properties,
        process,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpkg_status_installed_only() {
        let status = "Package: git\nStatus: install ok installed\nVersion: 1:2.39.5-0+deb12u2\n\nPackage: vim\nStatus: deinstall ok config-files\nVersion: 2:9.0\n";
        let got = parse_dpkg_status(status, &["git".into(), "vim".into(), "curl".into()]);
        assert_eq!(got["git"].as_deref(), Some("1:2.39.5-0+deb12u2"));
        assert_eq!(got["vim"], None);
        assert_eq!(got["curl"], None);
    }

    #[test]
    fn nvcc_release_line() {
        let text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0\n";
        assert_eq!(parse_nvcc_release(text).as_deref(), Some("13.0"));
    }

    #[test]
    fn path_fact_of_a_file_and_absent() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.conf");
        fs::write(&f, "hello\n").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
        let fact = path_fact(&f).unwrap().unwrap();
        assert_eq!(fact.kind, PathKind::File);
        assert_eq!(fact.mode, 0o640);
        assert_eq!(fact.content.as_deref(), Some("hello\n"));
        assert_eq!(
            fact.sha256.as_deref(),
            Some("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03")
        );
        assert_eq!(path_fact(&dir.path().join("nope")).unwrap(), None);
    }

    #[test]
    fn venv_from_dist_info() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path();
        fs::write(v.join("pyvenv.cfg"), "home = /usr/bin\nversion = 3.11.2\n").unwrap();
        let site = v.join("lib/python3.11/site-packages");
        for (name, ver, editable) in [
            ("Torch", "2.9.1", None),
            ("sglang", "0.5.10", Some("/root/sglang-main/python")),
        ] {
            let d = site.join(format!("{name}-{ver}.dist-info"));
            fs::create_dir_all(&d).unwrap();
            fs::write(
                d.join("METADATA"),
                format!("Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n\nbody"),
            )
            .unwrap();
            if let Some(src) = editable {
                fs::write(
                    d.join("direct_url.json"),
                    format!("{{\"url\": \"file://{src}\", \"dir_info\": {{\"editable\": true}}}}"),
                )
                .unwrap();
            }
        }
        let fact = venv(v).unwrap().unwrap();
        assert_eq!(fact.python, "3.11");
        assert_eq!(fact.packages["torch"], "2.9.1");
        assert_eq!(fact.editable["sglang"], "/root/sglang-main/python");
        assert_eq!(venv(&v.join("absent")).unwrap(), None);
    }
}
