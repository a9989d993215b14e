//! Task identifiers: `UPID:node:PID:PSTART:STARTTIME:type:id:user:` (`PVE::Tools::upid_encode`).

/// The parts of a UPID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upid {
    /// Node name.
    pub node: String,
    /// Worker pid.
    pub pid: u32,
    /// Worker start time in clock ticks since boot.
    pub pstart: u64,
    /// Start time, seconds since the epoch.
    pub starttime: u64,
    /// Task type (`vzcreate`, `vzstart`, ...).
    pub kind: String,
    /// Task object id (the vmid, or a storage name).
    pub id: String,
    /// User or token that started it.
    pub user: String,
}

impl Upid {
    /// Encodes as Proxmox does.
    pub fn encode(&self) -> String {
        format!(
            "UPID:{}:{:08X}:{:08X}:{:08X}:{}:{}:{}:",
            self.node, self.pid, self.pstart, self.starttime, self.kind, self.id, self.user
        )
    }

    /// Decodes a UPID string.
    pub fn decode(s: &str) -> Option<Upid> {
        let rest = s.strip_prefix("UPID:")?.strip_suffix(':')?;
        let parts: Vec<&str> = rest.splitn(7, ':').collect();
        if parts.len() != 7 {
            return None;
        }
        Some(Upid {
            node: parts[0].to_string(),
            pid: u32::from_str_radix(parts[1], 16).ok()?,
            pstart: u64::from_str_radix(parts[2], 16).ok()?,
            starttime: u64::from_str_radix(parts[3], 16).ok()?,
            kind: parts[4].to_string(),
            id: parts[5].to_string(),
            user: parts[6].to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let s = "UPID:lab:00001A2B:0012D687:6650F00D:vzcreate:129:root@pam!lab:";
        let u = Upid::decode(s).unwrap();
        assert_eq!(u.pid, 0x1a2b);
        assert_eq!(u.user, "root@pam!lab");
        assert_eq!(u.encode(), s);
    }
}
