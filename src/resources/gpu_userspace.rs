//! The NVIDIA userspace driver inside a GPU container: `libcuda.so.1`, `libnvidia-ml.so.1`
//! and `nvidia-smi` at exactly the version of the node's loaded kernel module (another
//! version gives `Failed to initialize NVML: Driver/library version mismatch`). The wanted
//! version is the node's, read with its GPU facts at plan time, so a driver changed on the
//! node is drift of every GPU container's userspace until apply installs the new one.
//!
//! Two sources: NVIDIA's `.run` installer (downloaded by the node into its cache, sha256
//! checked there before anything is pushed, pushed into the container with `pct push`,
//! checked again there, run with `--no-kernel-module --silent`: the module is the node's), or distribution packages pinned to that version. What is there is read
//! the way the loader finds it: the `libcuda.so.1` and `libnvidia-ml.so.1` links in the
//! system library folders and the file each names (`libcuda.so.<version>`, as both the
//! `.run` and the packages install it; `tests/fixtures/gpu/h200x2/libs-ls.txt`).

use crate::resources::op::{Allowed, NodeOp, Op, guest};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::nvidia_host::unexpected;
use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::hub::{client_error, error_chain};
use crate::machine::HostError;
use crate::plan::{Action, Attribute, Change};

/// The folders the loader searches for the driver's libraries on Debian, Ubuntu and
/// others, in the order they are read.
const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
];

/// Where `nvidia-smi` is installed by the `.run` and by the packages.
const SMI_PATHS: &[&str] = &["/usr/bin/nvidia-smi", "/usr/local/bin/nvidia-smi"];

/// Where the node keeps downloaded installers (reused while their checksum matches), and
/// where it pushes one into the container until it has run there.
pub const CACHE_DIR: &str = "/var/cache/provision/nvidia";

/// NVIDIA's `.run` and its checksum, with the version its file name says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Installer {
    /// Where it is downloaded from.
    pub url: String,
    /// Its sha256.
    pub sha256: String,
    /// The version it installs (`None`: its name does not say).
    pub version: Option<String>,
}

/// The desired userspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuUserspaceSpec {
    /// The node's kernel module version (a placeholder in an offline plan without a pin).
    pub version: String,
    /// NVIDIA's `.run`, when that is the source.
    #[serde(default)]
    pub installer: Option<Installer>,
    /// Pinned packages (`name=version`), when those are the source.
    #[serde(default)]
    pub packages: Vec<String>,
}

/// What the container has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserspaceFact {
    /// The version `libcuda.so.1` resolves to.
    pub libcuda: Option<String>,
    /// The version `libnvidia-ml.so.1` resolves to.
    pub libnvidia_ml: Option<String>,
    /// Where `nvidia-smi` is.
    pub nvidia_smi: Option<String>,
}

impl GpuUserspaceSpec {
    fn probe() -> Probe {
        Probe::GpuUserspace(GpuUserspaceProbe {})
    }

    /// Why the declared source cannot install `version`, if it cannot.
    fn mismatch(&self) -> Option<String> {
        if let Some(i) = &self.installer {
            let have = i.version.as_deref().unwrap_or("an unknown version");
            if have != self.version {
                return Some(format!(
                    "the node's NVIDIA kernel module is {}, but the declared installer installs {have}: declare NVIDIA-Linux-x86_64-{}.run and its sha256 in `gpus.userspace.installer`",
                    self.version, self.version
                ));
            }
        }
        for p in &self.packages {
            let version = p.split_once('=').map(|(_, v)| v).unwrap_or_default();
            let upstream = version
                .split_once(':')
                .map_or(version, |(_, v)| v)
                .split('-')
                .next()
                .unwrap_or_default();
            if upstream != self.version {
                return Some(format!(
                    "the node's NVIDIA kernel module is {}, but `{p}` is {upstream}: pin each package of `gpus.userspace.packages` to the node's version",
                    self.version
                ));
            }
        }
        None
    }
}

impl Resource for GpuUserspaceSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "gpu_userspace"
    }

    fn name(&self) -> String {
        "nvidia".into()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Self::probe()]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let found = facts.gpu_userspace(&Self::probe())?;
        let want = Some(self.version.as_str());
        let (cuda, nvml, smi) = match found {
            Some(f) => (
                f.libcuda.as_deref(),
                f.libnvidia_ml.as_deref(),
                f.nvidia_smi.is_some(),
            ),
            None => (None, None, false),
        };
        if cuda == want && nvml == want && smi {
            return Ok(None);
        }
        let none = cuda.is_none() && nvml.is_none() && !smi;
        let mut d = Delta::new(if none { Action::Create } else { Action::Update });
        for (name, have) in [("libcuda.so.1", cuda), ("libnvidia-ml.so.1", nvml)] {
            if have != want {
                d = d.attr(Attribute::change(
                    name,
                    have.map(str::to_string),
                    Some(self.version.clone()),
                ));
            }
        }
        if !smi {
            d = d.attr(if none {
                Attribute::new("nvidia-smi", "present")
            } else {
                Attribute::change("nvidia-smi", Some("absent".into()), Some("present".into()))
            });
        }
        d = d.attr(Attribute::new(
            "from",
            match &self.installer {
                Some(i) => format!(
                    "{} (fetched by the node, pushed in, --no-kernel-module)",
                    i.url
                ),
                None => self.packages.join(" "),
            },
        ));
        if !none {
            d = d.reason(format!(
                "the container's NVIDIA userspace must be the node's kernel module version {}",
                self.version
            ));
        }
        if let Some(have) = [cuda, nvml]
            .into_iter()
            .flatten()
            .find(|v| *v != self.version)
        {
            // What nvidia-smi and every CUDA program in the container say now (NVML's
            // words for libraries of another version than the loaded module).
            d = d.reason(format!(
                "Failed to initialize NVML: Driver/library version mismatch: the container has {have}, the node's module is {}; `provision apply` installs {} in the container (after the node's own steps)",
                self.version, self.version
            ));
        }
        Ok(Some(d))
    }

    fn warnings(&self, _facts: &Facts) -> Vec<String> {
        self.mismatch().into_iter().collect()
    }

    fn ops(&self, change: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        if self.version.starts_with('<') {
            return Err(StepsError::Refused(format!(
                "the node's NVIDIA kernel module version is not known ({}): give the node `ssh:` so its GPUs are read, or pin `nvidia.driver`",
                self.version
            )));
        }
        if let Some(why) = self.mismatch() {
            return Err(StepsError::Refused(why));
        }
        Ok(match &self.installer {
            // The node fetches the `.run` and pushes it in before the guest runs it.
            Some(i) => vec![
                Op::Node(NodeOp::PushInstaller {
                    address: change.address.clone(),
                    url: i.url.clone(),
                    sha256: i.sha256.clone(),
                }),
                Op::Guest(Step::InstallUserspace(InstallUserspaceStep {
                    url: i.url.clone(),
                    sha256: i.sha256.clone(),
                    version: self.version.clone(),
                })),
            ],
            None => guest([Step::AptInstall(crate::resources::apt::AptInstallStep {
                packages: self.packages.clone(),
            })])?,
        })
    }
}

/// The version a `<name>.so.1` link in the library folders resolves to (agent side).
fn lib_version(name: &str) -> Option<String> {
    LIB_DIRS.iter().find_map(|dir| {
        let link = Path::new(dir).join(format!("{name}.so.1"));
        let real = std::fs::canonicalize(&link).ok()?;
        let file = real.file_name()?.to_string_lossy().into_owned();
        file.strip_prefix(&format!("{name}.so."))
            .filter(|v| *v != "1")
            .map(str::to_string)
    })
}

/// Reads what the container has (agent side).
pub fn read() -> Option<UserspaceFact> {
    Some(UserspaceFact {
        libcuda: lib_version("libcuda"),
        libnvidia_ml: lib_version("libnvidia-ml"),
        nvidia_smi: SMI_PATHS
            .iter()
            .find(|p| Path::new(p).is_file())
            .map(|p| p.to_string()),
    })
}

/// The installer's file name, as the node caches it and pushes it into the container.
pub fn file_name(url: &str) -> &str {
    url.rsplit('/')
        .next()
        .filter(|f| !f.is_empty())
        .unwrap_or("installer.run")
}

/// Where the node pushes the installer from `url` into the container.
pub fn cached_path(url: &str) -> String {
    format!("{CACHE_DIR}/{}", file_name(url))
}

/// Where the node keeps the installer from `url` of `sha256`: one folder per checksum, so
/// installers of the same name and another checksum never take each other's place.
pub fn node_cached_path(url: &str, sha256: &str) -> String {
    format!(
        "{CACHE_DIR}/{}/{}",
        sha256.to_ascii_lowercase(),
        file_name(url)
    )
}

/// Checks the installer the node pushed to [`cached_path`] against its sha256 again, runs
/// it without the kernel module and reads back that the libraries and `nvidia-smi` are
/// `version` (agent side, in the container).
pub fn install(url: &str, sha256: &str, version: &str) -> Result<(), HostError> {
    let path = PathBuf::from(cached_path(url));
    let have = crate::machine::sha256_file(&path)?;
    if !have.eq_ignore_ascii_case(sha256) {
        let _ = std::fs::remove_file(&path);
        return Err(unexpected(
            &path.display().to_string(),
            format!(
                "(pushed by the node from {url}) has sha256 {have}, not the inventory's {sha256}: refusing to run it"
            ),
        ));
    }
    let result = crate::machine::run(
        "sh",
        &[
            path.display().to_string(),
            "--no-kernel-module".into(),
            "--silent".into(),
        ],
        &[],
    );
    let _ = std::fs::remove_file(&path);
    result?;
    let fact = read().unwrap_or_else(|| unreachable!("read always answers"));
    let ok = fact.libcuda.as_deref() == Some(version)
        && fact.libnvidia_ml.as_deref() == Some(version)
        && fact.nvidia_smi.is_some();
    if ok {
        Ok(())
    } else {
        Err(unexpected(
            &format!("NVIDIA userspace {version}"),
            format!("the installer ran, but reading back finds {fact:?}"),
        ))
    }
}

/// Has the installer from `url` in the node's cache ([`node_cached_path`]) with exactly
/// `sha256` (agent side, on the node): a cached file of that checksum is kept as it is;
/// otherwise it is downloaded to a `.part` file, checked, and only then renamed into place,
/// so the cache never holds a file of another checksum. Returns whether it downloaded.
pub fn fetch(url: &str, sha256: &str) -> Result<bool, HostError> {
    if sha256.len() != 64 || !sha256.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(unexpected(url, format!("`{sha256}` is not a sha256")));
    }
    let path = PathBuf::from(node_cached_path(url, sha256));
    let dir = path.parent().unwrap_or(Path::new(CACHE_DIR));
    std::fs::create_dir_all(dir).map_err(HostError::io("create", dir))?;
    if path.is_file() && crate::machine::sha256_file(&path)?.eq_ignore_ascii_case(sha256) {
        return Ok(false);
    }
    let part = PathBuf::from(format!("{}.part", path.display()));
    let have = match download(url, &part) {
        Ok(h) => h,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    if !have.eq_ignore_ascii_case(sha256) {
        let _ = std::fs::remove_file(&part);
        let _ = std::fs::remove_dir(dir);
        return Err(unexpected(
            url,
            format!(
                "downloaded by the node has sha256 {have}, not the inventory's {sha256}: refusing it (nothing was pushed into the container)"
            ),
        ));
    }
    std::fs::rename(&part, &path).map_err(HostError::io("rename", &part))?;
    Ok(true)
}

/// Streams `url` into `part`, synced; its sha256.
pub(crate) fn download(url: &str, part: &Path) -> Result<String, HostError> {
    use sha2::{Digest, Sha256};
    crate::hub::install_crypto_provider();
    let fail = |detail: String| unexpected(url, detail);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(e.to_string()))?;
    runtime.block_on(async {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(20))
            .read_timeout(std::time::Duration::from_secs(120))
            .build()
            .map_err(|e| fail(client_error(&e)))?;
        let mut resp = client
            .get(url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| {
                fail(format!(
                    "the node cannot download it: {} (hint: the node fetches the installer and pushes it into the container; give `gpus.userspace.installer.url` a URL the node reaches, e.g. a local mirror of NVIDIA's file)",
                    error_chain(&e)
                ))
            })?;
        let mut out = std::fs::File::create(part).map_err(HostError::io("create", part))?;
        let mut hasher = Sha256::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| fail(format!("download broke off: {}", error_chain(&e))))?
        {
            hasher.update(&chunk);
            out.write_all(&chunk).map_err(HostError::io("write", part))?;
        }
        out.sync_all().map_err(HostError::io("sync", part))?;
        Ok::<_, HostError>(hex::encode(hasher.finalize()))
    })
}

/// Probe: the NVIDIA userspace driver in a container: the versions its libraries resolve to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct GpuUserspaceProbe {}

impl crate::resources::wire::AgentProbe for GpuUserspaceProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::GpuUserspace(read()))
    }
}

/// Step: on the node, have NVIDIA's `.run` in the node's cache with its sha256 (downloaded unless a verified copy is there), to be pushed into a container.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FetchInstallerStep {
    /// Where it is downloaded from.
    pub url: String,
    /// Its sha256.
    pub sha256: String,
}

impl crate::resources::wire::AgentStep for FetchInstallerStep {
    fn describe(&self) -> String {
        format!("fetch {} into the node's cache (sha256 checked)", self.url)
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        fetch(&self.url, &self.sha256)?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(30))
    }
}

/// Step: in the container, check the `.run` the node pushed against its sha256 again and run it without the kernel module.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InstallUserspaceStep {
    /// Where the node downloaded it from (names the pushed file).
    pub url: String,
    /// Its sha256.
    pub sha256: String,
    /// The version it must leave installed.
    pub version: String,
}

impl crate::resources::wire::AgentStep for InstallUserspaceStep {
    fn describe(&self) -> String {
        format!(
            "install NVIDIA userspace {} without the kernel module ({} pushed by the node)",
            self.version,
            file_name(&self.url)
        )
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        install(&self.url, &self.sha256, &self.version)?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(15))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(version: &str, installer: &str, packages: &[&str]) -> GpuUserspaceSpec {
        GpuUserspaceSpec {
            version: version.into(),
            installer: (!installer.is_empty()).then(|| Installer {
                url: format!("http://m/{installer}"),
                sha256: "0".repeat(64),
                version: installer
                    .strip_prefix("NVIDIA-Linux-x86_64-")
                    .and_then(|v| v.strip_suffix(".run"))
                    .map(str::to_string),
            }),
            packages: packages.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn a_source_of_another_version_than_the_node_is_refused() {
        let ok = spec("580.95.05", "NVIDIA-Linux-x86_64-580.95.05.run", &[]);
        assert_eq!(ok.mismatch(), None);
        let old = spec("580.95.05", "NVIDIA-Linux-x86_64-570.86.16.run", &[]);
        assert!(old.mismatch().unwrap().contains("installs 570.86.16"));
        let pkgs = spec(
            "580.95.05",
            "",
            &[
                "libnvidia-compute-580=580.95.05-0ubuntu1",
                "nvidia-utils-580=1:580.82.07-1",
            ],
        );
        assert!(
            pkgs.mismatch().unwrap().contains("is 580.82.07"),
            "{pkgs:?}"
        );
    }
}
