//! Stand-in NVIDIA GPUs for the lab node: the two H200s captured on a lent machine
//! (`tests/fixtures/gpu/h200x2/`), as real character devices with the captured majors and
//! minors under `$LAB_DIR/gpu/dev`, the driver's `/proc` files under `$LAB_DIR/gpu/proc`,
//! and an `nvidia-smi` on the node's PATH that prints the captured query. Never the host's
//! `/dev`: node facts are read with `$LAB_DIR/gpu` as their root (`LAB_GPU_ROOT`), and the
//! passthrough lines name the nodes there, so real LXC binds them into containers.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::paths::Settings;

const PROC_VERSION: &str = include_str!("../../tests/fixtures/gpu/h200x2/proc-driver-version.txt");
const PROC_DEVICES: &str = include_str!("../../tests/fixtures/gpu/h200x2/proc-devices.txt");
const PROC_GPUS: &str = include_str!("../../tests/fixtures/gpu/h200x2/proc-gpus.txt");
const DEV_STAT: &str = include_str!("../../tests/fixtures/gpu/h200x2/dev-stat.txt");
const QUERY_GPU: &str = include_str!("../../tests/fixtures/gpu/h200x2/query-gpu.txt");

/// The root the stand-in `/dev` and `/proc` live under.
pub fn root(lab: &Settings) -> PathBuf {
    lab.dir.join("gpu")
}

/// A `devN` value parsed as Proxmox parses it, where a path below the stand-in GPUs'
/// `$LAB_GPU_ROOT/dev/` is checked as the same path below `/dev/` (Proxmox refuses a device
/// path outside `/dev/`; the lab keeps its stand-ins out of the host's `/dev`).
pub fn parse_dev(
    lab: &Settings,
    value: &str,
) -> Result<std::collections::BTreeMap<String, String>, crate::pve::propstr::PropError> {
    let stand_in = format!("{}/dev/", root(lab).display());
    let checked = value.replacen(&stand_in, "/dev/", 1);
    let mut dev = crate::pve::propstr::parse(&crate::pve::propstr::DEV, &checked)?;
    if checked != value
        && let Some(path) = dev.get_mut("path")
    {
        *path = path.replacen("/dev/", &stand_in, 1);
    }
    Ok(dev)
}

/// Makes the stand-in GPUs (idempotent: nodes already there with the right numbers stay).
pub fn install(lab: &Settings) -> Result<PathBuf> {
    let root = root(lab);
    let write = |rel: &str, text: &str| -> Result<()> {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("has a parent"))?;
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    write("proc/driver/nvidia/version", PROC_VERSION)?;
    write("proc/devices", PROC_DEVICES)?;
    // One `information` file per GPU, named by its bus location, as the driver has them.
    for block in PROC_GPUS.split("Model:").filter(|b| !b.trim().is_empty()) {
        let bus = block
            .lines()
            .find_map(|l| l.strip_prefix("Bus Location:"))
            .map(str::trim)
            .context("a GPU without a bus location in the capture")?;
        write(
            &format!("proc/driver/nvidia/gpus/{bus}/information"),
            &format!("Model:{block}"),
        )?;
    }
    std::fs::create_dir_all(root.join("dev/nvidia-caps"))?;
    for line in DEV_STAT.lines() {
        let parts: Vec<&str> = line.split('|').collect();
        let [kind, major, minor, path] = parts[..] else {
            bail!("unexpected line in the dev-stat capture: {line}");
        };
        if kind != "character special file" {
            continue;
        }
        let major = u32::from_str_radix(major, 16)?;
        let minor = u32::from_str_radix(minor, 16)?;
        mknod(&root.join(path.trim_start_matches('/')), major, minor)?;
    }
    let smi = format!(
        "#!/bin/sh\n# The lab node's stand-in nvidia-smi: what the H200 machine printed.\n\
         case \"$*\" in\n  --query-gpu=index,uuid,name,memory.total,pci.bus_id\\ --format=csv,noheader) cat <<'EOF'\n{QUERY_GPU}EOF\n ;;\n  \
         *) echo \"lab nvidia-smi: unsupported arguments: $*\" >&2; exit 2 ;;\nesac\n"
    );
    let bin = lab.bin_dir();
    std::fs::create_dir_all(&bin)?;
    let smi_path = bin.join("nvidia-smi");
    std::fs::write(&smi_path, smi)?;
    std::fs::set_permissions(&smi_path, std::fs::Permissions::from_mode(0o755))?;
    Ok(root)
}

/// A character device at `path` with `major:minor`, replacing anything else there.
fn mknod(path: &Path, major: u32, minor: u32) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        let rdev = m.rdev();
        if m.file_type().is_char_device()
            && libc::major(rdev) == major
            && libc::minor(rdev) == minor
        {
            return Ok(());
        }
        std::fs::remove_file(path)?;
    }
    let out = Command::new("mknod")
        .arg(path)
        .args(["c", &major.to_string(), &minor.to_string()])
        .output()
        .context("running mknod")?;
    if !out.status.success() {
        bail!(
            "mknod {} c {major} {minor} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(())
}
