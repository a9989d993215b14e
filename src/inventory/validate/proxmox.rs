//! What Proxmox itself would refuse in a container's options, refused here first with
//! Proxmox's own words (`pve::options::verify`, `pve::propstr`, `pve::formats`: the checks
//! the oracle's fixtures pin), so a bad value fails at `validate`, before any API call.

use pve::Version;
use pve::formats;
use pve::propstr::{self, Kind};

use super::Validator;
use crate::inventory::container::Container;
use crate::inventory::spanned::Pos;

/// The hint every refusal carries: where the words come from.
const WHY: &str = "this is what Proxmox VE answers for it";

impl Validator<'_> {
    /// One value Proxmox would refuse: `what` (the option as provision writes it) and
    /// Proxmox's message.
    fn pve_refuses(&mut self, pos: Pos, what: &str, words: Result<(), String>, hint: &str) {
        if let Err(words) = words {
            let words = words.trim_end().replace('\n', " ");
            self.err(
                pos,
                format!("Proxmox refuses `{what}`: {words}"),
                format!("{hint}; {WHY}"),
            );
        }
    }

    pub(super) fn proxmox_values(&mut self, ct: &Container) {
        // Both versions' rules agree on these checks; PVE 8's are used where they differ
        // (the stricter ones: a node's version is not known offline).
        let v = Version::Pve8;
        let option = |key: &str, value: &str| match pve::options::verify(key, value, v) {
            Some(e) => Err(e),
            None => Ok(()),
        };
        let net = |key: &str, value: &str| {
            let kind = propstr::NET.prop(key, v).map_or(Kind::Text, |p| p.kind);
            propstr::check_value(kind, value)
        };
        if let Some(h) = &ct.hostname {
            self.pve_refuses(
                h.pos,
                &format!("hostname: {}", h.value),
                option("hostname", h.as_str()),
                "a DNS name: letters, digits and `-`, dot-separated",
            );
        }
        let cores = ct.cores.value.to_string();
        self.pve_refuses(
            ct.cores.pos,
            &format!("cores: {cores}"),
            option("cores", &cores),
            "Proxmox allows 1 to 8192 cores",
        );
        for ns in &ct.nameservers {
            let s = ns.to_string();
            self.pve_refuses(
                ns.pos,
                &format!("nameserver: {s}"),
                formats::ip_with_ll_iface(&s),
                "give an IPv4 or IPv6 address",
            );
        }
        for t in &ct.tags {
            self.pve_refuses(
                t.pos,
                &format!("tags: {}", t.value),
                formats::tag(t.as_str()),
                "tags are letters, digits and `_-+.`",
            );
        }
        for nic in &ct.network {
            self.pve_refuses(
                nic.name.pos,
                &format!("name={}", nic.name.value),
                net("name", nic.name.as_str()),
                "an interface name: letters, digits and `-_.`",
            );
            self.pve_refuses(
                nic.bridge.pos,
                &format!("bridge={}", nic.bridge.value),
                net("bridge", nic.bridge.as_str()),
                "a bridge name: letters, digits and `-_.`",
            );
            let ip = nic.ip.value.to_string();
            self.pve_refuses(
                nic.ip.pos,
                &format!("ip={ip}"),
                formats::ipv4_config(&ip),
                "`dhcp` or ADDRESS/PREFIX with a prefix of 8 to 32",
            );
            if let Some(tag) = &nic.vlan {
                let t = tag.value.to_string();
                self.pve_refuses(
                    tag.pos,
                    &format!("tag={t}"),
                    net("tag", &t),
                    "a VLAN tag is 1 to 4094",
                );
            }
        }
        for m in &ct.mounts {
            let host = m.host.as_str();
            self.pve_refuses(
                m.host.pos,
                &format!("mp volume {host}"),
                formats::mp_string(host),
                "write the path without `.` or `..` components",
            );
            let path = m.path.as_str();
            self.pve_refuses(
                m.path.pos,
                &format!("mp={path}"),
                formats::mp_string(path),
                "write the path without `.` or `..` components",
            );
        }
    }
}
