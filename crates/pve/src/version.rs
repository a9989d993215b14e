//! Which Proxmox VE's rules apply: PVE 8 and PVE 9 differ in keys (`idmap`, `keepattrs`,
//! `host-managed`, `entrypoint`, `env`) and in how a config is written.

/// A Proxmox VE major version whose rules `crates/pve` follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// PVE 8 (Debian bookworm).
    Pve8,
    /// PVE 9 (Debian trixie), and anything newer until it differs.
    Pve9,
}

impl Version {
    /// The rules for a node's `GET /version` `release` or `version` (`8.4.0`, `9.1`):
    /// 8 and older read as PVE 8, anything else as PVE 9.
    pub fn of_release(release: &str) -> Version {
        match release
            .split('.')
            .next()
            .and_then(|m| m.trim().parse::<u32>().ok())
        {
            Some(m) if m <= 8 => Version::Pve8,
            _ => Version::Pve9,
        }
    }

    /// Both versions, oldest first.
    pub const ALL: [Version; 2] = [Version::Pve8, Version::Pve9];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases() {
        assert_eq!(Version::of_release("8.4.0"), Version::Pve8);
        assert_eq!(Version::of_release("9.1.3"), Version::Pve9);
        assert_eq!(Version::of_release("10.0"), Version::Pve9);
    }
}
