//! Inventory → the desired resources of each target: the container's Proxmox config from
//! the inventory itself, everything else from the container's roles.

use std::collections::BTreeSet;

use super::container::{apt_source_spec, container_spec};
use super::render::Renderer;
use super::render::context::{NodeGpuView, container_context, guest_host};
use super::render::roles::RoleSet;
use super::render::service::build_all;
use super::{Desired, DesiredTarget};
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::inventory::Loaded;
use crate::inventory::secret::resolve_local;
use crate::plan::Target;
use crate::resources::apt::AptSpec;
use crate::resources::file::FileSpec;
use crate::resources::{ResourceSpec, TargetKind};

/// Templates and roles for an inventory: its own folders first, then the built-in ones.
pub struct Library {
    /// Templates.
    pub renderer: Renderer,
    /// Roles.
    pub roles: RoleSet,
}

impl Library {
    /// Loads the folders named in the inventory's `paths:`.
    pub fn load(loaded: &Loaded) -> Result<Self, Diagnostic> {
        let paths = &loaded.inventory.paths;
        let templates = paths
            .templates
            .as_ref()
            .map(|p| resolve_local(p, &loaded.base_dir));
        let roles = paths
            .roles
            .as_ref()
            .map(|p| resolve_local(p, &loaded.base_dir));
        Ok(Library {
            renderer: Renderer::new(templates.as_deref())?,
            roles: RoleSet::load(roles.as_deref())?,
        })
    }
}

/// The desired state of every target in the inventory, in apply order: for each container,
/// its Proxmox config, then its inside. `gpu_view` gives node GPU facts when they were read.
pub fn desired_state(
    loaded: &Loaded,
    library: &Library,
    gpu_view: &dyn Fn(&str) -> Option<NodeGpuView>,
) -> Result<Vec<DesiredTarget>, Diagnostics> {
    let mut targets = Vec::new();
    let mut errors = Vec::new();
    let root = std::env::var(super::ROOT_ENV).unwrap_or_default();
    for (node_name, node) in &loaded.inventory.nodes {
        targets.extend(super::node::node_target(node_name.as_str(), node, &root));
        let view = gpu_view(node_name.as_str());
        for (ct_name, ct) in &node.containers {
            let services = build_all(ct, &loaded.path);
            let ctx = container_context(
                node_name,
                node,
                ct_name,
                ct,
                view.as_ref(),
                &loaded.base_dir,
                &services,
            );
            let hostname = ct
                .hostname
                .as_ref()
                .map_or(ct_name.to_string(), |h| h.to_string());
            let mut spec = container_spec(node.api.node.as_str(), &hostname, ct);
            spec.bootstrap = node.ssh.host.is_some();
            // A token may not write bind mounts and the like: with node SSH they are node
            // steps (`pct set` as root); without it the API read refuses them at plan time.
            let root_only = (node.api.password.is_none() && node.ssh.host.is_some())
                .then(|| spec.split_root_only())
                .flatten();
            let mut container = vec![Desired {
                spec: ResourceSpec::Container(spec),
                role: None,
            }];
            container.extend(root_only.map(|lines| Desired {
                spec: ResourceSpec::PveLines(lines),
                role: None,
            }));
            let mut guest: Vec<Desired> = Vec::new();
            for source in &ct.apt_sources {
                let spec = match (&source.line, source.repository()) {
                    (_, Some(repo)) => ResourceSpec::AptSource(apt_source_spec(
                        source.name.as_str(),
                        &repo,
                        &loaded.base_dir,
                    )),
                    (Some(line), None) => ResourceSpec::File(FileSpec {
                        path: format!("/etc/apt/sources.list.d/{}.list", source.name.value),
                        content: format!("# Managed by provision.\n{}\n", line.value),
                        owner: "root".into(),
                        group: "root".into(),
                        mode: 0o644,
                    }),
                    (None, None) => continue, // reported by validation
                };
                guest.push(Desired { spec, role: None });
            }
            if !ct.packages.is_empty() {
                guest.push(Desired {
                    spec: ResourceSpec::Apt(AptSpec {
                        packages: ct.packages.iter().map(|p| p.to_string()).collect(),
                    }),
                    role: None,
                });
            }
            for role_name in &ct.roles {
                let Some(role) = library.roles.get(role_name.as_str()) else {
                    continue; // reported by validation
                };
                if let Some(missing) = role.missing_requirement(&ctx) {
                    errors.push(loaded.diag(
                        role_name.pos,
                        format!("role `{role_name}` needs `{missing}` in container `{ct_name}`"),
                    ));
                    continue;
                }
                match role.expand(&ctx, &library.renderer, &services) {
                    Ok(specs) => {
                        for spec in specs {
                            let d = Desired {
                                spec,
                                role: Some(role.name.clone()),
                            };
                            match d.spec.target_kind() {
                                TargetKind::Container | TargetKind::Node => container.push(d),
                                TargetKind::Guest => guest.push(d),
                            }
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
            let guest = match merge_guest(guest) {
                Ok(g) => keep_declared_dependencies(g),
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            if let Err(e) = check_dependencies(&guest) {
                errors.push(e);
            }
            let guest: Vec<Desired> = absent_models(ct).chain(guest).collect();
            targets.push(DesiredTarget {
                target: Target::Container {
                    node: node_name.to_string(),
                    name: ct_name.to_string(),
                    vmid: ct.vmid.value,
                },
                resources: container,
            });
            let address = format!(
                "{}@{}:{}",
                ct.ssh.user.value,
                guest_host(ct).unwrap_or_else(|| "?".into()),
                ct.ssh.port.value
            );
            targets.push(DesiredTarget {
                target: Target::Guest {
                    name: ct_name.to_string(),
                    address,
                },
                resources: guest,
            });
        }
    }
    if errors.is_empty() {
        Ok(targets)
    } else {
        Err(Diagnostics(errors))
    }
}

/// APT sources first, then one apt transaction for all packages (other resources need
/// them), and no resource declared twice with different content.
fn merge_guest(resources: Vec<Desired>) -> Result<Vec<Desired>, Diagnostic> {
    let is_source = |d: &Desired| match &d.spec {
        ResourceSpec::File(f) => f.path.starts_with("/etc/apt/sources.list.d/"),
        ResourceSpec::AptSource(_) => true,
        _ => false,
    };
    let (sources, resources): (Vec<Desired>, Vec<Desired>) =
        resources.into_iter().partition(is_source);
    let mut packages = BTreeSet::new();
    let mut apt_roles: Vec<String> = Vec::new();
    let mut rest: Vec<Desired> = Vec::new();
    for d in resources {
        if let ResourceSpec::Apt(a) = &d.spec {
            packages.extend(a.packages.iter().cloned());
            let source = d.role.clone().unwrap_or_else(|| "inventory".to_string());
            if !apt_roles.contains(&source) {
                apt_roles.push(source);
            }
            continue;
        }
        if let Some(existing) = rest.iter().find(|e| e.spec.address() == d.spec.address()) {
            if existing.spec == d.spec {
                continue;
            }
            return Err(Diagnostic::new(format!(
                "`{}` is declared twice with different content",
                d.spec.address()
            ))
            .cause(format!(
                "by role {} and role {}",
                existing.role.as_deref().unwrap_or("?"),
                d.role.as_deref().unwrap_or("?")
            ))
            .hint("one resource, one owner: drop it from one of the roles"));
        }
        rest.push(d);
    }
    let mut out = sources;
    if !packages.is_empty() {
        out.push(Desired {
            spec: ResourceSpec::Apt(AptSpec {
                packages: packages.into_iter().collect(),
            }),
            role: Some(apt_roles.join(", ")),
        });
    }
    out.extend(rest);
    Ok(out)
}

/// A service built from the inventory depends on what it runs on among the resources its
/// container's roles declare: which roles those are is the inventory's choice, so the
/// rest is dropped here, not named in advance. A role's own service keeps its list, checked
/// by [`check_dependencies`].
fn keep_declared_dependencies(mut resources: Vec<Desired>) -> Vec<Desired> {
    let declared: BTreeSet<String> = resources.iter().map(|r| r.spec.address()).collect();
    for d in &mut resources {
        if let ResourceSpec::Service(s) = &mut d.spec
            && s.declared.from_inventory()
        {
            s.depends_on.retain(|dep| declared.contains(dep));
        }
    }
    resources
}

/// Every `depends_on` of a service names a resource on the same target.
fn check_dependencies(resources: &[Desired]) -> Result<(), Diagnostic> {
    for d in resources {
        if let ResourceSpec::Service(s) = &d.spec {
            for dep in &s.depends_on {
                if !resources.iter().any(|r| r.spec.address() == *dep) {
                    return Err(Diagnostic::new(format!(
                        "service `{}` depends on `{dep}`, which no role declares",
                        s.unit
                    ))
                    .hint("depends_on names resources as kind:name on the same container"));
                }
            }
        }
    }
    Ok(())
}

/// The deletions of the model folders `ct` declares `state: absent`, to go in front of
/// what it declares (they free the model store before anything is downloaded).
fn absent_models(ct: &crate::inventory::Container) -> impl Iterator<Item = Desired> + '_ {
    ct.models.values().filter(|m| m.absent()).map(|m| Desired {
        spec: ResourceSpec::Removed(crate::resources::managed::Removal {
            entry: crate::resources::managed::Entry::Model {
                path: m.path.to_string(),
                repo: m.repo.to_string(),
            },
            prune: true,
            absent: true,
        }),
        role: None,
    })
}
