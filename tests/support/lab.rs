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

/// Removes the CT at `slot` now (left by an earlier, interrupted run) and again on drop.
pub fn cleanup(lab: &LabEnv, slot: Slot) -> Cleanup {
    let vmid = slot.vmid;
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

/// Where a lab test's own container lives: its vmid and the last octet of its address on
/// the lab bridge, outside the testkit's 9100-9199 and .100-.199 (which it hands out
/// itself). Tests run at once: two that share a vmid destroy each other's container
/// (`cleanup` at the start of one removes the other's), and two that share an address
/// reach each other's guest. Every slot is in the one list below, checked when the tests
/// compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The container's vmid.
    pub vmid: u32,
    /// The last octet of its IPv4 address on the lab bridge.
    pub ip_host: u32,
}

macro_rules! slots {
    ($($name:ident = $vmid:literal, $ip:literal;)*) => {
        $(pub const $name: Slot = Slot { vmid: $vmid, ip_host: $ip };)*
        const ALL: &[Slot] = &[$($name),*];
    };
}

/// Every lab test's own container place, one line each: a new test adds its line here.
pub mod slot {
    use super::Slot;

    slots! {
        PXC_ONE = 9261, 241;
        // The address `PXC_ONE` moves to (no container is made at its vmid).
        PXC_ONE_MOVED = 9262, 242;
        PXC_NOSSH = 9263, 243;
        PXC_TOKMNT = 9264, 244;
        PXC_TOKNOSSH = 9265, 245;
        PXC_SAVED = 9266, 246;
        PXC_NVIDIA = 9267, 247;
        PXC_NVRUN = 9268, 248;
        SESSION = 9269, 249;
        READ_ONLY = 9270, 252;
        HUNG_SMI = 9271, 240;
        FIRST_KEYED = 9275, 235;
        FIRST_NO_KEY = 9276, 236;
        FIRST_ABSENT = 9278, 238;
        FIRST_TOKEN = 9279, 239;
        UD_KEEP = 9281, 253;
        UD_OLD = 9282, 250;
        UD_OTHER = 9283, 251;
        REBUILD = 9291, 254;
        // A vmid no container has (its address is never used).
        MANY_ABSENT = 9297, 226;
        PA_ONE = 9301, 201;
        // The address `PA_ONE` moves to.
        PA_ONE_MOVED = 9302, 202;
        PA_ADOPT = 9311, 211;
        PA_FAULTS = 9321, 221;
        PA_AUTH = 9331, 231;
        BULLSEYE = 9411, 214;
        TRIXIE = 9413, 213;
    }

    // No two slots share a vmid or an address, and none is the testkit's.
    const _: () = {
        let mut i = 0;
        while i < ALL.len() {
            let a = ALL[i];
            assert!(
                a.vmid >= 9200 && a.ip_host >= 200 && a.ip_host <= 254,
                "a lab slot is in the testkit's range (9100-9199, .100-.199) or off the bridge"
            );
            let mut j = i + 1;
            while j < ALL.len() {
                assert!(
                    ALL[j].vmid != a.vmid && ALL[j].ip_host != a.ip_host,
                    "two lab slots share a vmid or an address: give each test its own"
                );
                j += 1;
            }
            i += 1;
        }
    };
}
