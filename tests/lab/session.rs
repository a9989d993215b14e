//! One apply, one session: the plan is read through the same logins the apply writes
//! through. Counted where the real thing records them: the lab node's sshd log and the
//! guest's sshd journal ("Accepted publickey"), read around one `apply` that changes the
//! guest (a file) and the container (its memory, through the API) and reads the node's
//! GPUs over its SSH. Before the engine owned the sessions, apply opened a second guest
//! login after its plan's (and a second `AgentBinary`). The node has one login: the facts,
//! the plan and the apply go over it. What the running container shows of its GPUs is read
//! by the guest's agent in the request that reads the guest early, beside the facts (once a
//! second node login made for it, and a `pct exec`); when the facts come first, it is read
//! over the node's one login. Needs root and the lab.

use crate::pve_cli::{Cli, cleanup, lab, slot};

/// "Accepted publickey" lines in the lab node's sshd log.
fn node_logins(cli: &Cli) -> usize {
    std::fs::read_to_string(cli.lab.dir().join("run/sshd.log"))
        .unwrap_or_default()
        .matches("Accepted publickey")
        .count()
}

/// "Accepted publickey" lines in the guest's sshd journal, read through the node (a node
/// login of its own, so count the node's logins between two of these, not around them).
fn guest_logins(cli: &Cli, vmid: u32) -> usize {
    cli.node(&format!(
        "pct exec {vmid} -- journalctl -u ssh --no-pager -o cat"
    ))
    .matches("Accepted publickey")
    .count()
}

#[test]
fn an_apply_logs_in_to_its_guest_once_and_its_node_once() {
    let lab = lab();
    let _guard = cleanup(&lab, slot::SESSION);
    let cli = Cli::new(lab);
    let mut ct = cli.ct("pxc-session", slot::SESSION);
    cli.write(&ct, true);
    cli.expect(&["apply", "--yes"], 0);

    // A change in the guest and one in the container's config: plan reads both, apply
    // writes both.
    ct.content = "hello = 2\n";
    ct.memory = "640M";
    cli.write(&ct, true);
    let guest_before = guest_logins(&cli, ct.vmid);
    let node_before = node_logins(&cli);
    let out = cli.expect(&["apply", "--yes", "-v"], 0);
    let node_after = node_logins(&cli);
    let guest_after = guest_logins(&cli, ct.vmid);
    assert!(out.contains("write /etc/app.conf"), "{out}");
    assert!(out.contains("memory"), "{out}");
    assert_eq!(cli.guest(&ct, "cat /etc/app.conf"), "hello = 2\n");
    assert_eq!(
        guest_after - guest_before,
        1,
        "the guest's sshd saw {} logins for one apply:\n{out}",
        guest_after - guest_before
    );
    // One: the container's GPU view goes with the guest's read, or over this login when
    // the facts came first.
    let node = node_after - node_before;
    assert_eq!(
        node, 1,
        "the node's sshd saw {node} logins for one apply (GPU facts, the container's GPU view):\n{out}"
    );
    // What -v says is what the logs saw.
    assert!(out.contains("guest.pxc-session: 1 SSH login(s)"), "{out}");
    assert!(
        out.contains(&format!("node lab: {node} SSH login(s)")),
        "-v counts what the node's sshd saw ({node}):\n{out}"
    );
    assert_eq!(
        out.matches("API call(s)").count(),
        1,
        "one API connection for the node: {out}"
    );
}
