//! The interpreter's part in snapshots: each Python context pickles its namespace into a file
//! in the sandbox (so the file travels in the layer), and a context restored from a snapshot
//! loads it into its first kernel. JavaScript contexts keep their settings only.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use corral_proto::{Mux, Request};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{lock, Context, Interpreters, Kernel, Language};
use crate::agent_client;
use crate::manager::InterpreterState;
use crate::snapshots::{SavedContext, Unsaved};

/// Inside the sandbox; the kernel runs as the default user, who can write there.
const STATE_DIR: &str = "/tmp/.corral-interpreter";
/// Pickling a large namespace takes a while; a kernel that takes longer is reported unsaved.
const SAVE_TIMEOUT: Duration = Duration::from_secs(120);

fn unsaved(name: &str, reason: impl Into<String>) -> Unsaved {
    Unsaved { name: name.into(), reason: reason.into() }
}

/// Sends a `save`/`load` request to a kernel and collects its messages until `end`.
async fn control(mux: &Mux, kernel: &mut Kernel, op: &str, path: &str) -> Result<Vec<Value>, String> {
    let id = format!("corral-{op}-{}", crate::auth::generate_key().get(4..16).unwrap_or_default());
    let line = format!("{}\n", json!({ "id": id, "op": op, "path": path }));
    agent_client::request(mux, &Request::SendStdin { pid: kernel.pid, data: line }).await.map_err(|e| e.message)?;
    let mut messages = Vec::new();
    let deadline = tokio::time::Instant::now() + SAVE_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, kernel.lines.recv()).await {
            Err(_) => return Err("the kernel did not answer in time".into()),
            Ok(None) => return Err("the kernel exited".into()),
            Ok(Some(message)) if message.get("id").and_then(Value::as_str) == Some(id.as_str()) => {
                if message.get("type").and_then(Value::as_str) == Some("end") {
                    return Ok(messages);
                }
                messages.push(message);
            }
            Ok(Some(_)) => {}
        }
    }
}

fn failures(message: &Value) -> Vec<Unsaved> {
    message["failed"]
        .as_array()
        .map(|list| list.iter().map(|f| unsaved(f["name"].as_str().unwrap_or("?"), f["reason"].as_str().unwrap_or(""))).collect())
        .unwrap_or_default()
}

async fn save_context(mux: &Mux, context: &Arc<Context>) -> SavedContext {
    let mut saved = SavedContext {
        id: context.info.id.clone(),
        language: context.info.language.clone(),
        cwd: context.info.cwd.clone(),
        env: context.env.clone(),
        state_file: None,
        pickler: None,
        saved: Vec::new(),
        unsaved: Vec::new(),
    };
    let pending = lock(&context.restore).clone();
    let Ok(mut guard) = context.kernel.clone().try_lock_owned() else {
        saved.unsaved.push(unsaved("*", "a cell was running; its context's variables were not saved"));
        return saved;
    };
    let Some(kernel) = guard.as_mut() else {
        // Never used since it was restored: its state is still the file it came with.
        saved.state_file = pending;
        return saved;
    };
    if context.language == Language::JavaScript {
        saved.unsaved.push(unsaved("*", "JavaScript contexts keep their settings only, not their variables"));
        return saved;
    }
    let path = format!("{STATE_DIR}/{}.pickle", context.info.id);
    match control(mux, kernel, "save", &path).await {
        Ok(messages) => {
            for message in messages {
                match message["type"].as_str() {
                    Some("saved") => {
                        saved.state_file = Some(path.clone());
                        saved.pickler = message["pickler"].as_str().map(String::from);
                        saved.saved = message["saved"].as_array().map(|l| l.iter().filter_map(|v| v.as_str().map(String::from)).collect()).unwrap_or_default();
                        saved.unsaved.extend(failures(&message));
                    }
                    Some("error") => saved.unsaved.push(unsaved("*", format!("saving failed: {}", message["value"].as_str().unwrap_or("")))),
                    _ => {}
                }
            }
        }
        Err(why) => saved.unsaved.push(unsaved("*", why)),
    }
    saved
}

/// Loads a pickled namespace into a fresh kernel; what could not be loaded is told on the
/// first cell's stderr.
pub(super) async fn load(mux: &Mux, kernel: &mut Kernel, path: &str, tx: &mpsc::Sender<Value>) {
    let problems: Vec<String> = match control(mux, kernel, "load", path).await {
        Ok(messages) => messages
            .iter()
            .flat_map(|m| match m["type"].as_str() {
                Some("loaded") => failures(m).into_iter().map(|f| format!("{}: {}", f.name, f.reason)).collect(),
                Some("error") => vec![m["value"].as_str().unwrap_or("").to_string()],
                _ => Vec::new(),
            })
            .collect(),
        Err(why) => vec![why],
    };
    if !problems.is_empty() {
        let text = format!("corral: some variables of the snapshot could not be restored: {}\n", problems.join("; "));
        let _ = tx.send(json!({ "type": "stderr", "text": text })).await;
    }
}

impl InterpreterState for Interpreters {
    fn save<'a>(&'a self, sandbox_id: &'a str, mux: Mux) -> BoxFuture<'a, Vec<SavedContext>> {
        Box::pin(async move {
            let contexts: Vec<Arc<Context>> = lock(&self.sandboxes).get(sandbox_id).map(|c| c.values().cloned().collect()).unwrap_or_default();
            let mut out = Vec::new();
            for context in contexts {
                out.push(save_context(&mux, &context).await);
            }
            out
        })
    }

    fn adopt(&self, sandbox_id: &str, contexts: &[SavedContext]) {
        self.forget(sandbox_id);
        self.with_contexts(sandbox_id, |registry| {
            for saved in contexts {
                let Ok(language) = Language::parse(Some(&saved.language)) else { continue };
                let context = Context::new(saved.id.clone(), language, saved.cwd.clone(), saved.env.clone());
                *lock(&context.restore) = saved.state_file.clone();
                context.pid.store(0, Ordering::SeqCst);
                registry.insert(saved.id.clone(), Arc::new(context));
            }
        });
    }

    fn forget(&self, sandbox_id: &str) {
        Interpreters::forget(self, sandbox_id);
    }
}
