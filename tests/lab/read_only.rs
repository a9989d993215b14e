//! `plan` and `check` change nothing on a target: the container's config in the lab's
//! PVE root, the guest's files under /etc, /root and /var/lib/provision (content, mode,
//! owner, mtime) and the known_hosts file are taken before and after both ran against a
//! container and guest with changes pending (a file's content and the container's memory),
//! and must be identical. The one thing a read may leave, the agent binary in the target's
//! cache (`/var/lib/provision/bin`), is outside what is compared, as documented in
//! `src/session/mod.rs`; the cache is emptied first, so the read is seen to push it there
//! and nothing else. The node's own filesystem is not compared: the lab's node is this
//! machine, shared by every lab's tests; what a container target could write on it is its
//! config, which is.

use crate::pve_cli::{Cli, Ct, cleanup, lab, slot};

/// Everything `plan`/`check` must leave as it was.
fn snapshot(cli: &Cli, ct: &Ct) -> String {
    let conf = std::fs::read_to_string(cli.conf(ct.vmid)).expect("the container's config");
    let known_hosts =
        std::fs::read_to_string(cli.dir.path().join("known_hosts")).expect("known_hosts");
    let guest = cli.guest(
        ct,
        "find /etc /root /var/lib/provision -xdev -path /var/lib/provision/bin -prune \
           -o -printf '%p %y %m %u %g %s %T@ %l\\n' | sort && \
         find /etc /root /var/lib/provision -xdev -path /var/lib/provision/bin -prune \
           -o -type f -exec sha256sum {} + | sort",
    );
    format!("== config\n{conf}\n== known_hosts\n{known_hosts}\n== guest\n{guest}")
}

#[test]
fn plan_and_check_leave_container_guest_and_known_hosts_as_they_found_them() {
    let cli = Cli::new(lab());
    let _guard = cleanup(&cli.lab, slot::READ_ONLY);
    let mut ct = cli.ct("pxc-readonly", slot::READ_ONLY);
    cli.write(&ct, true);
    cli.expect(&["apply", "--yes"], 0);
    // Changes pending on both targets: plan and check have something they could write.
    ct.content = "hello = 2\n";
    ct.memory = "640M";
    cli.write(&ct, true);
    // The agent cache emptied: the read pushes the binary again, its one write.
    cli.guest(&ct, "rm -f /var/lib/provision/bin/provision-*");
    let before = snapshot(&cli, &ct);
    let plan = cli.expect(&["plan"], 0);
    assert!(
        plan.contains("/etc/app.conf") && plan.contains("memory"),
        "{plan}"
    );
    let out = cli.dir.path().join("plan.json");
    cli.expect(&["plan", "--out", out.to_str().unwrap()], 0);
    cli.expect(&["check"], 2);
    let after = snapshot(&cli, &ct);
    if before != after {
        let diff = similar::TextDiff::from_lines(&before, &after)
            .unified_diff()
            .to_string();
        panic!("plan/check changed the target:\n{diff}");
    }
    let cache = cli.guest(&ct, "ls /var/lib/provision/bin");
    assert!(
        cache.lines().count() == 1 && cache.starts_with("provision-"),
        "the read pushed one agent binary into the cache: {cache:?}"
    );
    // And the snapshot sees a real change: apply makes one.
    cli.expect(&["apply", "--yes"], 0);
    assert_ne!(
        snapshot(&cli, &ct),
        after,
        "the snapshot misses what apply changes"
    );
}
