//! The Proxmox VE node simulator (see issue "Lab"); not yet built.

fn main() {
    eprintln!("pve-lab: not built yet");
    std::process::exit(1);
}
