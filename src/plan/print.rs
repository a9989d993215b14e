//! The plan for people: grouped by target, `+` create, `~` update, `-/+` replace,
//! `-` delete, file content as unified diffs, and a summary line.

use console::Style;

use super::{Action, Change, Plan, PlanMode};

/// Renders `plan` as text; styled when `color` is set.
pub fn render_human(plan: &Plan, color: bool) -> String {
    let st = Styles::new(color);
    let mut out = String::new();
    if plan.mode == PlanMode::Offline {
        out += &format!(
            "{}\n\n",
            st.dim.apply_to(
                "Planned against an empty world (--offline): nothing was read, so everything is to create."
            )
        );
    }
    for target in &plan.targets {
        if target.changes.is_empty() && target.warnings.is_empty() {
            continue;
        }
        out += &format!("{}\n", st.bold.apply_to(target.target.heading()));
        if let Some(why) = &target.replanned {
            out += &format!("  {} re-planned: {why}\n", st.yellow.apply_to("↻"));
        }
        if let Some(vmid) = target.after_reboot {
            out += &format!(
                "  {} after CT {vmid}'s reboot: apply reaches this guest again once it has booted\n",
                st.yellow.apply_to("↻")
            );
        }
        if let Some(why) = &target.not_read {
            out += &format!(
                "  {} not read: {why} ({} resource(s) declared)\n\n",
                st.yellow.apply_to("?"),
                target.changes.len() + target.unchanged
            );
            continue;
        }
        for change in &target.changes {
            render_change(&mut out, change, &st);
        }
        for warning in &target.warnings {
            out += &format!("  {} {warning}\n", st.yellow.apply_to("! warning:"));
        }
        out.push('\n');
    }
    let s = &plan.summary;
    if s.has_changes() {
        let unread = match s.not_read {
            0 => String::new(),
            n => format!(" {n} target(s) known only after apply starts their container."),
        };
        out += &format!(
            "{} {} to add, {} to change, {} to replace, {} to destroy.{unread}\n",
            st.bold.apply_to("Plan:"),
            s.create,
            s.update,
            s.replace,
            s.delete
        );
    } else {
        out += &format!(
            "{} the targets match the inventory ({} resources checked).\n",
            st.bold.apply_to("No changes:"),
            s.unchanged
        );
    }
    out
}

struct Styles {
    bold: Style,
    dim: Style,
    green: Style,
    yellow: Style,
    red: Style,
    cyan: Style,
}

impl Styles {
    fn new(color: bool) -> Self {
        let s = |style: Style| style.force_styling(color);
        Styles {
            bold: s(Style::new().bold()),
            dim: s(Style::new().dim()),
            green: s(Style::new().green()),
            yellow: s(Style::new().yellow()),
            red: s(Style::new().red()),
            cyan: s(Style::new().cyan()),
        }
    }

    fn action(&self, action: Action) -> &Style {
        match action {
            Action::Create => &self.green,
            Action::Update => &self.yellow,
            Action::Replace | Action::Delete => &self.red,
        }
    }
}

fn render_change(out: &mut String, change: &Change, st: &Styles) {
    let sign = st.action(change.action).apply_to(change.action.sign());
    let role = change
        .role
        .as_ref()
        .map(|r| format!("  {}", st.dim.apply_to(format!("(role {r})"))))
        .unwrap_or_default();
    *out += &format!(
        "  {sign} {} {}{role}\n",
        st.bold.apply_to(&change.kind),
        change.name
    );
    for reason in &change.reasons {
        *out += &format!("      {} {reason}\n", st.cyan.apply_to("#"));
    }
    for warning in &change.warnings {
        *out += &format!("      {} {warning}\n", st.yellow.apply_to("! warning:"));
    }
    let width = change
        .attributes
        .iter()
        .map(|a| a.name.chars().count())
        .max()
        .unwrap_or(0);
    for attr in &change.attributes {
        let name = format!("{:width$}", attr.name);
        let line = match (&attr.before, &attr.after) {
            (None, Some(after)) => format!("{} {name} = {after}", st.green.apply_to("+")),
            (Some(before), None) => format!("{} {name} = {before}", st.red.apply_to("-")),
            (Some(before), Some(after)) if before == after => format!("  {name} = {after}"),
            (Some(before), Some(after)) => {
                format!("{} {name} = {before} -> {after}", st.yellow.apply_to("~"))
            }
            (None, None) => continue,
        };
        *out += &format!("      {line}\n");
    }
    if let Some(diff) = &change.diff {
        for line in diff.lines() {
            let styled = if line.starts_with("+++") || line.starts_with("---") {
                st.bold.apply_to(line).to_string()
            } else if line.starts_with('+') {
                st.green.apply_to(line).to_string()
            } else if line.starts_with('-') {
                st.red.apply_to(line).to_string()
            } else if line.starts_with("@@") {
                st.cyan.apply_to(line).to_string()
            } else {
                line.to_string()
            };
            *out += &format!("      {styled}\n");
        }
    }
}
