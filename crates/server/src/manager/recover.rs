//! Picking up where an earlier daemon process left off: sandboxes keep running while the
//! daemon is down (stopped, restarted or crashed) and are re-attached on start.

use corral_jail::ID_RANGE;

use super::{jail_config, lock, remove_dir, Live, Manager, FIRST_HOST_ID};
use crate::db::State;
use crate::time::now_ms;
use crate::ServerError;

impl Manager {
    /// Re-attaches every sandbox an earlier daemon process left running (after a restart or a
    /// crash); those that died meanwhile are recorded as exited and their leftovers released.
    pub(super) async fn recover_previous_run(&self) -> Result<(), ServerError> {
        for row in self.db.unfinished().await? {
            let run_dir = self.sandboxes_dir.join(&row.id);
            let config = jail_config(&row, run_dir.clone());
            let slot = row.host_id_base.saturating_sub(FIRST_HOST_ID) / ID_RANGE;
            let backend = self.backend.clone();
            let host_pid = row.host_pid;
            if row.state == State::Paused && row.hibernated.is_some() {
                // Its processes were released on purpose; it lives on in its snapshot.
                continue;
            }
            let recovered = if row.state == State::Running || row.state == State::Paused {
                let config = config.clone();
                tokio::task::spawn_blocking(move || backend.recover(&config, host_pid)).await.ok().and_then(Result::ok)
            } else {
                None
            };
            match recovered {
                Some(sandbox) => {
                    let egress = self.egress.for_recovered_sandbox(&row).await;
                    let live = Live::new(row.id.clone(), sandbox, slot, run_dir, egress, row.state == State::Paused);
                    // The previous run may have died between freezing and recording it (or
                    // the reverse): the database says what the sandbox should be.
                    if let Err(err) = self.converge_frozen(&live, row.state == State::Paused).await {
                        tracing::warn!(id = %row.id, %err, "could not restore the paused state of a re-attached sandbox");
                    }
                    lock(&self.slots).insert(slot);
                    lock(&self.live).insert(row.id.clone(), live.clone());
                    // A frozen agent cannot answer; its connection is made on resume.
                    let probe = if row.state == State::Paused { Ok(()) } else { live.agent().await.map(|_| ()) };
                    match probe {
                        Ok(()) => tracing::info!(id = %row.id, "re-attached a sandbox from the previous daemon run"),
                        Err(err) => {
                            tracing::warn!(id = %row.id, %err, "re-attached sandbox does not answer; killing it");
                            if let Err(err) = self.release(live, State::Exited, "agent_lost").await {
                                tracing::error!(id = %row.id, %err, "could not release a lost sandbox");
                            }
                        }
                    }
                }
                None => {
                    tracing::warn!(id = %row.id, "sandbox ended while the daemon was down");
                    let backend = self.backend.clone();
                    let _ = tokio::task::spawn_blocking(move || backend.cleanup(&config)).await;
                    remove_dir(self.sandboxes_dir.join(&row.id)).await;
                    self.db.mark_ended(&row.id, State::Exited, "ended_while_daemon_down", now_ms()).await?;
                }
            }
        }
        Ok(())
    }
}
