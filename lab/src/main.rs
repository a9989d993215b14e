//! `pve-lab`: the Proxmox node simulator's command line (`scripts/lab` wraps it).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use provision_lab::control::{self, Hinted};
use provision_lab::paths::Settings;
use provision_lab::server::faults::{FaultKind, FaultRule};

#[derive(Parser)]
#[command(
    name = "pve-lab",
    version,
    about = "A Proxmox VE node simulator whose containers are real LXC containers"
)]
struct Cli {
    /// State directory (default: LAB_DIR or /var/lib/provision-lab).
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Bring the lab up (idempotent) and print shell exports.
    Up,
    /// Stop every container, the API server, sshd; remove the bridge.
    Down,
    /// Wipe the node but keep LAB_SHARED_DIR, then bring it up again.
    Reinstall,
    /// Show what runs.
    Status,
    /// Print the exports of the running lab.
    Env,
    /// Run the API server in the foreground (what `up` starts).
    #[command(hide = true)]
    Serve,
    /// The node's `pct`.
    Pct {
        /// Arguments as for Proxmox's pct.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Make the next calls matching a path fail (see docs/lab.md).
    Fault {
        /// Regex on the path below /api2/json; `clear` removes all rules, `list` shows them.
        path: String,
        /// lock-timeout, broken-pipe, task-error, slow-task, drop, error, slow.
        #[arg(long, default_value = "error")]
        kind: String,
        /// HTTP method to match.
        #[arg(long)]
        method: Option<String>,
        /// How many calls fail.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// Message (task-error, error).
        #[arg(long)]
        message: Option<String>,
        /// Status (error).
        #[arg(long)]
        status: Option<u16>,
        /// Delay in milliseconds (slow-task, slow; before answering otherwise).
        #[arg(long)]
        delay_ms: Option<u64>,
        /// Only calls whose parameters contain KEY=VALUE.
        #[arg(long)]
        param: Option<String>,
        /// slow-task: do not hold the config lock while slow.
        #[arg(long)]
        no_hold_lock: bool,
    },
}

fn settings(cli_dir: &Option<PathBuf>) -> Result<Settings> {
    if let Some(d) = cli_dir {
        // SAFETY: single-threaded at this point; the variable only feeds Settings::from_env.
        unsafe { std::env::set_var("LAB_DIR", d) };
        if let Ok(s) = Settings::load(d) {
            return Ok(s);
        }
    }
    control::settings()
}

fn run(cli: Cli) -> Result<i32> {
    let exe = std::env::current_exe().context("finding pve-lab's own path")?;
    match cli.cmd {
        Cmd::Up => {
            let t = std::time::Instant::now();
            settings(&cli.dir)?;
            let vars = control::up(&exe)?;
            print!("{}", control::render_exports(&vars));
            eprintln!("lab: up in {:.1}s", t.elapsed().as_secs_f64());
        }
        Cmd::Down => {
            let t = std::time::Instant::now();
            control::down(&settings(&cli.dir)?)?;
            eprintln!("lab: down in {:.1}s", t.elapsed().as_secs_f64());
        }
        Cmd::Reinstall => {
            settings(&cli.dir)?;
            let vars = control::reinstall(&exe)?;
            print!("{}", control::render_exports(&vars));
        }
        Cmd::Status => print!("{}", control::status(&settings(&cli.dir)?)),
        Cmd::Env => {
            let lab = settings(&cli.dir)?;
            if !control::is_up(&lab) {
                return Err(Hinted {
                    message: "the lab is not up".into(),
                    hint: "run scripts/lab up".into(),
                }
                .into());
            }
            print!("{}", control::render_exports(&control::exports(&lab)?));
        }
        Cmd::Serve => {
            let lab = settings(&cli.dir)?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .max_blocking_threads(64)
                .build()?;
            rt.block_on(provision_lab::server::serve(lab))?;
        }
        Cmd::Pct { args } => return Ok(provision_lab::pct::main(settings(&cli.dir)?, &args)),
        Cmd::Fault {
            path,
            kind,
            method,
            count,
            message,
            status,
            delay_ms,
            param,
            no_hold_lock,
        } => {
            let lab = settings(&cli.dir)?;
            let env = provision_lab::testkit::LabEnv::from_settings(&lab)?;
            match path.as_str() {
                "clear" => env.clear_faults()?,
                "list" => println!("{}", serde_json::to_string_pretty(&env.faults()?)?),
                _ => {
                    let kind: FaultKind = serde_json::from_value(serde_json::Value::String(
                        kind.clone(),
                    ))
                    .map_err(|_| Hinted {
                        message: format!("unknown fault kind '{kind}'"),
                        hint: "use lock-timeout, broken-pipe, task-error, slow-task, drop, error or slow"
                            .into(),
                    })?;
                    env.inject_fault(&FaultRule {
                        method,
                        path,
                        param,
                        count,
                        kind,
                        message,
                        status,
                        delay_ms,
                        hold_lock: !no_hold_lock,
                    })?;
                }
            }
        }
    }
    Ok(0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(255)),
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  Caused by: {cause}");
            }
            if let Some(h) = e.downcast_ref::<Hinted>() {
                eprintln!("hint: {}", h.hint);
            }
            ExitCode::FAILURE
        }
    }
}
