//! The command line: one file per command, each a `run(args, printer)` returning an
//! [`ExitStatus`]. Errors are printed here, once, as `error:` + `Caused by:` + `hint:`.

pub mod agent;
pub mod apply;
pub mod check;
pub mod generation;
pub mod gpu;
pub mod model;
pub mod plan;
pub mod progress;
pub mod render;
pub mod schema;
pub mod targets;
pub mod validate;

use std::path::Path;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::compile::{Library, desired_state};
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::engine::DesiredTarget;
use crate::engine::error::{EngineError, OpenError};
use crate::inventory::{Loaded, load, validate::validate};
use crate::printer::{ColorChoice, Printer, Verbosity};
use crate::session::SessionError;

/// How a command ended, as the exit code scripts and CI read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: done, or nothing to change.
    Success,
    /// 1: an error (bad input included).
    Failure,
    /// 2: changes pending (`plan --detailed-exitcode`) or drift (`check`), or a model
    /// that failed verification.
    Changes,
}

impl ExitStatus {
    /// 2 when `drifted`, else 0.
    pub fn drift_if(drifted: bool) -> Self {
        if drifted {
            ExitStatus::Changes
        } else {
            ExitStatus::Success
        }
    }
}

impl From<ExitStatus> for ExitCode {
    fn from(s: ExitStatus) -> ExitCode {
        match s {
            ExitStatus::Success => ExitCode::SUCCESS,
            ExitStatus::Failure => ExitCode::from(1),
            ExitStatus::Changes => ExitCode::from(2),
        }
    }
}

/// Builds and keeps a GPU LLM server on Proxmox VE exactly as declared.
#[derive(Debug, Parser)]
#[command(name = "provision", version, about, long_about = None, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Say more: the steps taken and the commands run.
    #[arg(short, long, global = true, conflicts_with = "quiet")]
    verbose: bool,
    /// Say less: results and errors only.
    #[arg(short, long, global = true)]
    quiet: bool,
    /// When to colour output.
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
    /// Never draw progress bars.
    #[arg(long, global = true)]
    no_progress: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Parse and validate an inventory (exit 0 valid, 1 not).
    Validate(validate::ValidateArgs),
    /// Write every file an inventory produces into a folder, one file per target path.
    Render(render::RenderArgs),
    /// Show what would change to make reality match the inventory.
    Plan(plan::PlanArgs),
    /// Plan, show, confirm, then execute exactly that plan.
    Apply(apply::ApplyArgs),
    /// Read-only drift check for CI (exit 0 clean, 2 drift, 1 error).
    Check(check::CheckArgs),
    /// List the generations of each guest's ml-env (when, what changed, gate result).
    History(generation::GenerationArgs),
    /// Go back to the previous generation that passed its health gate, gated like an apply.
    Rollback(generation::GenerationArgs),
    /// Print the inventory's JSON Schema, for editors.
    Schema(schema::SchemaArgs),
    /// Download and verify models by hand (pre-seeding a store, audits).
    Model(model::ModelArgs),
    /// Read GPU facts and run GPU checks on this machine.
    Gpu(gpu::GpuArgs),
    /// Serve one request on a target (provision runs this over SSH).
    #[command(hide = true)]
    Agent(agent::AgentArgs),
}

/// Parses the command line, runs the command, prints any error, returns the exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap exits 2 on usage errors, which scripts would read as "drift": a
            // usage error is an error, 1. Help and version are successes.
            let _ = e.print();
            return if e.use_stderr() {
                ExitStatus::Failure.into()
            } else {
                ExitStatus::Success.into()
            };
        }
    };
    let verbosity = if cli.global.quiet {
        Verbosity::Quiet
    } else if cli.global.verbose {
        Verbosity::Verbose
    } else {
        Verbosity::Normal
    };
    let printer = Printer::new(verbosity, cli.global.color, cli.global.no_progress);
    let result = match &cli.command {
        Command::Validate(args) => validate::run(args, &printer),
        Command::Render(args) => render::run(args, &printer),
        Command::Plan(args) => plan::run(args, &printer),
        Command::Apply(args) => apply::run(args, &printer),
        Command::Check(args) => check::run(args, &printer),
        Command::Schema(args) => schema::run(args, &printer),
        Command::History(args) => generation::history(args, &printer),
        Command::Rollback(args) => generation::rollback(args, &printer),
        Command::Model(args) => model::run(args, &printer),
        Command::Gpu(args) => gpu::run(args, &printer),
        Command::Agent(args) => agent::run(args, &printer),
    };
    match result {
        Ok(status) => status.into(),
        Err(err) => {
            printer.error(&render_error(&err, printer.color_err()));
            ExitStatus::Failure.into()
        }
    }
}

/// Renders an error chain: a diagnostic as itself, anything else as `error:` with
/// `Caused by:` lines.
pub fn render_error(err: &anyhow::Error, color: bool) -> String {
    if let Some(d) = err.downcast_ref::<Diagnostics>() {
        return d.render(color);
    }
    if let Some(d) = err.downcast_ref::<Diagnostic>() {
        return d.render(color);
    }
    // Library errors are typed: hints travel as data (a Diagnostic in the chain), never
    // inside an error's text.
    let mut d = Diagnostic::new(err.to_string());
    for cause in err.chain().skip(1) {
        if let Some(inner) = cause.downcast_ref::<Diagnostic>() {
            d.causes.push(inner.message.clone());
            d.hints.extend(inner.hints.iter().cloned());
        } else {
            let text = cause.to_string();
            if !d.message.contains(&text) {
                d.causes.push(text);
            }
        }
    }
    d.render(color)
}

/// The CLI's own error while opening a target (its SSH settings, its node's login),
/// carried through the engine and back unchanged.
#[derive(Debug)]
struct Opening(anyhow::Error);

impl std::fmt::Display for Opening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The whole chain: the engine shows it as one cause line of a run over many targets.
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Opening {}

/// Hands an error from opening a target to the engine.
pub fn opening(e: anyhow::Error) -> OpenError {
    Box::new(Opening(e))
}

/// The engine's error as the error the CLI reports: the diagnostic, the target's typed
/// error or the CLI's own opening error itself, so that rendering and matching on the
/// chain (a wait for a left-over run) see what they would have without the engine between.
pub fn from_engine(e: EngineError) -> anyhow::Error {
    match e {
        EngineError::Open(b) => match b.downcast::<Opening>() {
            Ok(o) => o.0,
            Err(b) => match b.downcast::<SessionError>() {
                Ok(e) => from_session(*e),
                Err(b) => anyhow::Error::from_boxed(b),
            },
        },
        EngineError::Access(e) => e.into(),
        EngineError::NotRead(e) => e.into(),
        EngineError::Refused(d) => (*d).into(),
        e @ EngineError::NotReached(_) => e.into(),
    }
}

/// Hands a session's error from opening a target to the engine.
pub fn session_open(e: SessionError) -> OpenError {
    Box::new(e)
}

/// A session's error as the error the CLI reports: the diagnostic or the typed error
/// itself (so rendering and matching on the chain see no layer between).
pub fn from_session(e: SessionError) -> anyhow::Error {
    match e {
        SessionError::Refused(d) => (*d).into(),
        SessionError::Transport(e) => e.into(),
        SessionError::Api(e) => e.into(),
        SessionError::Node(e) => e.into(),
        SessionError::Access(e) => e.into(),
        SessionError::NotRead(e) => e.into(),
        SessionError::Invalid(d) => d.into(),
        SessionError::Binary(e) => e.into(),
        SessionError::While { what, source } => from_session(*source).context(what),
    }
}

/// An inventory loaded, validated and expanded into desired resources.
pub struct Prepared {
    /// The inventory and its text.
    pub loaded: Loaded,
    /// Its templates and roles.
    pub library: Library,
    /// The desired state of every target (node GPU facts not read).
    pub desired: Vec<DesiredTarget>,
}

/// The start of every command that takes an inventory: load, validate, expand. Any
/// problem is reported with `file:line:col`.
pub fn prepare(path: &Path) -> anyhow::Result<Prepared> {
    let (loaded, library) = load_valid(path)?;
    let desired = desired_state(&loaded, &library, &|_| None)?;
    Ok(Prepared {
        loaded,
        library,
        desired,
    })
}

/// An inventory loaded and validated, with its templates and roles, not yet expanded:
/// the commands that read nodes expand it once, with the GPU facts they read.
pub fn load_valid(path: &Path) -> anyhow::Result<(Loaded, Library)> {
    let loaded = load(path)?;
    let library = Library::load(&loaded).map_err(|d| Diagnostics(vec![d]))?;
    validate(&loaded, &library.roles.names())?;
    Ok((loaded, library))
}
