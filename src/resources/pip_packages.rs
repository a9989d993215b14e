//! Packages in a venv, from an index or a local wheelhouse. Drift is read from what is
//! installed (the venv's distributions), never from a marker file, and compared as pip
//! compares: PEP 440 version specifiers, so `torch==2.9.1` is satisfied by the
//! `2.9.1+cu130` that PyTorch's CUDA index installs.

use crate::resources::op::{Allowed, Op, guest};
use std::fmt;
use std::str::FromStr;

use pep440_rs::{Operator, Version, VersionSpecifiers};
use pep508_rs::{PackageName, VersionOrUrl};
use serde::{Deserialize, Serialize};

use super::wire::{Facts, NotRead, Probe, Step};
use super::{Delta, Resource, StepsError};
use crate::machine::HostError;
use crate::plan::{Action, Attribute, Change};

/// Packages' desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipPackagesSpec {
    /// The venv's folder.
    pub venv: String,
    /// PEP 508 requirements: `name==version`, or a range such as `name~=1.4`.
    pub packages: Vec<PipRequirement>,
    /// Where pip finds them.
    #[serde(flatten)]
    pub index: PipIndex,
    /// uv's path on the target when uv installs them (else the venv's pip); left out of
    /// plans when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uv: Option<String>,
}

/// A requirement pip can take and provision can check against what is installed: a name,
/// extras, PEP 440 version specifiers. Kept as written, for pip and for plans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PipRequirement {
    text: String,
    name: PackageName,
    specifiers: VersionSpecifiers,
}

/// A requirement that provision cannot check.
#[derive(Debug, thiserror::Error)]
pub enum RequirementError {
    /// Not PEP 508.
    #[error("`{text}` is not a PEP 508 requirement: {reason}")]
    Syntax {
        /// As written.
        text: String,
        /// The parser's words.
        reason: String,
    },
    /// A URL or a marker: what is installed cannot be compared with it.
    #[error(
        "`{text}`: {what} cannot be compared with what is installed; give a name with version specifiers, e.g. `torch==2.9.1`"
    )]
    Unsupported {
        /// As written.
        text: String,
        /// A URL or a marker.
        what: &'static str,
    },
}

impl FromStr for PipRequirement {
    type Err = RequirementError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let req = crate::inventory::software::parse_pep508(text).map_err(|e| {
            RequirementError::Syntax {
                text: text.to_string(),
                reason: e.0,
            }
        })?;
        let unsupported = |what| RequirementError::Unsupported {
            text: text.to_string(),
            what,
        };
        if !req.marker.is_true() {
            return Err(unsupported("an environment marker"));
        }
        let specifiers = match req.version_or_url {
            None => VersionSpecifiers::empty(),
            Some(VersionOrUrl::VersionSpecifier(s)) => s,
            Some(VersionOrUrl::Url(_)) => return Err(unsupported("a URL")),
        };
        Ok(PipRequirement {
            text: text.to_string(),
            name: req.name,
            specifiers,
        })
    }
}

impl TryFrom<String> for PipRequirement {
    type Error = RequirementError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<PipRequirement> for String {
    fn from(r: PipRequirement) -> String {
        r.text
    }
}

impl fmt::Display for PipRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PipRequirement {
    /// The normalised distribution name (PEP 503), as the venv probe keys it.
    pub fn name(&self) -> &str {
        self.name.as_ref()
    }

    /// Whether `installed` (a distribution's `Version:`) satisfies every specifier, by
    /// PEP 440: a local label is ignored unless the specifier names one (`==2.9.1` matches
    /// `2.9.1+cu130`), `===` is string equality. A version PEP 440 cannot read satisfies
    /// only a bare name or `===` of itself.
    pub fn satisfied_by(&self, installed: &str) -> bool {
        let installed = installed.trim();
        let version = Version::from_str(installed).ok();
        self.specifiers.iter().all(|s| {
            #[allow(deprecated)] // `===` is discouraged by PEP 440, not removed.
            let exact = *s.operator() == Operator::ExactEqual;
            if exact {
                installed.eq_ignore_ascii_case(&s.version().to_string())
            } else {
                version.as_ref().is_some_and(|v| s.contains(v))
            }
        })
    }

    /// What the plan shows as wanted: the version of a plain `==` pin, else the specifiers.
    pub fn wanted(&self) -> String {
        match self.specifiers.iter().collect::<Vec<_>>().as_slice() {
            [] => "installed".to_string(),
            [one] if *one.operator() == Operator::Equal => one.version().to_string(),
            _ => self.specifiers.to_string(),
        }
    }
}

impl Resource for PipPackagesSpec {
    fn target(&self) -> crate::resources::TargetKind {
        crate::resources::TargetKind::Guest
    }

    fn kind(&self) -> &'static str {
        "pip_packages"
    }

    fn name(&self) -> String {
        self.venv.clone()
    }

    fn probes(&self) -> Vec<Probe> {
        vec![Probe::Venv(crate::resources::venv::VenvProbe {
            path: self.venv.clone(),
        })]
    }

    fn diff(&self, facts: &Facts) -> Result<Option<Delta>, NotRead> {
        let found = facts.venv(&self.probes()[0])?;
        let mut d = Delta::new(if found.is_some() {
            Action::Update
        } else {
            Action::Create
        });
        for req in &self.packages {
            let have = found.and_then(|v| v.packages.get(req.name()).cloned());
            if !have.as_deref().is_some_and(|h| req.satisfied_by(h)) {
                d = d.attr(Attribute::change(req.name(), have, Some(req.wanted())));
            }
        }
        if let Some(src) = self.index.source()
            && !d.attributes.is_empty()
        {
            d = d.reason(format!("installed from {src}"));
        }
        Ok((!d.attributes.is_empty()).then_some(d))
    }

    fn ops(&self, _: &Change, _: &Allowed) -> Result<Vec<Op>, StepsError> {
        guest(vec![Step::PipInstall(PipInstallStep {
            venv: self.venv.clone(),
            requirements: self.packages.iter().map(ToString::to_string).collect(),
            editable: false,
            index: self.index.clone(),
            uv: self.uv.clone(),
        })])
    }
}

/// Where pip finds packages: an index (and extra ones), or a wheelhouse folder on the target
/// for air-gapped hosts. Declared once for `pip_packages`, `pip_editable` and the step they
/// make; flattened, so plans keep the three keys side by side.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipIndex {
    /// `--index-url`.
    #[serde(default)]
    pub index_url: Option<String>,
    /// `--extra-index-url`s, e.g. PyTorch's CUDA wheels.
    #[serde(default)]
    pub extra_index_urls: Vec<String>,
    /// `--no-index --find-links` folder on the target.
    #[serde(default)]
    pub wheelhouse: Option<String>,
    /// More `--find-links` (URLs or folders), beside the index (left out of the plan's
    /// JSON when none, so a plan without them keeps its shape).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub find_links: Vec<String>,
}

impl PipIndex {
    /// pip's arguments for this index. A wheelhouse means no index at all.
    pub fn pip_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        match (&self.wheelhouse, &self.index_url) {
            (Some(w), _) => args.extend(["--no-index".into(), "--find-links".into(), w.clone()]),
            (None, Some(u)) => args.extend(["--index-url".into(), u.clone()]),
            (None, None) => {}
        }
        for u in &self.extra_index_urls {
            args.extend(["--extra-index-url".into(), u.clone()]);
        }
        for l in &self.find_links {
            args.extend(["--find-links".into(), l.clone()]);
        }
        args
    }

    /// Where packages come from, in words, for plans: the index or wheelhouse, then every
    /// extra index and find-links place.
    pub fn source(&self) -> Option<String> {
        let places: Vec<&str> = self
            .wheelhouse
            .as_deref()
            .or(self.index_url.as_deref())
            .into_iter()
            .chain(self.extra_index_urls.iter().map(String::as_str))
            .chain(self.find_links.iter().map(String::as_str))
            .collect();
        (!places.is_empty()).then(|| places.join(", "))
    }
}

/// `pip install` into a venv: pinned requirements, or one source folder with `editable`;
/// with uv's path, `uv pip install` with the same requirements and places.
pub fn install(
    venv: &str,
    requirements: &[String],
    editable: bool,
    index: &PipIndex,
    uv: Option<&str>,
) -> Result<(), HostError> {
    if let Some(uv) = uv {
        let args = super::uv::install_args(venv, requirements, editable, index);
        return crate::machine::run(uv, &args, &[]);
    }
    let mut args: Vec<String> = vec![
        "install".into(),
        "--no-input".into(),
        "--disable-pip-version-check".into(),
        "--no-warn-script-location".into(),
    ];
    args.extend(index.pip_args());
    if editable {
        args.push("-e".into());
    }
    args.extend(requirements.iter().cloned());
    crate::machine::run(&format!("{venv}/bin/pip"), &args, &[])
}

/// Step: `pip install` into a venv.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PipInstallStep {
    /// The venv's folder.
    pub venv: String,
    /// Requirements (`name==version`) or, with `editable`, the one source folder.
    pub requirements: Vec<String>,
    /// Install the (single) requirement as an editable source folder.
    pub editable: bool,
    #[serde(flatten)]
    /// Where pip looks for packages.
    pub index: PipIndex,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// uv's path on the target, when uv installs (else the venv's pip).
    pub uv: Option<String>,
}

impl crate::resources::wire::AgentStep for PipInstallStep {
    fn describe(&self) -> String {
        format!(
            "{}pip install{} {} into {}",
            if self.uv.is_some() { "uv " } else { "" },
            if self.editable { " -e" } else { "" },
            self.requirements.join(" "),
            self.venv
        )
    }

    fn run(&self) -> Result<Option<serde_json::Value>, crate::resources::wire::StepError> {
        install(
            &self.venv,
            &self.requirements,
            self.editable,
            &self.index,
            self.uv.as_deref(),
        )?;
        Ok(None)
    }

    fn limit(&self) -> crate::resources::wire::Limit {
        crate::resources::wire::Limit::Total(crate::resources::wire::minutes(240))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;
    use crate::resources::venv::VenvFact;
    use crate::resources::wire::Fact;

    fn req(s: &str) -> PipRequirement {
        s.parse().unwrap()
    }

    #[test]
    fn a_pin_without_a_local_label_matches_any_local_build() {
        let r = req("torch==2.9.1");
        assert!(r.satisfied_by("2.9.1+cu130"));
        assert!(r.satisfied_by("2.9.1"));
        assert!(
            r.satisfied_by("2.9.1.0"),
            "PEP 440 pads releases with zeros"
        );
        assert!(!r.satisfied_by("2.9.10"));
        assert!(!r.satisfied_by("2.9.1rc1"));
        assert!(!r.satisfied_by("2.9.1.post1"));
        assert_eq!(r.wanted(), "2.9.1");
    }

    #[test]
    fn a_pin_with_a_local_label_needs_that_label() {
        let r = req("torch==2.9.1+cu130");
        assert!(r.satisfied_by("2.9.1+cu130"));
        assert!(!r.satisfied_by("2.9.1+cu128"));
        assert!(!r.satisfied_by("2.9.1"));
    }

    #[test]
    fn ranges_compatible_releases_and_exclusions() {
        let r = req("demo-range>=2.0,<3");
        assert!(r.satisfied_by("2.0"));
        assert!(r.satisfied_by("2.5+cu130"));
        assert!(!r.satisfied_by("3.0"));
        assert!(!r.satisfied_by("1.9"));
        assert_eq!(r.wanted(), ">=2.0, <3");
        let r = req("numpy~=1.26.0");
        assert!(r.satisfied_by("1.26.4"));
        assert!(!r.satisfied_by("1.27.0"));
        let r = req("x!=1.5");
        assert!(r.satisfied_by("1.4"));
        assert!(!r.satisfied_by("1.5+local"));
        let r = req("x==1.*");
        assert!(r.satisfied_by("1.9"));
        assert!(!r.satisfied_by("2.0"));
    }

    #[test]
    fn arbitrary_equality_is_string_equality() {
        let r = req("x===1.0");
        assert!(r.satisfied_by("1.0"));
        assert!(!r.satisfied_by("1.0+cu130"));
        assert!(!r.satisfied_by("1.0.0"));
    }

    #[test]
    fn names_are_normalised_and_extras_allowed() {
        let r = req("Flash_Attn.X[all] == 2.0");
        assert_eq!(r.name(), "flash-attn-x");
        assert!(r.satisfied_by("2.0"));
        assert_eq!(r.to_string(), "Flash_Attn.X[all] == 2.0");
        assert!(req("anything").satisfied_by("0.1"));
        assert!(
            req("anything").satisfied_by("not a version"),
            "a bare name asks no version"
        );
        assert!(!req("anything>=0").satisfied_by("not a version"));
    }

    #[test]
    fn urls_markers_and_garbage_are_refused_clearly() {
        let e = "x @ https://example.invalid/x.whl"
            .parse::<PipRequirement>()
            .unwrap_err();
        assert!(e.to_string().contains("a URL cannot be compared"), "{e}");
        let e = "x==1; python_version < '3.9'"
            .parse::<PipRequirement>()
            .unwrap_err();
        assert!(e.to_string().contains("marker"), "{e}");
        let e = "x==".parse::<PipRequirement>().unwrap_err();
        assert!(e.to_string().contains("not a PEP 508 requirement"), "{e}");
    }

    fn spec(packages: &[&str]) -> PipPackagesSpec {
        serde_json::from_value(serde_json::json!({
            "venv": "/opt/env",
            "packages": packages,
            "extra_index_urls": ["https://index.example.invalid/cu130"],
        }))
        .unwrap()
    }

    fn installed(pkgs: &[(&str, &str)]) -> Facts {
        let venv = VenvFact {
            python: "3.11".into(),
            packages: pkgs
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            editable: BTreeMap::new(),
            complete: true,
            interpreter: true,
            uv: false,
        };
        Facts::Read(HashMap::from([(
            Probe::Venv(crate::resources::venv::VenvProbe {
                path: "/opt/env".into(),
            }),
            Fact::Venv(Some(venv)),
        )]))
    }

    #[test]
    fn diff_is_empty_when_every_installed_version_satisfies() {
        let s = spec(&["torch==2.9.1", "demo-range>=2.0,<3"]);
        let facts = installed(&[("torch", "2.9.1+cu130"), ("demo-range", "2.1")]);
        assert_eq!(s.diff(&facts).unwrap(), None);
        let facts = installed(&[("torch", "2.9.0+cu130"), ("demo-range", "3.0")]);
        let d = s.diff(&facts).unwrap().unwrap();
        let shown: Vec<_> = d
            .attributes
            .iter()
            .map(|a| (a.name.clone(), a.before.clone(), a.after.clone()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (
                    "torch".into(),
                    Some("2.9.0+cu130".into()),
                    Some("2.9.1".into())
                ),
                (
                    "demo-range".into(),
                    Some("3.0".into()),
                    Some(">=2.0, <3".into())
                ),
            ]
        );
    }

    #[test]
    fn the_plan_json_keeps_its_shape() {
        let s = spec(&["torch==2.9.1"]);
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({
                "venv": "/opt/env",
                "packages": ["torch==2.9.1"],
                "index_url": null,
                "extra_index_urls": ["https://index.example.invalid/cu130"],
                "wheelhouse": null,
            })
        );
        let e = serde_json::from_value::<PipPackagesSpec>(serde_json::json!({
            "venv": "/v", "packages": [], "index": "x"
        }))
        .unwrap_err();
        assert!(e.to_string().contains("unknown field `index`"), "{e}");
    }
}
