//! Debian packages, present (optionally at a version), installed in one transaction.

use crate::resources::op::{Allowed, Op, guest};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::machine::HostError;
use crate::plan::{Action, Attribute, Change};

/// Packages to have installed: `name` or `name=version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AptSpec {
    /// Package names, optionally `=version`, sorted and unique.
    pub packages: Vec<String>,
}

impl AptSpec {
    fn split(entry: &str) -> (&str, Option<&str>) {
        match entry.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (entry, None),
        }
    }
}

impl Resource for AptSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "apt"
    }

    fn name(&self) -> String {
        "packages".to_string()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Packages(PackagesProbe {
            names: self
                .packages
                .iter()
                .map(|p| Self::split(p).0.to_string())
                .collect(),
        })]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let installed = facts.packages(&self.probes()[0])?;
        let mut d = Delta::new(Action::Update);
        let mut any_installed = false;
        for entry in &self.packages {
            let (name, want) = Self::split(entry);
            let have = installed.get(name).cloned().flatten();
            any_installed |= have.is_some();
            let ok = match (&have, want) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(h), Some(w)) => h == w,
            };
            if !ok {
                let after = want.map_or("installed".to_string(), str::to_string);
                d = d.attr(Attribute::change(name, have, Some(after)));
            }
        }
        if d.attributes.is_empty() {
            return Ok(None);
        }
        if !any_installed {
            d.action = Action::Create;
        }
        Ok(Some(d))
    }

    fn ops(&self, _: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        // One transaction for all of them; apt leaves the ones already right alone.
        guest(vec![Step::AptInstall(AptInstallStep {
            packages: self.packages.clone(),
        })])
    }
}

/// Installed versions from dpkg's status file (no `dpkg-query` process needed).
pub fn packages(names: &[String]) -> Result<BTreeMap<String, Option<String>>, HostError> {
    // Not there: this is not Debian or Ubuntu, which the message's path makes plain.
    let path = Path::new("/var/lib/dpkg/status");
    let status = fs::read_to_string(path).map_err(HostError::io("read", path))?;
    Ok(parse_dpkg_status(&status, names))
}

/// The versions of `names` installed according to a dpkg status file's text.
pub fn parse_dpkg_status(status: &str, names: &[String]) -> BTreeMap<String, Option<String>> {
    let mut out: BTreeMap<String, Option<String>> =
        names.iter().map(|n| (n.clone(), None)).collect();
    for stanza in status.split("\n\n") {
        let mut package = None;
        let mut installed = false;
        let mut version = None;
        for line in stanza.lines() {
            if let Some(v) = line.strip_prefix("Package: ") {
                package = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Status: ") {
                installed = v.trim().ends_with(" installed");
            } else if let Some(v) = line.strip_prefix("Version: ") {
                version = Some(v.trim().to_string());
            }
        }
        if let (Some(p), true) = (package, installed)
            && let Some(slot) = out.get_mut(p)
        {
            *slot = version;
        }
    }
    out
}

/// Installs Debian packages in one non-interactive transaction.
pub fn install(packages: &[String]) -> Result<(), HostError> {
    let env = [
        ("DEBIAN_FRONTEND", "noninteractive"),
        ("NEEDRESTART_MODE", "a"),
    ];
    let mut args: Vec<String> = [
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(packages.iter().cloned());
    // Try with the lists as they are first; refresh them only when that fails, so a
    // converged host does not hit its mirror on every apply.
    if crate::machine::run("apt-get", &args, &env).is_ok() {
        return Ok(());
    }
    crate::machine::run("apt-get", &["update".into(), "-q".into()], &env)
        .map_err(signature_hint)?;
    crate::machine::run("apt-get", &args, &env)
}

/// apt's own words are kept; when they say a repository's signature did not verify, a
/// line says what that means for the inventory.
fn signature_hint(e: HostError) -> HostError {
    match e {
        HostError::Exit {
            command,
            status,
            mut output,
        } if ["NO_PUBKEY", "is not signed", "EXPKEYSIG", "BADSIG"]
            .iter()
            .any(|m| output.contains(m)) =>
        {
            output.push_str(
                "\nhint: a repository is not signed by the key its source names: compare the source's pinned `key.fingerprint` with the key apt names above (NO_PUBKEY), and the repository's published key",
            );
            HostError::Exit {
                command,
                status,
                output,
            }
        }
        other => other,
    }
}

/// Probe: installed versions of Debian packages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PackagesProbe {
    /// Package names.
    pub names: Vec<String>,
}

impl crate::resources::wire::AgentProbe for PackagesProbe {
    fn answer(
        &self,
        verify_full: bool,
    ) -> Result<crate::resources::wire::Fact, crate::resources::wire::AnswerError> {
        let _ = verify_full;
        Ok(crate::resources::wire::Fact::Packages(Some(packages(
            &self.names,
        )?)))
    }
}

/// Step: install Debian packages in one non-interactive transaction.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AptInstallStep {
    /// `name` or `name=version`.
    pub packages: Vec<String>,
}

impl crate::resources::wire::AgentStep for AptInstallStep {
    fn describe(&self) -> String {
        format!("apt-get install {}", self.packages.join(" "))
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        install(&self.packages)?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(120))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpkg_status_installed_only() {
        let status = "Package: git\nStatus: install ok installed\nVersion: 1:2.39.5-0+deb12u2\n\nPackage: vim\nStatus: deinstall ok config-files\nVersion: 2:9.0\n";
        let got = parse_dpkg_status(status, &["git".into(), "vim".into(), "curl".into()]);
        assert_eq!(got["git"].as_deref(), Some("1:2.39.5-0+deb12u2"));
        assert_eq!(got["vim"], None);
        assert_eq!(got["curl"], None);
    }
}
