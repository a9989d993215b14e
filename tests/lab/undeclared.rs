//! A container this inventory created and no longer declares, through the CLI against the
//! lab (its API checked against Proxmox's schema, real LXC under it): `plan` names it with
//! its creation and bind-mounted host path, `check` exits 2 while it runs, `apply` refuses
//! without `--allow-destroy` and changes nothing; stopped, it is named and kept (not drift);
//! with `--allow-destroy` it is destroyed through `DELETE /nodes/{node}/lxc/{vmid}` and the
//! bind-mounted host data is still there. Another inventory's container on the same node,
//! carrying a copy of the removed container's description (as `pct clone` copies it), is
//! never named nor touched. Needs root and the lab.

use std::path::PathBuf;
use std::time::Duration;

use crate::pve_cli::{Cli, cleanup, lab, slot};

fn listed(cli: &Cli) -> Vec<(u64, String)> {
    let list = cli
        .lab
        .api()
        .unwrap()
        .call("GET", &format!("/nodes/{}/lxc", cli.lab.node()), &[])
        .unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["vmid"]
                    .as_u64()
                    .or_else(|| c["vmid"].as_str().and_then(|s| s.parse().ok()))
                    .unwrap(),
                c["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn status(cli: &Cli, vmid: u64) -> Option<String> {
    listed(cli)
        .into_iter()
        .find(|(v, _)| *v == vmid)
        .map(|(_, s)| s)
}

#[test]
fn a_container_no_longer_declared_is_named_refused_while_it_runs_then_destroyed_keeping_its_bind_mount()
 {
    let _guards = [slot::UD_KEEP, slot::UD_OLD, slot::UD_OTHER].map(|s| cleanup(&lab(), s));
    let cli = Cli::new(lab());
    let node = cli.lab.node().to_string();
    let host = PathBuf::from(&cli.lab.vars["LAB_SHARED_DIR"]).join("ud-old-data");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("keep"), "data").unwrap();

    // This inventory creates `ud-old`, with a bind-mounted host folder.
    let mut old = cli.ct("ud-old", slot::UD_OLD);
    old.gpu = false;
    old.mount = Some(host.clone());
    let inventory = cli.write(&old, true);
    cli.expect(&["apply", "--yes"], 0);
    assert_eq!(status(&cli, 9282).as_deref(), Some("running"));

    // Another inventory's container on the same node, given a copy of `ud-old`'s
    // description (marker and all), as a clone or a restore to another vmid has.
    let other = Cli::new(lab());
    let mut theirs = other.ct("ud-other", slot::UD_OTHER);
    theirs.gpu = false;
    other.write(&theirs, true);
    other.expect(&["apply", "--yes", "--target", "container.ud-other"], 0);
    let api = cli.lab.api().unwrap();
    let conf = api
        .call("GET", &format!("/nodes/{node}/lxc/9282/config"), &[])
        .unwrap();
    let description = conf["description"].as_str().unwrap().to_string();
    assert!(description.contains("created=9282"), "{description}");
    api.call(
        "PUT",
        &format!("/nodes/{node}/lxc/9283/config"),
        &[("description", &description)],
    )
    .unwrap();

    // `ud-old` renamed to `ud-keep` (another vmid): the old one is no longer declared.
    let mut keep = cli.ct("ud-keep", slot::UD_KEEP);
    keep.gpu = false;
    cli.write(&keep, true);
    let owner = std::fs::canonicalize(&inventory).unwrap();
    let named = format!(
        "container 9282 `ud-old` on node lab, created by provision from {} on ",
        owner.display()
    );
    let kept = format!(
        "kept; `--allow-destroy` destroys it (host bind-mounted data kept: {} (mp0))",
        host.display()
    );
    let t = cli.expect(&["plan"], 0);
    assert!(t.contains(&named) && t.contains(&kept), "{t}");
    assert!(
        t.contains("- container 9282"),
        "a running one is a change:\n{t}"
    );
    assert!(
        !t.contains("9283"),
        "another inventory's container was named:\n{t}"
    );
    cli.expect(&["check"], 2);
    let t = cli.expect(&["apply", "--yes"], 1);
    assert!(
        t.contains("--allow-destroy") && t.contains("nothing was changed"),
        "{t}"
    );
    assert_eq!(status(&cli, 9282).as_deref(), Some("running"));
    assert_eq!(status(&cli, 9281), None, "apply went ahead:\n{t}");

    // Stopped, it is kept and named, and not drift.
    let root = cli.lab.root_api().unwrap();
    let upid = root
        .call("POST", &format!("/nodes/{node}/lxc/9282/status/stop"), &[])
        .unwrap();
    root.wait_task(&node, upid.as_str().unwrap(), Duration::from_secs(120))
        .unwrap();
    cli.expect(&["apply", "--yes"], 0);
    assert_eq!(status(&cli, 9282).as_deref(), Some("stopped"));
    let t = cli.expect(&["check"], 0);
    assert!(t.contains(&named) && t.contains(&kept), "{t}");

    // With the flag it goes; the host data stays, the other inventory's container too.
    let t = cli.expect(&["apply", "--yes", "--allow-destroy"], 0);
    assert!(t.contains("destroy CT 9282"), "{t}");
    assert_eq!(status(&cli, 9282), None);
    assert_eq!(std::fs::read_to_string(host.join("keep")).unwrap(), "data");
    assert_eq!(status(&cli, 9283).as_deref(), Some("running"));
    let t = cli.expect(&["check"], 0);
    assert!(!t.contains("ud-old"), "{t}");
    std::fs::remove_dir_all(&host).unwrap();
}
