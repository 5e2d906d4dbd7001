//! The task that writes the heartbeat book (`beats`) to the store: due rows every second, an
//! urgent one at once, and everything not yet written when the replica stops.

use std::sync::Arc;
use std::time::Duration;

use crate::state::AppState;

/// How often the batch of due heartbeats is written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Rows per flush transaction: the writers' turn passes between them, so a submission waits
/// for one of these at most, not for the whole flush.
const FLUSH_ROWS_MAX: usize = 512;

/// Writes due heartbeats every `FLUSH_EVERY`, or at once for an urgent one, until `shutdown`
/// turns true; then writes every heartbeat its row does not have yet.
pub async fn run(state: Arc<AppState>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        let stopping = *shutdown.borrow();
        if stopping {
            state.beats.all_due();
        }
        flush(&state).await;
        if stopping {
            return;
        }
        tokio::select! {
            () = state.beats.urgent.notified() => {}
            () = tokio::time::sleep(FLUSH_EVERY) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Writes every heartbeat due now; a failed batch stays due for the next flush.
pub async fn flush(state: &AppState) {
    loop {
        let due = state.beats.take_due(FLUSH_ROWS_MAX);
        if due.is_empty() {
            return;
        }
        let result = {
            let _turn = state.writer_turn().await;
            state.store.record_heartbeats(&due).await
        };
        let full = due.len() == FLUSH_ROWS_MAX;
        state.beats.written(&due, result.is_ok());
        if let Err(error) = result {
            tracing::warn!(%error, rows = due.len(), "could not write heartbeats; retrying");
            return;
        }
        if !full {
            return;
        }
    }
}
