//! The node's own resources without a node: the offline plan shows the exact commands
//! (ZFS cannot run on the test machines, so its side is proven as plans here and from
//! captured command outputs in `resources::model_storage`), and node settings that cannot
//! work are refused at their `file:line:col`.

use crate::cli_support::Provision;
use std::process::Output;

fn provision(args: &[&str]) -> Output {
    Provision::new(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_offline_plan_shows_the_exact_node_commands() {
    let o = provision(&["plan", "--offline", "tests/fixtures/host/zfs-node.yaml"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("node pve (https://192.0.2.6:8006)"), "{t}");
    assert!(
        t.contains("+ model_storage /tank/shared\n      # zfs create -p -o recordsize=1M -o compression=off -o mountpoint=/tank/shared tank/shared\n"),
        "{t}"
    );
    assert!(!t.contains("zpool create"), "{t}");
    // The whole plan as a person reads it.
    insta::assert_snapshot!("zfs_node_plan_offline", t);
    assert!(
        t.contains("+ template local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"),
        "{t}"
    );
    assert!(t.contains("+ sha512 = 39f6d06e"), "{t}");
    assert!(
        t.contains("~ driver                      = not loaded -> 580.159"),
        "{t}"
    );
    assert!(
        t.contains("`apply --install-driver` runs /root/NVIDIA-Linux-x86_64-580.159.run"),
        "{t}"
    );
    let o = provision(&[
        "plan",
        "--offline",
        "--json",
        "tests/fixtures/host/zfs-node.yaml",
    ]);
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let node = &plan["targets"][0];
    assert_eq!(node["target"]["kind"], "node", "{node}");
    assert_eq!(node["target"]["node"], "pve", "{node}");
    let kinds: Vec<&str> = node["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["model_storage", "template", "nvidia_host"]);
}

#[test]
fn node_settings_that_cannot_work_are_refused_where_written() {
    let o = provision(&["validate", "tests/fixtures/host/bad-host.yaml"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    for (at, what) in [
        ("bad-host.yaml:12:23", "`tank` is not a ZFS dataset name"),
        (
            "bad-host.yaml:12:55",
            "ZFS property `mountpoint: /x` cannot be set",
        ),
        (
            "bad-host.yaml:14:17",
            "`local:iso/debian.iso` is not a template volume ID",
        ),
        ("bad-host.yaml:15:14", "is not an http(s) URL"),
        (
            "bad-host.yaml:16:19",
            "the checksum is not a sha256 checksum",
        ),
        (
            "bad-host.yaml:18:15",
            "`latest` is not an NVIDIA driver version",
        ),
        ("bad-host.yaml:19:24", "is not one kernel command line word"),
    ] {
        assert!(t.contains(what), "{what}: {t}");
        assert!(t.contains(at), "{at}: {t}");
    }
    assert!(t.contains("7 errors"), "{t}");
    // The whole report as a person reads it.
    insta::assert_snapshot!("bad_host_validate", t);
}
