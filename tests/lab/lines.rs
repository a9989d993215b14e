//! A role's `pve_lines` removed with the role, on a real lab container through the CLI:
//! apply records the lines it writes in the container's description (`#` lines on top of
//! `lxc/<vmid>.conf`, in the same locked write as the raw lines); the role dropped from the
//! inventory plans `-` for exactly those lines still as written, and apply removes them over
//! the node's SSH, read back in the node's config. The container is the testkit's (adopted):
//! a `devN` and an `lxc.*` line written by hand beside them stay, and a recorded line changed
//! by hand since is kept and named. Needs root and the lab (`eval "$(scripts/lab up)"`).

use crate::guestlab::Guest;
use crate::node::{config_file, minute, node_ssh, provision_with_node_ssh, sh};

use provision::node::config_edit::{self, ConfigEdit};

/// A role of the user's: raw lines and a device, as a TUN role has them.
const ROLE: &str = r#"description: Lines for the lines test.
resources:
  - kind: pve_lines
    vmid: "{{container.vmid}}"
    label: lines-test
    lines:
      - "dev0: /dev/null"
      - "lxc.prlimit.nofile: 4321"
      - "lxc.environment: PROVISION_LINES=1"
"#;

/// `provision ARGS --target container.t` with the role declared or not; exit code and
/// stdout + stderr.
fn run(g: &Guest, with_role: bool, args: &[&str]) -> (Option<i32>, String) {
    let roles = if with_role { "[lines-test]" } else { "[]" };
    let mut args = args.to_vec();
    args.extend(["--target", "container.t"]);
    // The testkit's container, adopted under its own hostname.
    let body = format!(
        "        hostname: ct{}\n        roles: {roles}\n",
        g.ct.vmid
    );
    let out = provision_with_node_ssh(g, &body, &args);
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn expect(g: &Guest, with_role: bool, args: &[&str], code: i32) -> String {
    let (got, text) = run(g, with_role, args);
    assert_eq!(got, Some(code), "provision {args:?}:\n{text}");
    text
}

#[test]
fn a_removed_roles_lines_go_and_hand_written_ones_stay() {
    let g = Guest::new("lines-rm");
    g.role("lines-test", ROLE);
    let node = node_ssh(&g);
    let file = config_file(&g);
    let vmid = g.ct.vmid;
    // Written by hand before provision knew the container: a device as dev0 and a raw line.
    sh(node.as_ref(), &format!("pct set {vmid} --dev0 /dev/zero"));
    let before = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    let hand = ("lxc.prlimit.nproc".to_string(), "999".to_string());
    let add = ConfigEdit {
        add_lxc: vec![hand.clone()],
        ..Default::default()
    };
    config_edit::write(node.as_ref(), &file, &before, &add, minute()).unwrap();

    expect(&g, true, &["apply", "--yes"], 0);
    let conf = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    let dev = |k: &str| option(&conf.conf, k);
    // The role's dev0 took the next free index: the user's dev0 is theirs.
    assert_eq!(dev("dev0").as_deref(), Some("/dev/zero"), "{}", conf.text);
    assert_eq!(dev("dev1").as_deref(), Some("/dev/null"), "{}", conf.text);
    let description = conf.conf.get("description").unwrap_or_default().to_string();
    assert!(
        description.contains("provision: line=lines-test dev1: /dev/null")
            && description.contains("provision: line=lines-test lxc.prlimit.nofile: 4321"),
        "{}",
        conf.text
    );
    assert!(!description.contains("/dev/zero") && !description.contains("nproc"));
    expect(&g, true, &["check"], 0);

    // A recorded line changed by hand since.
    let now = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    let env = |v: &str| {
        (
            "lxc.environment".to_string(),
            format!("PROVISION_LINES={v}"),
        )
    };
    let edit = ConfigEdit {
        add_lxc: vec![env("2")],
        remove_lxc: vec![env("1")],
        ..Default::default()
    };
    config_edit::write(node.as_ref(), &file, &now, &edit, minute()).unwrap();

    // The role dropped: `-` for exactly its lines still as written.
    let plan = expect(&g, false, &["plan"], 0);
    assert!(
        plan.contains(&format!("- pve_lines {vmid} lines-test")),
        "{plan}"
    );
    assert!(
        plan.contains("dev1") && plan.contains("lxc.prlimit.nofile"),
        "{plan}"
    );
    assert!(
        !plan.contains("dev0") && !plan.contains("nproc"),
        "a line provision did not write is planned out:\n{plan}"
    );
    assert!(
        plan.contains(
            "`lxc.environment: PROVISION_LINES=2` was `lxc.environment: PROVISION_LINES=1` when provision wrote it for `lines-test`, no longer declared: changed since, kept"
        ),
        "{plan}"
    );
    expect(&g, false, &["check"], 2);

    expect(&g, false, &["apply", "--yes"], 0);
    let after = config_edit::read(node.as_ref(), &file, minute()).unwrap();
    let c = &after.conf;
    assert_eq!(
        option(c, "dev1"),
        None,
        "the role's device is still there:\n{}",
        after.text
    );
    assert_eq!(
        option(c, "dev0").as_deref(),
        Some("/dev/zero"),
        "{}",
        after.text
    );
    assert!(c.main.lxc.contains(&hand), "{}", after.text);
    assert!(c.main.lxc.contains(&env("2")), "{}", after.text);
    assert!(
        !c.main.lxc.iter().any(|(k, _)| k == "lxc.prlimit.nofile"),
        "{}",
        after.text
    );
    let description = c.get("description").unwrap_or_default();
    assert!(!description.contains("lines-test"), "{}", after.text);
    // The role is forgotten: nothing more to remove or name.
    let plan = expect(&g, false, &["plan"], 0);
    assert!(!plan.contains("lines-test"), "{plan}");
}

/// An option as it stands once the container restarts: pending over current, none when
/// its deletion is pending.
fn option(c: &pve::config::CtConfig, k: &str) -> Option<String> {
    if c.pending_delete().iter().any(|d| d == k) {
        return None;
    }
    c.pending
        .props
        .get(k)
        .map(String::as_str)
        .or(c.get(k))
        .map(str::to_string)
}
