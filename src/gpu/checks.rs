//! Guest checks: the container sees exactly its GPUs, its userspace driver is the node's
//! kernel module's version, its CUDA toolkit is the declared release, and torch in the ml-env
//! sees as many GPUs as the service's tensor parallel size. Read in one round trip.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::parse::{self, SmiFailure, UserLib};
use super::probe::{CommandBatch, Section, Sections, parse_sections};
use crate::transport::{Transport, TransportError, shell_quote};

/// How long the guest probe may take: importing torch can take tens of seconds on a cold disk.
pub const CHECKS_TIMEOUT: Duration = Duration::from_secs(120);

/// What the guest should look like.
#[derive(Debug, Clone, Default)]
pub struct GuestExpectations {
    /// UUIDs of the GPUs passed through (indices mean nothing inside a container, which
    /// numbers its GPUs from 0).
    pub gpus: Vec<String>,
    /// The node's kernel module version; `None` reads it from the guest's
    /// `/proc/driver/nvidia/version`, which shows the host's module.
    pub driver_version: Option<String>,
    /// The CUDA toolkit to find, if one is declared.
    pub cuda: Option<CudaExpectation>,
    /// The ml-env and tensor parallel size, if a service is declared.
    pub torch: Option<TorchExpectation>,
    /// A prefix for `/proc` and library folders (tests); empty on real machines.
    pub root: String,
}

/// The declared CUDA toolkit.
#[derive(Debug, Clone)]
pub struct CudaExpectation {
    /// `13.0`.
    pub release: String,
    /// Its home, e.g. `/usr/local/cuda-13.0`.
    pub home: String,
}

/// The declared ml-env and the service's tensor parallel size.
#[derive(Debug, Clone)]
pub struct TorchExpectation {
    /// The venv's folder, e.g. `/root/ml-env`.
    pub venv: String,
    /// The service's `tp`.
    pub tp: u32,
}

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    /// As declared.
    Ok,
    /// Differs from the declaration.
    Drift,
    /// Not checked, and why is in the summary (torch not installed yet).
    Skipped,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `gpus`, `driver`, `cuda` or `torch`.
    pub name: &'static str,
    /// How it came out.
    pub status: CheckStatus,
    /// One line.
    pub summary: String,
    /// Expected/actual lines, diff style (`- expected`, `+ actual`).
    pub details: Vec<String>,
    /// What to do about a drift.
    pub remedies: Vec<String>,
}

impl Check {
    fn new(name: &'static str, status: CheckStatus, summary: impl Into<String>) -> Self {
        Check {
            name,
            status,
            summary: summary.into(),
            details: Vec::new(),
            remedies: Vec::new(),
        }
    }

    fn detail(mut self, line: impl Into<String>) -> Self {
        self.details.push(line.into());
        self
    }

    fn remedy(mut self, line: impl Into<String>) -> Self {
        self.remedies.push(line.into());
        self
    }
}

/// All checks of one guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// In the order run.
    pub checks: Vec<Check>,
}

impl CheckReport {
    /// Whether any check found drift.
    pub fn drifted(&self) -> bool {
        self.checks.iter().any(|c| c.status == CheckStatus::Drift)
    }
}

/// The Python that reports what torch sees, as one JSON line.
const TORCH_PROBE: &str = r#"import json
try:
    import torch
except Exception as e:
    print(json.dumps({"torch": None, "error": "%s: %s" % (type(e).__name__, e)}))
else:
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count = torch.cuda.device_count()
        available = torch.cuda.is_available()
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "count": count,
                      "available": available, "warnings": [str(w.message) for w in caught]}))
"#;

/// The probe that reads what the checks need.
pub fn guest_probe(expect: &GuestExpectations) -> CommandBatch {
    let root = if expect.root.is_empty() {
        String::new()
    } else {
        shell_quote(&expect.root)
    };
    let lib_dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/lib",
    ]
    .map(|d| format!("{root}{d}"))
    .join(" ");
    // What the loader resolves first, then what lies in the usual folders: a stale copy of
    // another version is drift too.
    let libs = format!(
        "for p in $(ldconfig -p 2>/dev/null | awk '/(libcuda|libnvidia-ml)[.]so/ {{print $NF}}'); do readlink -f \"$p\"; done\n\
         for d in {lib_dirs} $(printf '%s' \"$LD_LIBRARY_PATH\" | tr ':' ' '); do ls -1d \"$d\"/libcuda.so.* \"$d\"/libnvidia-ml.so.* 2>/dev/null; done; true"
    );
    let mut probe = CommandBatch::new()
        .section("smi-list", "nvidia-smi -L")
        .section("smi-version", "nvidia-smi --version")
        .section(
            "proc-version",
            &format!("cat {root}/proc/driver/nvidia/version"),
        )
        .section("libs", &libs);
    if let Some(cuda) = &expect.cuda {
        let nvcc = format!("{}/bin/nvcc", cuda.home.trim_end_matches('/'));
        probe = probe.section("nvcc", &format!("{} --version", shell_quote(&nvcc)));
    }
    if let Some(torch) = &expect.torch {
        let python = format!("{}/bin/python", torch.venv.trim_end_matches('/'));
        probe = probe.section(
            "torch",
            &format!("{} -c {}", shell_quote(&python), shell_quote(TORCH_PROBE)),
        );
    }
    probe
}

/// Runs every guest check through `transport` in one round trip.
pub fn run_guest_checks(
    transport: &dyn Transport,
    expect: &GuestExpectations,
) -> Result<CheckReport, TransportError> {
    Ok(run_guest_checks_raw(transport, expect)?.0)
}

/// Like [`run_guest_checks`], also returning the probe's raw output (for captures).
pub fn run_guest_checks_raw(
    transport: &dyn Transport,
    expect: &GuestExpectations,
) -> Result<(CheckReport, String), TransportError> {
    let raw = guest_probe(expect).run_raw(transport, CHECKS_TIMEOUT)?;
    Ok((evaluate_guest(expect, &parse_sections(&raw)), raw))
}

fn get(sections: &Sections, name: &str) -> Section {
    sections.get(name).cloned().unwrap_or_else(|| Section {
        output: "the probe was cut short before this command".into(),
        status: -1,
    })
}

/// Judges a guest probe's sections against the expectations (pure: what the tests feed real
/// outputs to).
pub fn evaluate_guest(expect: &GuestExpectations, sections: &Sections) -> CheckReport {
    let smi_list = get(sections, "smi-list");
    let smi_failure = (!smi_list.ok() && !smi_list.not_found())
        .then(|| parse::classify_smi_failure(&smi_list.output));
    let expected_driver = expect.driver_version.clone().or_else(|| {
        let proc = get(sections, "proc-version");
        proc.ok()
            .then(|| parse::parse_proc_version(&proc.output).ok())
            .flatten()
            .map(|m| m.version)
    });
    let mut checks = vec![
        check_gpus(
            expect,
            &smi_list,
            smi_failure.as_ref(),
            expected_driver.as_deref(),
        ),
        check_driver(sections, smi_failure.as_ref(), expected_driver.as_deref()),
    ];
    if let Some(cuda) = &expect.cuda {
        checks.push(check_cuda(cuda, sections));
    }
    if let Some(torch) = &expect.torch {
        checks.push(check_torch(torch, sections));
    }
    CheckReport { checks }
}

fn userspace_remedy(version: Option<&str>) -> String {
    match version {
        Some(v) => format!(
            "install the userspace driver {v} in the container without its kernel module: `sh NVIDIA-Linux-x86_64-{v}.run --no-kernel-module --silent` (or the distribution's packages of exactly {v})"
        ),
        None => "install the node's driver version in the container without its kernel module (`--no-kernel-module`)".into(),
    }
}

fn check_gpus(
    expect: &GuestExpectations,
    smi_list: &Section,
    failure: Option<&SmiFailure>,
    driver: Option<&str>,
) -> Check {
    const NAME: &str = "gpus";
    if smi_list.not_found() {
        return Check::new(
            NAME,
            CheckStatus::Drift,
            "nvidia-smi is not installed in the guest",
        )
        .remedy(userspace_remedy(driver));
    }
    if let Some(failure) = failure {
        let check = Check::new(
            NAME,
            CheckStatus::Drift,
            format!(
                "nvidia-smi fails in the guest: {}",
                parse::excerpt(&smi_list.output)
            ),
        );
        return match failure {
            SmiFailure::VersionMismatch { .. } => check.remedy(userspace_remedy(driver)),
            SmiFailure::NoDriver | SmiFailure::NoDevices => check
                .remedy("pass the device nodes through: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools and each GPU's /dev/nvidiaN (`provision gpu facts` on the node names them)"),
            SmiFailure::NvmlInit { .. } => check
                .remedy("the device nodes exist but access is denied: check the container's `devN:` entries or `lxc.cgroup2.devices.allow` lines against the node's majors (`provision gpu facts`)"),
            SmiFailure::Other { .. } => check.remedy("run `nvidia-smi -L` in the guest to see the whole message"),
        };
    }
    let listed = match parse::parse_smi_list(&smi_list.output) {
        Ok(listed) => listed,
        Err(e) => {
            return Check::new(NAME, CheckStatus::Drift, e.to_string())
                .remedy("run `nvidia-smi -L` in the guest to see what it prints");
        }
    };
    if expect.gpus.is_empty() {
        return Check::new(
            NAME,
            CheckStatus::Skipped,
            "no GPUs selected to compare with",
        );
    }
    // Compared without regard to case; shown as written.
    let want: BTreeMap<String, &str> = expect
        .gpus
        .iter()
        .map(|u| (u.to_ascii_lowercase(), u.as_str()))
        .collect();
    let have: BTreeMap<String, &str> = listed
        .iter()
        .map(|g| (g.uuid.to_ascii_lowercase(), g.uuid.as_str()))
        .collect();
    let name_of = |uuid: &str| {
        listed
            .iter()
            .find(|g| g.uuid.eq_ignore_ascii_case(uuid))
            .map_or(String::new(), |g| {
                format!(" ({}, guest index {})", g.name, g.index)
            })
    };
    if want.keys().eq(have.keys()) {
        let mut check = Check::new(
            NAME,
            CheckStatus::Ok,
            format!("{} GPU(s) visible, exactly those selected", listed.len()),
        );
        for g in &listed {
            check = check.detail(format!("  {}{}", g.uuid, name_of(&g.uuid)));
        }
        return check;
    }
    let missing = want.keys().filter(|k| !have.contains_key(*k)).count();
    let extra: Vec<&str> = have
        .iter()
        .filter(|(k, _)| !want.contains_key(*k))
        .map(|(_, v)| *v)
        .collect();
    let mut check = Check::new(
        NAME,
        CheckStatus::Drift,
        format!(
            "the guest sees {} GPU(s), {} selected: {missing} missing, {} not selected",
            have.len(),
            want.len(),
            extra.len()
        ),
    );
    for (key, uuid) in &want {
        let mark = if have.contains_key(key) { ' ' } else { '-' };
        check = check.detail(format!("{mark} {uuid}{}", name_of(uuid)));
    }
    for uuid in &extra {
        check = check.detail(format!("+ {uuid}{}", name_of(uuid)));
    }
    check
        .remedy("`-` selected but not visible, `+` visible but not selected: pass exactly the selected GPUs' /dev/nvidiaN nodes through (`provision gpu facts` on the node maps each UUID to its node)")
}

fn check_driver(
    sections: &Sections,
    failure: Option<&SmiFailure>,
    expected: Option<&str>,
) -> Check {
    const NAME: &str = "driver";
    let Some(expected) = expected else {
        return Check::new(
            NAME,
            CheckStatus::Drift,
            "no NVIDIA kernel module is visible (no /proc/driver/nvidia/version) and none was given",
        )
        .remedy("load the driver on the node, or pass the node's version with --driver-version");
    };
    let libs = parse::parse_user_libs(&get(sections, "libs").output);
    let mismatched: Vec<&UserLib> = libs.iter().filter(|l| l.version != expected).collect();
    let smi_version = parse::parse_smi_version(&get(sections, "smi-version").output);
    let drift = |summary: String| {
        Check::new(NAME, CheckStatus::Drift, summary)
            .detail(format!("- {expected} (the node's kernel module)"))
    };
    if let Some(SmiFailure::VersionMismatch { nvml_library }) = failure {
        let mut check = drift(format!(
            "driver/library version mismatch: userspace {}, kernel module {expected}",
            nvml_library.as_deref().unwrap_or("of another version")
        ));
        for lib in &mismatched {
            check = check.detail(format!("+ {} ({})", lib.version, lib.path));
        }
        return check.remedy(userspace_remedy(Some(expected))).remedy(
            "if the node's driver was upgraded without a reboot, its kernel module is still the old one: reboot the node, then match the guest to it",
        );
    }
    if !libs.is_empty() {
        if mismatched.is_empty() {
            let check = Check::new(
                NAME,
                CheckStatus::Ok,
                format!("userspace driver {expected} matches the kernel module"),
            );
            return libs.iter().fold(check, |c, l| {
                c.detail(format!("  {} ({})", l.version, l.path))
            });
        }
        let mut check = drift(format!(
            "userspace driver {} differs from the kernel module {expected}",
            mismatched[0].version
        ));
        for lib in &libs {
            let mark = if lib.version == expected { ' ' } else { '+' };
            check = check.detail(format!("{mark} {} ({})", lib.version, lib.path));
        }
        return check.remedy(userspace_remedy(Some(expected)));
    }
    match smi_version.nvml.as_deref() {
        Some(nvml) if parse::version_prefix_matches(nvml, expected) => Check::new(
            NAME,
            CheckStatus::Ok,
            format!("NVML {nvml} matches the kernel module {expected}"),
        ),
        Some(nvml) => drift(format!(
            "NVML {nvml} differs from the kernel module {expected}"
        ))
        .detail(format!("+ {nvml} (NVML)"))
        .remedy(userspace_remedy(Some(expected))),
        None => drift("no NVIDIA userspace driver found (no libcuda or libnvidia-ml)".into())
            .remedy(userspace_remedy(Some(expected))),
    }
}

fn check_cuda(cuda: &CudaExpectation, sections: &Sections) -> Check {
    const NAME: &str = "cuda";
    let nvcc = get(sections, "nvcc");
    let path = format!("{}/bin/nvcc", cuda.home.trim_end_matches('/'));
    let install = format!(
        "install the CUDA {} toolkit in the guest (`cuda-toolkit-{}`, the toolkit only, never the driver), or set `cuda.home` to where it is",
        cuda.release,
        cuda.release.replace('.', "-")
    );
    if nvcc.not_found() {
        return Check::new(NAME, CheckStatus::Drift, format!("no nvcc at {path}"))
            .detail(format!("- CUDA {} at {}", cuda.release, cuda.home))
            .remedy(install);
    }
    let found = match parse::parse_nvcc_version(&nvcc.output) {
        Ok(v) if nvcc.ok() => v,
        Ok(_) | Err(_) => {
            return Check::new(
                NAME,
                CheckStatus::Drift,
                format!("{path} --version failed: {}", parse::excerpt(&nvcc.output)),
            )
            .remedy(install);
        }
    };
    if found.release != cuda.release {
        return Check::new(
            NAME,
            CheckStatus::Drift,
            format!(
                "the CUDA toolkit at {} is {}, the inventory says {}",
                cuda.home, found.release, cuda.release
            ),
        )
        .detail(format!("- {}", cuda.release))
        .detail(format!("+ {}", found.release))
        .remedy(install);
    }
    let build = found.build.as_deref().unwrap_or("?");
    let smi = parse::parse_smi_version(&get(sections, "smi-version").output);
    if let Some(supported) = smi.cuda.as_deref()
        && parse::compare_versions(supported, &found.release) == Some(std::cmp::Ordering::Less)
    {
        return Check::new(
            NAME,
            CheckStatus::Drift,
            format!(
                "the driver supports CUDA up to {supported}, older than the toolkit {}",
                found.release
            ),
        )
        .remedy("upgrade the node's driver to one that supports this CUDA release (and the guest's userspace driver with it), or declare an older toolkit");
    }
    let supported = smi.cuda.map_or(String::new(), |s| {
        format!("; the driver supports up to {s}")
    });
    Check::new(
        NAME,
        CheckStatus::Ok,
        format!(
            "CUDA {} (V{build}) at {}{supported}",
            found.release, cuda.home
        ),
    )
}

/// What [`TORCH_PROBE`] prints.
#[derive(Debug, Deserialize)]
struct TorchSeen {
    torch: Option<String>,
    error: Option<String>,
    cuda: Option<String>,
    count: Option<u32>,
    available: Option<bool>,
    #[serde(default)]
    warnings: Vec<String>,
}

fn check_torch(torch: &TorchExpectation, sections: &Sections) -> Check {
    const NAME: &str = "torch";
    let section = get(sections, "torch");
    let python = format!("{}/bin/python", torch.venv.trim_end_matches('/'));
    if section.not_found() {
        return Check::new(NAME, CheckStatus::Drift, format!("no python at {python}"))
            .remedy("create the ml-env (`provision apply` builds it)");
    }
    let seen: Option<TorchSeen> = section
        .output
        .lines()
        .rev()
        .filter(|l| l.starts_with('{'))
        .find_map(|l| serde_json::from_str(l).ok());
    let Some(seen) = seen else {
        return Check::new(
            NAME,
            CheckStatus::Drift,
            format!("{python} failed: {}", parse::excerpt(&section.output)),
        )
        .remedy(format!(
            "run `{python} -c 'import torch'` in the guest to see why"
        ));
    };
    let Some(version) = seen.torch else {
        return Check::new(
            NAME,
            CheckStatus::Skipped,
            format!(
                "torch is not installed in {} ({}); the tp check runs once it is",
                torch.venv,
                seen.error.unwrap_or_default()
            ),
        );
    };
    let count = seen.count.unwrap_or(0);
    let cuda = seen.cuda.unwrap_or_else(|| "none".into());
    if count == torch.tp {
        return Check::new(
            NAME,
            CheckStatus::Ok,
            format!("torch {version} (CUDA {cuda}) sees {count} GPU(s), the service's tp"),
        );
    }
    let mut check = Check::new(
        NAME,
        CheckStatus::Drift,
        format!(
            "torch {version} (CUDA {cuda}) sees {count} GPU(s), the service's tp is {}",
            torch.tp
        ),
    )
    .detail(format!("- {} (tp)", torch.tp))
    .detail(format!("+ {count} (torch.cuda.device_count())"));
    for w in &seen.warnings {
        check = check.detail(format!("  torch warned: {}", w.trim()));
    }
    if seen.available == Some(false) && count == 0 {
        check = check.remedy(format!(
            "torch cannot use the GPUs: check that its CUDA ({cuda}) is no newer than what the driver supports (`nvidia-smi --version`)"
        ));
    }
    check
        .remedy("check that the container sees the GPUs (`nvidia-smi -L`) and that CUDA_VISIBLE_DEVICES is not set to fewer")
        .remedy("or change the service's tp to the number of GPUs it is given")
}
