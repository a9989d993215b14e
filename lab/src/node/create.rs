//! `POST /nodes/{node}/lxc`: the synchronous checks and `lock: create` config, then (in the
//! task) the template unpacked into a new rootfs volume, SSH keys and host keys written, and
//! the final config saved, as `PVE::API2::LXC` create does.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::{ApiError, ApiResult};
use crate::pve::config::CtConfig;
use crate::pve::options::{MountKind, indexed};
use crate::pve::propstr;

use super::update::ConfigUpdate;
use super::{ConfigLock, Log, Node, RunState, run, volumes};

/// What a create call asks for.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    /// The new container's id.
    pub vmid: u32,
    /// `local:vztmpl/...`.
    pub ostemplate: String,
    /// Config options (`hostname`, `memory`, `net0`, `rootfs`, `mp0`, ...), as strings.
    pub options: BTreeMap<String, String>,
    /// Resolved privilege mode (Proxmox defaults to unprivileged on create).
    pub unprivileged: bool,
    /// Keys for `/root/.ssh/authorized_keys`.
    pub ssh_public_keys: Option<String>,
    /// Root password inside the container.
    pub password: Option<String>,
    /// Storage for `rootfs` when none is given.
    pub storage: String,
}

impl Node {
    /// The synchronous part: vmid unused, template present, config with `lock: create`.
    pub fn create_prepare(&self, req: &CreateRequest) -> ApiResult<PathBuf> {
        let template = volumes::path_of(&self.lab, &req.ostemplate)?;
        if !req.ostemplate.contains(":vztmpl/") || !template.is_file() {
            return Err(ApiError::die(format!(
                "volume '{}' does not exist",
                req.ostemplate
            )));
        }
        std::fs::create_dir_all(self.lab.conf_dir())?;
        // `check_vmid_unused` runs before any lock, so a duplicate is refused at once.
        if self.exists(req.vmid) {
            return Err(ApiError::die(format!(
                "CT {} already exists on node '{}'",
                req.vmid, self.lab.node
            )));
        }
        let _lock = ConfigLock::acquire(&self.lab.lock_path(req.vmid), Duration::from_secs(5))?;
        if self.exists(req.vmid) {
            return Err(ApiError::die(format!(
                "unable to create CT {} - CT {} already exists on node '{}'",
                req.vmid, req.vmid, self.lab.node
            )));
        }
        let mut conf = CtConfig::default();
        conf.main.props.insert("lock".into(), "create".into());
        self.write(req.vmid, &conf)?;
        Ok(template)
    }

    /// The task part; on failure the config and new volumes are removed again.
    pub fn create_run(&self, req: &CreateRequest, template: &Path, log: Log<'_>) -> ApiResult<()> {
        let vmid = req.vmid;
        let _lock = self.lock(vmid)?;
        let res = self.create_inner(req, template, log);
        if let Err(e) = res {
            let _ = std::fs::remove_dir_all(self.lab.images_dir(vmid));
            let _ = std::fs::remove_file(self.lab.conf_path(vmid));
            return Err(ApiError::die(format!(
                "unable to create CT {vmid} - {}",
                e.message
            )));
        }
        Ok(())
    }

    fn create_inner(&self, req: &CreateRequest, template: &Path, log: Log<'_>) -> ApiResult<()> {
        let vmid = req.vmid;
        let mut opts = req.options.clone();
        let rootfs = opts
            .remove("rootfs")
            .unwrap_or_else(|| format!("{}:4", req.storage));
        let rootfs = self.alloc_mount(vmid, "rootfs", &rootfs)?;
        let mut conf = CtConfig::default();
        conf.main.props.insert("rootfs".into(), rootfs);
        let root = super::lxcconf::rootfs_path(&self.lab, &conf)?;
        log(&format!("extracting archive '{}'", template.display()));
        let unpacked = self.unpacked_template(template, log)?;
        self.fill_rootfs(&unpacked, &root, log)?;
        // Mount points, devices and the rest go through the pending/apply path as on Proxmox.
        let mounts: BTreeMap<String, String> = opts
            .iter()
            .filter(|(k, _)| indexed(k, "mp"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in &mounts {
            opts.remove(k);
            let value = self.alloc_mount(vmid, k, v)?;
            let mp = propstr::parse(&propstr::MP, &value).map_err(ApiError::die)?;
            if MountKind::of(&mp["volume"]) == MountKind::Volume {
                log(&format!("allocated {k} volume {}", mp["volume"]));
            }
            conf.main.props.insert(k.clone(), value);
        }
        let upd = ConfigUpdate {
            set: opts,
            ..Default::default()
        };
        let errors = self.update_pct_config(vmid, &mut conf, RunState::Stopped, &upd, log)?;
        if !errors.is_empty() {
            return Err(ApiError::params(errors));
        }
        let props = &mut conf.main.props;
        props
            .entry("hostname".into())
            .or_insert_with(|| format!("CT{vmid}"));
        props.entry("memory".into()).or_insert_with(|| "512".into());
        props.entry("swap".into()).or_insert_with(|| "512".into());
        props.insert("arch".into(), "amd64".into());
        props.insert("ostype".into(), "debian".into());
        if req.unprivileged {
            props.insert("unprivileged".into(), "1".into());
        } else {
            props.remove("unprivileged");
        }
        self.post_create(&root, req, log)?;
        self.write(vmid, &conf)?;
        Ok(())
    }

    /// Host keys, authorized keys and password inside the new rootfs (`post_create_hook`).
    fn post_create(&self, root: &Path, req: &CreateRequest, log: Log<'_>) -> ApiResult<()> {
        let ssh = root.join("etc/ssh");
        for (kind, file) in [
            ("ed25519", "ssh_host_ed25519_key"),
            ("ecdsa", "ssh_host_ecdsa_key"),
        ] {
            let key = ssh.join(file);
            let _ = std::fs::remove_file(&key);
            let _ = std::fs::remove_file(key.with_extension("pub"));
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", kind, "-N", "", "-C", "root@lab", "-f"])
                .arg(&key))?;
            log(&format!("Creating SSH host key '{file}' - done"));
        }
        if let Some(keys) = &req.ssh_public_keys {
            let dir = root.join("root/.ssh");
            std::fs::create_dir_all(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
            let file = dir.join("authorized_keys");
            let mut text = keys.trim_end().to_string();
            text.push('\n');
            std::fs::write(&file, text)?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
        }
        if let Some(pw) = &req.password {
            use std::io::Write;
            let mut child = Command::new("chpasswd")
                .arg("-R")
                .arg(root)
                .stdin(std::process::Stdio::piped())
                .spawn()?;
            child
                .stdin
                .take()
                .expect("piped")
                .write_all(format!("root:{pw}\n").as_bytes())?;
            if !child.wait()?.success() {
                return Err(ApiError::die("setting the root password failed"));
            }
        }
        Ok(())
    }

    /// The template unpacked once under the lab's cache; later creates copy it.
    fn unpacked_template(&self, template: &Path, log: Log<'_>) -> ApiResult<PathBuf> {
        let base = self.lab.unpacked_dir();
        std::fs::create_dir_all(&base)?;
        let name = template
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("template");
        let meta = std::fs::metadata(template)?;
        let mtime = meta
            .modified()?
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let key = format!("{name}-{}-{mtime}", meta.len());
        let dir = base.join(&key);
        let done = base.join(format!("{key}.done"));
        let _guard =
            ConfigLock::acquire(&base.join(format!("{key}.lock")), Duration::from_secs(600))?;
        if done.exists() {
            return Ok(dir);
        }
        log(&format!("unpacking template {name} into the lab's cache"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        run(Command::new("tar")
            .args(["--numeric-owner", "--xattrs", "-xpf"])
            .arg(template)
            .arg("-C")
            .arg(&dir))?;
        std::fs::write(&done, "")?;
        Ok(dir)
    }
}
