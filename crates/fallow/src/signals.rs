//! Stopping on a signal: SIGTERM (what systemd, `docker stop` and the kubelet send) and SIGINT
//! (Ctrl-C) both start the same clean stop of `server`, `gateway`, `agent` and `dev`.

use anyhow::Context;

/// Waits for SIGTERM or SIGINT and returns its name.
pub async fn stop_requested() -> anyhow::Result<&'static str> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
        let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
        Ok(tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        })
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
        Ok("Ctrl-C")
    }
}
