//! A node's rules: its API URL, TLS trust and credentials, and what needs its SSH.

use super::Validator;
use crate::inventory::container::GpuMethod;
use crate::inventory::node::Node;
use crate::inventory::text::Name;

impl Validator<'_> {
    pub(super) fn node(&mut self, name: &Name, node: &Node) {
        let url = node.api.url.literal().unwrap_or("https://from-env");
        let rest = url.strip_prefix("https://");
        match rest {
            None => self.err(
                node.api.url.pos,
                format!("the API URL `{url}` is not https"),
                "Proxmox serves its API over HTTPS on port 8006, e.g. `https://10.1.2.6:8006`",
            ),
            Some(r) if r.is_empty() || r.starts_with('/') => self.err(
                node.api.url.pos,
                format!("the API URL `{url}` names no host"),
                "write e.g. `https://10.1.2.6:8006`",
            ),
            Some(_) => {}
        }
        let tls = &node.api.tls;
        match (&tls.fingerprint, &tls.ca_file) {
            (Some(_), Some(ca)) => self.err(
                ca.pos,
                format!("node `{name}` names both a fingerprint and a CA file"),
                "keep one way to trust the node's certificate",
            ),
            (None, None) => self.err(
                node.api.url.pos,
                format!("node `{name}` says nothing about trusting its TLS certificate"),
                "add `tls: { fingerprint: \"AB:CD:...\" }` (from `pvenode cert info` on the node) or `tls: { ca_file: pve-root-ca.pem }`",
            ),
            (Some(fp), None) => {
                let hex: String = fp
                    .literal()
                    .unwrap_or(&"0".repeat(64))
                    .chars()
                    .filter(|c| *c != ':')
                    .collect();
                if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                    self.err(
                        fp.pos,
                        "the TLS fingerprint is not a SHA-256 fingerprint",
                        "write the 32 bytes as hex, with or without colons, as `pvenode cert info` prints them",
                    );
                }
            }
            (None, Some(_)) => {}
        }
        if node.api.token.is_none() && node.api.password.is_none() {
            self.err(
                node.api.url.pos,
                format!("node `{name}` gives no API credentials"),
                "add `token: { env: PVE_TOKEN }`, or `password: { env: PVE_ROOT_PASSWORD }` for root@pam",
            );
        }
        for (pos, message, hint) in crate::inventory::node_setup::problems(
            node.model_storage.as_ref(),
            &node.templates,
            node.nvidia.as_ref(),
        ) {
            self.err(pos, message, hint);
        }
        // The model storage and the NVIDIA side are read and changed on the node itself.
        if node.ssh.host.is_none() && (node.model_storage.is_some() || node.nvidia.is_some()) {
            self.err(
                node.api.url.pos,
                format!("node `{name}` has no `ssh.host`: its `model_storage` and `nvidia` are read and changed on the node over SSH"),
                "add `ssh: { host: ..., identity_file: ... }` (root) to the node",
            );
        }
        // Without node SSH, containers are still created and changed through the API
        // (their guests must answer SSH themselves); GPU passthrough lines are root-only
        // and raw `lxc.*` lines cannot go through the API at all.
        let with_gpus: Vec<&str> = node
            .containers
            .iter()
            .filter(|(_, ct)| ct.gpus.is_some())
            .map(|(n, _)| n.as_str())
            .collect();
        // Proxmox refuses to start a container whose `devN` path does not exist, and
        // `/dev/nvidia-uvm*` appear only at the first CUDA use after a boot unless
        // something makes them: a node reboot would leave these containers stopped.
        let uvm_at_boot = node.nvidia.as_ref().is_some_and(|n| n.uvm_at_boot.value);
        for (ct_name, gpus) in node
            .containers
            .iter()
            // The built-in gpu-passthrough role is what writes the `devN` entries.
            .filter(|(_, ct)| ct.roles.iter().any(|r| r.as_str() == "gpu-passthrough"))
            .filter_map(|(n, ct)| ct.gpus.as_ref().map(|g| (n, g)))
            .filter(|(_, g)| g.method.value == GpuMethod::Dev && !uvm_at_boot)
        {
            let pos = gpus.devices.first().map_or(gpus.method.pos, |d| d.pos);
            self.err(
                pos,
                format!("container `{ct_name}` passes /dev/nvidia-uvm and /dev/nvidia-uvm-tools through as `devN` entries, but node `{name}` declares nothing that creates them at boot: after a reboot the container does not start (Proxmox refuses a missing `devN` path) until a CUDA program has run on the node"),
                format!("declare `nvidia: {{ driver: \"<module version>\", uvm_at_boot: true }}` on node `{name}` (a unit runs `nvidia-modprobe -u -c0` at boot), or use `gpus.method: lxc` (bind mounts marked optional, which a missing node does not stop)"),
            );
        }
        if node.ssh.host.is_none() && !with_gpus.is_empty() {
            self.err(
                node.api.url.pos,
                format!(
                    "node `{name}` has no `ssh.host`: the GPU passthrough lines of container(s) {} are root-only steps (devN, raw lxc.* lines) that cannot run without it",
                    with_gpus.join(", ")
                ),
                "add `ssh: { host: ..., identity_file: ... }` (root) to the node: an API token cannot write these lines, and raw lxc.* lines cannot go through the API at all",
            );
        }
    }
}
