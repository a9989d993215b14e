//! What a node itself must have before its containers can run: the storage behind the
//! models' `/shared`, the container templates and where to fetch them, and the NVIDIA
//! driver side of the host. All under `nodes.<name>`; checked by [`problems`].

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::spanned::{Pos, Sp};
use super::text::{AbsPath, Text};

/// The storage that holds the models, bind-mounted into containers (as `/shared`): a ZFS
/// dataset or a plain directory. Existing data is never destroyed or reformatted.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelStorage {
    /// Where it is on the node: the plain directory, or the dataset's mountpoint. The
    /// containers' `mounts: [{ host: ... }]` name this path.
    pub path: Sp<AbsPath>,
    /// A ZFS dataset mounted at `path` (created with `properties` when absent; its pool
    /// is imported when exported, never created). Without it, a plain directory.
    pub zfs: Option<ZfsDataset>,
}

/// A ZFS dataset for the model storage.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ZfsDataset {
    /// `POOL/NAME`, e.g. `tank/shared`.
    pub dataset: Sp<Text>,
    /// Properties set at create (and kept): e.g. `recordsize: 1M`, `compression: "off"`.
    #[serde(default)]
    pub properties: IndexMap<String, Sp<Text>>,
}

impl ZfsDataset {
    /// The pool: the dataset's first component.
    pub fn pool(&self) -> &str {
        self.dataset.as_str().split('/').next().unwrap_or_default()
    }
}

/// A container template the node must have, and where to fetch it when it does not.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateSource {
    /// The volume ID containers name in `template:`, e.g.
    /// `local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst`.
    pub volume: Sp<Text>,
    /// Where the node downloads it from (Proxmox's `download-url`).
    pub url: Sp<Text>,
    /// Its checksum, hex; the download fails and nothing is kept when it differs.
    pub checksum: Sp<Text>,
    /// The checksum's algorithm.
    #[serde(default = "default_algorithm")]
    pub checksum_algorithm: Sp<ChecksumAlgorithm>,
}

fn default_algorithm() -> Sp<ChecksumAlgorithm> {
    Sp::new(ChecksumAlgorithm::Sha256)
}

/// Checksum algorithms Proxmox's `download-url` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)]
pub enum ChecksumAlgorithm {
    Md5,
    Sha1,
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

impl ChecksumAlgorithm {
    /// As the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChecksumAlgorithm::Md5 => "md5",
            ChecksumAlgorithm::Sha1 => "sha1",
            ChecksumAlgorithm::Sha224 => "sha224",
            ChecksumAlgorithm::Sha256 => "sha256",
            ChecksumAlgorithm::Sha384 => "sha384",
            ChecksumAlgorithm::Sha512 => "sha512",
        }
    }

    /// Hex digits in a checksum of this algorithm.
    pub fn hex_len(self) -> usize {
        match self {
            ChecksumAlgorithm::Md5 => 32,
            ChecksumAlgorithm::Sha1 => 40,
            ChecksumAlgorithm::Sha224 => 56,
            ChecksumAlgorithm::Sha256 => 64,
            ChecksumAlgorithm::Sha384 => 96,
            ChecksumAlgorithm::Sha512 => 128,
        }
    }
}

/// The NVIDIA side of the host: the kernel module the containers' userspace must match,
/// and what makes the GPUs usable by containers from boot.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NvidiaHost {
    /// The driver version the kernel module must be (`/proc/driver/nvidia/version`), e.g.
    /// `"580.159"`; the guests' userspace libraries must be the same.
    pub driver: Sp<Text>,
    /// `nvidia-persistenced` enabled and running (keeps the GPUs initialised).
    #[serde(default = "yes")]
    pub persistenced: Sp<bool>,
    /// A unit that runs `nvidia-modprobe -u -c0` at boot, so `/dev/nvidia-uvm*` exist
    /// before containers start (otherwise they appear only after the first CUDA use, and a
    /// container started before that sees no GPU).
    #[serde(default = "yes")]
    pub uvm_at_boot: Sp<bool>,
    /// The driver's installer on the node (`NVIDIA-Linux-x86_64-<version>.run`), run only
    /// with `apply --install-driver` when the module is not `driver` (a reboot follows).
    pub installer: Option<DriverInstaller>,
    /// Words the kernel command line must have (e.g. `iommu=pt`, which multi-GPU NCCL often
    /// needs). Checked and reported with the exact change; never applied (a reboot is).
    #[serde(default)]
    pub kernel_cmdline: Vec<Sp<Text>>,
}

fn yes() -> Sp<bool> {
    Sp::new(true)
}

/// The NVIDIA installer file on the node.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DriverInstaller {
    /// The `.run` file on the node.
    pub path: Sp<AbsPath>,
    /// Its sha256, hex; checked before it runs.
    pub sha256: Sp<Text>,
}

/// The problems of a node's host settings: position, message, hint.
pub fn problems(
    storage: Option<&ModelStorage>,
    templates: &[TemplateSource],
    nvidia: Option<&NvidiaHost>,
) -> Vec<(Pos, String, String)> {
    let mut out = Vec::new();
    if let Some(zfs) = storage.and_then(|s| s.zfs.as_ref()) {
        let ds = zfs.dataset.as_str();
        let ok = ds.split('/').count() >= 2
            && ds.split('/').all(|p| {
                !p.is_empty()
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c))
            });
        if !ok {
            out.push((
                zfs.dataset.pos,
                format!("`{ds}` is not a ZFS dataset name"),
                "write POOL/NAME, e.g. `tank/shared` (the pool itself is never created)".into(),
            ));
        }
        for (name, value) in &zfs.properties {
            let name_ok = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_:.-".contains(c));
            let value_ok =
                !value.as_str().is_empty() && !value.as_str().contains(char::is_whitespace);
            if !name_ok || !value_ok || name == "mountpoint" {
                out.push((
                    value.pos,
                    format!("ZFS property `{name}: {}` cannot be set", value.as_str()),
                    if name == "mountpoint" {
                        "the mountpoint is the storage's `path`".into()
                    } else {
                        "write lower-case property names and values without spaces, e.g. `recordsize: 1M`".into()
                    },
                ));
            }
        }
    }
    let mut seen: Vec<&str> = Vec::new();
    for t in templates {
        let volume = t.volume.as_str();
        let file = volume
            .split_once(':')
            .and_then(|(storage, rest)| (!storage.is_empty()).then_some(rest))
            .and_then(|rest| rest.strip_prefix("vztmpl/"));
        let file_ok = file.is_some_and(|f| {
            [".tar.gz", ".tar.xz", ".tar.zst", ".tgz"]
                .iter()
                .any(|e| f.ends_with(e))
                && !f.starts_with('.')
                && f.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        });
        if !file_ok {
            out.push((
                t.volume.pos,
                format!("`{volume}` is not a template volume ID"),
                "write STORAGE:vztmpl/FILE with FILE ending .tar.zst, .tar.xz, .tar.gz or .tgz"
                    .into(),
            ));
        }
        if seen.contains(&volume) {
            out.push((
                t.volume.pos,
                format!("template `{volume}` is declared twice"),
                "keep one entry per template".into(),
            ));
        }
        seen.push(volume);
        let url = t.url.as_str();
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            out.push((
                t.url.pos,
                format!("`{url}` is not an http(s) URL"),
                "the node downloads templates with `download-url`, which takes http and https"
                    .into(),
            ));
        }
        let want = t.checksum_algorithm.hex_len();
        let sum = t.checksum.as_str();
        if sum.len() != want || !sum.chars().all(|c| c.is_ascii_hexdigit()) {
            out.push((
                t.checksum.pos,
                format!(
                    "the checksum is not a {} checksum",
                    t.checksum_algorithm.as_str()
                ),
                format!("write {want} hex digits, as `sha256sum` prints them"),
            ));
        }
    }
    if let Some(n) = nvidia {
        let v = n.driver.as_str();
        let ok = !v.is_empty()
            && v.split('.').count() >= 2
            && v.split('.')
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
        if !ok {
            out.push((
                n.driver.pos,
                format!("`{v}` is not an NVIDIA driver version"),
                "write it as the driver prints it, e.g. `\"580.159\"` or `\"580.95.05\"` (quoted)"
                    .into(),
            ));
        }
        if let Some(i) = &n.installer {
            let s = i.sha256.as_str();
            if s.len() != 64 || !s.chars().all(|c| c.is_ascii_hexdigit()) {
                out.push((
                    i.sha256.pos,
                    "the installer's sha256 is not 64 hex digits".into(),
                    "write what `sha256sum NVIDIA-Linux-….run` prints".into(),
                ));
            }
        }
        for w in &n.kernel_cmdline {
            if w.as_str().is_empty() || w.as_str().contains(char::is_whitespace) {
                out.push((
                    w.pos,
                    format!("`{}` is not one kernel command line word", w.as_str()),
                    "one entry per word, e.g. `iommu=pt`".into(),
                ));
            }
        }
    }
    out
}
