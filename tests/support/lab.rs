//! What the lab tests share: the lab itself and the removal of a test's own container.

use std::path::{Path, PathBuf};
use std::time::Duration;

use provision_lab::client::PveClient;
use provision_lab::testkit::LabEnv;

/// The running lab (brought up when it is not).
pub fn lab() -> LabEnv {
    LabEnv::from_env_or_up().expect("the lab is up (run as root; see docs/lab.md)")
}

/// Stops and destroys a container on drop, whatever the test did.
pub struct Cleanup {
    api: PveClient,
    node: String,
    vmid: u32,
    conf: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let base = format!("/nodes/{}/lxc/{}", self.node, self.vmid);
        for (method, path) in [("POST", format!("{base}/status/stop")), ("DELETE", base)] {
            if let Ok(upid) = self.api.call(method, &path, &[]) {
                let _ = self.api.wait_task(
                    &self.node,
                    upid.as_str().unwrap_or(""),
                    Duration::from_secs(60),
                );
            }
        }
        // A create that failed (a lab fault, a killed run) leaves its `lock: create` config
        // behind, which DELETE refuses as Proxmox does; nothing else of it exists.
        if std::fs::read_to_string(&self.conf).is_ok_and(|c| c.trim() == "lock: create") {
            let _ = std::fs::remove_file(&self.conf);
        }
    }
}

/// Removes CT `vmid` now (left by an earlier, interrupted run) and again on drop.
pub fn cleanup(lab: &LabEnv, vmid: u32) -> Cleanup {
    let make = || Cleanup {
        api: lab.root_api().unwrap(),
        node: lab.node().to_string(),
        vmid,
        conf: Path::new(&lab.vars["LAB_PVE_ROOT"])
            .join(format!("nodes/{}/lxc/{vmid}.conf", lab.node())),
    };
    drop(make());
    make()
}
