//! Pure parsers for what NVIDIA's tools and the kernel print. Each takes the raw text and
//! returns typed facts; the fixtures under `tests/fixtures/gpu/` hold real outputs.

use serde::Serialize;

/// Text that did not have the expected shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read {what}: {reason}")]
pub struct ParseError {
    /// What was being read, e.g. `/proc/driver/nvidia/version`.
    pub what: String,
    /// Why it did not parse, quoting the offending text.
    pub reason: String,
}

fn parse_error(what: &str, reason: impl Into<String>) -> ParseError {
    ParseError {
        what: what.to_string(),
        reason: reason.into(),
    }
}

/// The first line of `text`, cut short, for messages.
pub fn excerpt(text: &str) -> String {
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let line = line.trim();
    if line.chars().count() > 120 {
        format!("{}…", line.chars().take(120).collect::<String>())
    } else {
        line.to_string()
    }
}

/// Whether `s` looks like a driver or library version: digits and dots, two parts or more.
fn is_version(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// The loaded NVIDIA kernel module, from `/proc/driver/nvidia/version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelModule {
    /// Its version, e.g. `580.159.04`.
    pub version: String,
    /// Whether it is the open-source kernel module.
    pub open: bool,
}

/// Parses `/proc/driver/nvidia/version` (`NVRM version: NVIDIA UNIX x86_64 Kernel Module
/// 580.95.05  Tue Sep 23 …`, or `… Open Kernel Module for x86_64  580.95.05  Release Build …`).
pub fn parse_proc_version(text: &str) -> Result<KernelModule, ParseError> {
    const WHAT: &str = "/proc/driver/nvidia/version";
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("NVRM version:"))
        .ok_or_else(|| {
            parse_error(
                WHAT,
                format!("no `NVRM version:` line in `{}`", excerpt(text)),
            )
        })?;
    let after_module = line
        .split_once("Module")
        .map(|(_, rest)| rest)
        .unwrap_or(line);
    let version = after_module
        .split_whitespace()
        .find(|w| is_version(w))
        .ok_or_else(|| parse_error(WHAT, format!("no version in `{}`", line.trim())))?;
    Ok(KernelModule {
        version: version.to_string(),
        open: line.contains("Open Kernel Module"),
    })
}

/// One GPU as `nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuInfo {
    /// The index nvidia-smi gives it (PCI order).
    pub index: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Total memory in MiB.
    pub memory_mib: u64,
    /// PCI address as nvidia-smi writes it, e.g. `00000000:18:00.0`.
    pub pci_bus_id: String,
}

/// The fields `parse_query_gpu` expects, in order: pass them to `--query-gpu=`.
pub const QUERY_GPU_FIELDS: &str = "index,uuid,name,memory.total,pci.bus_id";

/// Parses `nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id
/// --format=csv,noheader` (`0, GPU-…, NVIDIA H200, 143771 MiB, 00000000:18:00.0`).
pub fn parse_query_gpu(text: &str) -> Result<Vec<GpuInfo>, ParseError> {
    const WHAT: &str = "nvidia-smi --query-gpu";
    let mut gpus = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        // A product name may itself hold a comma: take the fixed fields from both ends.
        if fields.len() < 5 {
            return Err(parse_error(
                WHAT,
                format!("expected 5 comma-separated fields in `{line}`"),
            ));
        }
        let n = fields.len();
        let index = fields[0]
            .parse()
            .map_err(|_| parse_error(WHAT, format!("`{}` is not a GPU index", fields[0])))?;
        let uuid = fields[1];
        if !uuid.starts_with("GPU-") {
            return Err(parse_error(WHAT, format!("`{uuid}` is not a GPU UUID")));
        }
        let memory = fields[n - 2];
        let memory_mib = memory
            .strip_suffix("MiB")
            .map(str::trim)
            .and_then(|m| m.parse().ok())
            .ok_or_else(|| parse_error(WHAT, format!("`{memory}` is not a size in MiB")))?;
        gpus.push(GpuInfo {
            index,
            uuid: uuid.to_string(),
            name: fields[2..n - 2].join(", "),
            memory_mib,
            pci_bus_id: fields[n - 1].to_string(),
        });
    }
    Ok(gpus)
}

/// One GPU's entry under `/proc/driver/nvidia/gpus/<bus>/information`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcGpu {
    /// `GPU UUID:`.
    pub uuid: String,
    /// `Bus Location:`, e.g. `0000:18:00.0`.
    pub bus_location: String,
    /// `Device Minor:`: the N of `/dev/nvidiaN`, which need not equal the nvidia-smi index.
    pub minor: u32,
}

/// Parses the `information` files of `/proc/driver/nvidia/gpus/*/`, concatenated (each a
/// block of `Key: value` lines; a block ends where the next `Model:` line starts).
pub fn parse_proc_gpus(text: &str) -> Result<Vec<ProcGpu>, ParseError> {
    const WHAT: &str = "/proc/driver/nvidia/gpus/*/information";
    let mut out = Vec::new();
    let (mut uuid, mut bus, mut minor) = (None, None, None);
    let mut flush = |uuid: &mut Option<String>,
                     bus: &mut Option<String>,
                     minor: &mut Option<u32>|
     -> Result<(), ParseError> {
        match (uuid.take(), bus.take(), minor.take()) {
            (Some(uuid), Some(bus_location), Some(minor)) => {
                out.push(ProcGpu {
                    uuid,
                    bus_location,
                    minor,
                });
                Ok(())
            }
            (None, None, None) => Ok(()),
            (u, _, _) => Err(parse_error(
                WHAT,
                format!(
                    "a GPU block lacks `GPU UUID`, `Bus Location` or `Device Minor` ({})",
                    u.unwrap_or_else(|| "no UUID".into())
                ),
            )),
        }
    };
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "Model" => flush(&mut uuid, &mut bus, &mut minor)?,
            "GPU UUID" => uuid = Some(value.to_string()),
            "Bus Location" => bus = Some(value.to_string()),
            "Device Minor" => {
                minor =
                    Some(value.parse().map_err(|_| {
                        parse_error(WHAT, format!("`{value}` is not a device minor"))
                    })?)
            }
            _ => {}
        }
    }
    flush(&mut uuid, &mut bus, &mut minor)?;
    Ok(out)
}

/// A character device driver and its major number, from `/proc/devices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceMajor {
    /// The driver's name, e.g. `nvidia-uvm`.
    pub name: String,
    /// Its major number.
    pub major: u32,
}

/// The NVIDIA character devices in `/proc/devices` (`195 nvidia`, `508 nvidia-uvm`, …).
/// Block devices and other drivers are left out.
pub fn parse_proc_devices(text: &str) -> Result<Vec<DeviceMajor>, ParseError> {
    let mut out = Vec::new();
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with("devices:") {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char || line.is_empty() {
            continue;
        }
        let Some((major, name)) = line.split_once(char::is_whitespace) else {
            return Err(parse_error(
                "/proc/devices",
                format!("unexpected line `{line}`"),
            ));
        };
        let name = name.trim();
        if name.starts_with("nvidia") {
            let major = major.parse().map_err(|_| {
                parse_error("/proc/devices", format!("`{major}` is not a major number"))
            })?;
            out.push(DeviceMajor {
                name: name.to_string(),
                major,
            });
        }
    }
    Ok(out)
}

/// The `stat` format `parse_dev_nodes` reads: type, major and minor (hex), path.
pub const STAT_FORMAT: &str = "%F|%t|%T|%n";

/// One device node under `/dev`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceNode {
    /// Its path, e.g. `/dev/nvidia0`.
    pub path: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// Parses `stat -c '%F|%t|%T|%n' /dev/nvidia*` (`character special file|c3|0|/dev/nvidia0`);
/// entries that are not character devices (the `/dev/nvidia-caps` folder) are left out.
pub fn parse_dev_nodes(text: &str) -> Result<Vec<DeviceNode>, ParseError> {
    const WHAT: &str = "stat of /dev/nvidia*";
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parts: Vec<&str> = line.splitn(4, '|').collect();
        let [kind, major, minor, path] = parts[..] else {
            return Err(parse_error(WHAT, format!("unexpected line `{line}`")));
        };
        if kind != "character special file" {
            continue;
        }
        let hex = |s: &str| {
            u32::from_str_radix(s, 16)
                .map_err(|_| parse_error(WHAT, format!("`{s}` is not a hex device number")))
        };
        out.push(DeviceNode {
            path: path.to_string(),
            major: hex(major)?,
            minor: hex(minor)?,
        });
    }
    Ok(out)
}

/// One GPU as `nvidia-smi -L` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedGpu {
    /// Its index in this machine's (or container's) numbering.
    pub index: u32,
    /// Product name.
    pub name: String,
    /// `GPU-…`.
    pub uuid: String,
    /// UUIDs of MIG devices listed under it, if any.
    pub mig: Vec<String>,
}

/// Parses `nvidia-smi -L` (`GPU 0: NVIDIA H200 (UUID: GPU-…)`, MIG devices indented below).
pub fn parse_smi_list(text: &str) -> Result<Vec<ListedGpu>, ParseError> {
    const WHAT: &str = "nvidia-smi -L";
    let mut out: Vec<ListedGpu> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let trimmed = line.trim();
        let uuid = trimmed
            .rsplit_once("(UUID: ")
            .and_then(|(_, rest)| rest.strip_suffix(')'))
            .map(str::to_string);
        if let Some(rest) = trimmed.strip_prefix("GPU ") {
            let (index, tail) = rest
                .split_once(": ")
                .ok_or_else(|| parse_error(WHAT, format!("unexpected line `{trimmed}`")))?;
            let index = index
                .parse()
                .map_err(|_| parse_error(WHAT, format!("`{index}` is not a GPU index")))?;
            let uuid = uuid.ok_or_else(|| parse_error(WHAT, format!("no UUID in `{trimmed}`")))?;
            let name = tail
                .rsplit_once(" (UUID: ")
                .map_or(tail, |(n, _)| n)
                .to_string();
            out.push(ListedGpu {
                index,
                name,
                uuid,
                mig: Vec::new(),
            });
        } else if trimmed.starts_with("MIG ") {
            match (out.last_mut(), uuid) {
                (Some(gpu), Some(uuid)) => gpu.mig.push(uuid),
                _ => return Err(parse_error(WHAT, format!("stray MIG line `{trimmed}`"))),
            }
        } else {
            return Err(parse_error(WHAT, format!("unexpected line `{trimmed}`")));
        }
    }
    Ok(out)
}

/// Why `nvidia-smi` could not answer, from what it printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SmiFailure {
    /// `Failed to initialize NVML: Driver/library version mismatch`: the userspace
    /// libraries are not the loaded kernel module's version.
    VersionMismatch {
        /// The `NVML library version:` it printed, when it did.
        nvml_library: Option<String>,
    },
    /// `NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver`.
    NoDriver,
    /// `No devices were found`.
    NoDevices,
    /// `Failed to initialize NVML: Unknown Error` and the like (in containers: device
    /// nodes or cgroup rules missing).
    NvmlInit {
        /// The message after `Failed to initialize NVML: `.
        reason: String,
    },
    /// Anything else: its first line.
    Other {
        /// The first non-empty line printed.
        message: String,
    },
}

/// Classifies a failed `nvidia-smi` run by its output.
pub fn classify_smi_failure(text: &str) -> SmiFailure {
    let nvml_library = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("NVML library version:"))
        .map(|v| v.trim().to_string());
    if text.contains("Driver/library version mismatch") {
        return SmiFailure::VersionMismatch { nvml_library };
    }
    if text.contains("couldn't communicate with the NVIDIA driver") {
        return SmiFailure::NoDriver;
    }
    if text.contains("No devices were found") {
        return SmiFailure::NoDevices;
    }
    if let Some(reason) = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Failed to initialize NVML:"))
    {
        return SmiFailure::NvmlInit {
            reason: reason.trim().to_string(),
        };
    }
    SmiFailure::Other {
        message: excerpt(text),
    }
}

/// What `nvidia-smi --version` reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SmiVersion {
    /// `NVIDIA-SMI version`.
    pub smi: Option<String>,
    /// `NVML version`: the userspace library (major.minor only).
    pub nvml: Option<String>,
    /// `DRIVER version`: the kernel module as NVML sees it.
    pub driver: Option<String>,
    /// `CUDA Version`: the newest CUDA release this driver supports.
    pub cuda: Option<String>,
}

/// Parses `nvidia-smi --version` (`NVIDIA-SMI version  : 580.95.05` and so on).
pub fn parse_smi_version(text: &str) -> SmiVersion {
    let mut v = SmiVersion::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = Some(value.trim().to_string());
        match key.trim() {
            "NVIDIA-SMI version" => v.smi = value,
            "NVML version" => v.nvml = value,
            "DRIVER version" => v.driver = value,
            "CUDA Version" => v.cuda = value,
            _ => {}
        }
    }
    v
}

/// The CUDA toolkit as `nvcc --version` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvccVersion {
    /// `13.0` from `Cuda compilation tools, release 13.0, V13.0.88`.
    pub release: String,
    /// `13.0.88`.
    pub build: Option<String>,
}

/// Parses `nvcc --version`.
pub fn parse_nvcc_version(text: &str) -> Result<NvccVersion, ParseError> {
    let line = text
        .lines()
        .find(|l| l.contains("release "))
        .ok_or_else(|| {
            parse_error(
                "nvcc --version",
                format!("no `release` line in `{}`", excerpt(text)),
            )
        })?;
    let after = line.split_once("release ").map_or("", |(_, r)| r);
    let release = after
        .split(|c: char| c == ',' || c.is_whitespace())
        .next()
        .unwrap_or("");
    if !is_version(release) {
        return Err(parse_error(
            "nvcc --version",
            format!("no release number in `{}`", line.trim()),
        ));
    }
    let build = after
        .split_once(", V")
        .map(|(_, b)| b.trim().to_string())
        .filter(|b| is_version(b));
    Ok(NvccVersion {
        release: release.to_string(),
        build,
    })
}

/// A versioned NVIDIA userspace library file (`libcuda.so.580.159.04`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserLib {
    /// `libcuda` or `libnvidia-ml`.
    pub lib: String,
    /// Its full path.
    pub path: String,
    /// The version in its file name.
    pub version: String,
}

/// Reads the versioned NVIDIA libraries out of a list of paths, one per line (as `readlink
/// -f` and `ls` print them). Unversioned names (`libcuda.so.1`) are left out.
pub fn parse_user_libs(text: &str) -> Vec<UserLib> {
    let mut out: Vec<UserLib> = Vec::new();
    for path in text.lines().map(str::trim).filter(|l| l.starts_with('/')) {
        let file = path.rsplit('/').next().unwrap_or(path);
        for lib in ["libcuda", "libnvidia-ml"] {
            let Some(version) = file
                .strip_prefix(lib)
                .and_then(|rest| rest.strip_prefix(".so."))
            else {
                continue;
            };
            if is_version(version) && !out.iter().any(|u| u.path == path) {
                out.push(UserLib {
                    lib: lib.to_string(),
                    path: path.to_string(),
                    version: version.to_string(),
                });
            }
        }
    }
    out
}

/// Whether a short version (`580.159`, as NVML prints its own) names the same release as a
/// full one (`580.159.04`).
pub fn version_prefix_matches(short: &str, full: &str) -> bool {
    full == short
        || full
            .strip_prefix(short)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// Compares two dotted versions numerically (`12.8` < `13.0`); `None` when either is not one.
pub fn compare_versions(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let parse = |s: &str| -> Option<Vec<u64>> { s.split('.').map(|p| p.parse().ok()).collect() };
    Some(parse(a)?.cmp(&parse(b)?))
}
