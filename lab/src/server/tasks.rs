//! Worker tasks (`fork_worker`): a UPID returned at once, the work run in the background, a
//! log readable while it runs, and `TASK OK` / `TASK ERROR: ...` at its end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::pve::upid::Upid;

use super::http::{Params, Reply};

/// A failure injected into a task.
#[derive(Debug, Clone)]
pub enum TaskFault {
    /// The task ends with `TASK ERROR: <message>` without doing its work.
    Error(String),
    /// The task waits this long before working, holding the guest's config lock if `true`.
    Slow(Duration, bool),
}

#[derive(Debug, Default)]
struct TaskState {
    log: Vec<String>,
    exitstatus: Option<String>,
    endtime: Option<u64>,
}

/// One task.
#[derive(Debug)]
pub struct Task {
    upid: Upid,
    text: String,
    state: Mutex<TaskState>,
}

impl Task {
    fn push(&self, line: &str) {
        let mut st = self.state.lock().expect("task state lock");
        st.log.extend(line.lines().map(str::to_string));
    }

    fn status_json(&self) -> Value {
        let st = self.state.lock().expect("task state lock");
        let mut v = json!({
            "upid": self.text, "node": self.upid.node, "pid": self.upid.pid,
            "pstart": self.upid.pstart, "starttime": self.upid.starttime,
            "type": self.upid.kind, "id": self.upid.id, "user": self.upid.user,
            "status": if st.exitstatus.is_some() { "stopped" } else { "running" },
        });
        if let Some(e) = &st.exitstatus {
            v["exitstatus"] = json!(e);
            v["endtime"] = json!(st.endtime);
        }
        v
    }
}

/// All tasks of this server run.
#[derive(Debug)]
pub struct Tasks {
    node: String,
    pstart: u64,
    next_pid: AtomicU32,
    map: Mutex<BTreeMap<String, Arc<Task>>>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Clock ticks since boot at which this process started (`/proc/self/stat`, field 22).
fn own_pstart() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    after
        .split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

impl Tasks {
    /// An empty registry for `node`.
    pub fn new(node: &str) -> Tasks {
        Tasks {
            node: node.to_string(),
            pstart: own_pstart(),
            next_pid: AtomicU32::new(std::process::id() * 16),
            map: Mutex::new(BTreeMap::new()),
        }
    }

    /// Starts `work` in the background and returns its UPID at once.
    pub fn spawn<F>(
        self: &Arc<Self>,
        kind: &str,
        id: &str,
        user: &str,
        fault: Option<TaskFault>,
        lock_path: Option<std::path::PathBuf>,
        work: F,
    ) -> String
    where
        F: FnOnce(&(dyn Fn(&str) + Sync)) -> ApiResult<()> + Send + 'static,
    {
        let upid = Upid {
            node: self.node.clone(),
            pid: self.next_pid.fetch_add(1, Ordering::Relaxed),
            pstart: self.pstart,
            starttime: now(),
            kind: kind.to_string(),
            id: id.to_string(),
            user: user.to_string(),
        };
        let text = upid.encode();
        let task = Arc::new(Task {
            upid,
            text: text.clone(),
            state: Mutex::default(),
        });
        self.map
            .lock()
            .expect("tasks lock")
            .insert(text.clone(), task.clone());
        tokio::task::spawn_blocking(move || {
            let log = |l: &str| task.push(l);
            let res = match fault {
                Some(TaskFault::Error(msg)) => Err(ApiError::die(msg)),
                Some(TaskFault::Slow(d, hold)) => {
                    let held = lock_path
                        .filter(|_| hold)
                        .map(|p| crate::node::ConfigLock::acquire(&p, Duration::from_secs(30)));
                    std::thread::sleep(d);
                    drop(held);
                    work(&log)
                }
                None => work(&log),
            };
            let exit = match res {
                Ok(()) => {
                    task.push("TASK OK");
                    "OK".to_string()
                }
                Err(e) => {
                    let mut msg = e.message.clone();
                    for (k, v) in &e.errors {
                        msg.push_str(&format!("\n{k}: {v}"));
                    }
                    let first = msg.lines().next().unwrap_or("").to_string();
                    for extra in msg.lines().skip(1) {
                        task.push(extra);
                    }
                    task.push(&format!("TASK ERROR: {first}"));
                    first
                }
            };
            let mut st = task.state.lock().expect("task state lock");
            st.exitstatus = Some(exit);
            st.endtime = Some(now());
        });
        text
    }

    fn get(&self, upid: &str) -> ApiResult<Arc<Task>> {
        self.map
            .lock()
            .expect("tasks lock")
            .get(upid)
            .cloned()
            .ok_or_else(|| ApiError::die("no such task"))
    }

    /// `GET /nodes/{node}/tasks/{upid}/status`.
    pub fn status(&self, upid: &str) -> ApiResult<Reply> {
        Ok(Reply::data(self.get(upid)?.status_json()))
    }

    /// `GET /nodes/{node}/tasks/{upid}/log` with `start` and `limit`.
    pub fn log(&self, upid: &str, p: &Params) -> ApiResult<Reply> {
        let task = self.get(upid)?;
        let start = p.int("start")?.unwrap_or(0).max(0) as usize;
        let limit = p.int("limit")?.unwrap_or(50).max(0) as usize;
        let st = task.state.lock().expect("task state lock");
        let lines: Vec<Value> = st
            .log
            .iter()
            .enumerate()
            .skip(start)
            .take(limit)
            .map(|(i, t)| json!({ "n": i + 1, "t": t }))
            .collect();
        Ok(Reply {
            data: Value::Array(lines),
            total: Some(st.log.len() as u64),
        })
    }

    /// `GET /nodes/{node}/tasks`, newest first.
    pub fn list(&self, p: &Params) -> ApiResult<Reply> {
        let vmid = p.str("vmid");
        let map = self.map.lock().expect("tasks lock");
        let mut all: Vec<Value> = map
            .values()
            .filter(|t| vmid.as_deref().is_none_or(|v| t.upid.id == v))
            .map(|t| {
                let mut v = t.status_json();
                if let Some(e) = v.get("exitstatus").cloned() {
                    v["status"] = e;
                } else {
                    v.as_object_mut().expect("object").remove("status");
                }
                v
            })
            .collect();
        all.sort_by_key(|v| std::cmp::Reverse(v["starttime"].as_u64()));
        Ok(Reply::data(Value::Array(all)))
    }
}
