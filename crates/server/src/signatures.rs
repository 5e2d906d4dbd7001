//! Agents' request signatures, verified in batches on a thread of their own.
//!
//! A fleet of 125,000 nodes sends 12,500 signed heartbeats a second, and checking each alone
//! (`verify_strict`, about 45 µs on this project's 2-core machine) took a fifth of the
//! coordinator's CPU. Requests hand their prepared checks to this thread, which takes every
//! check waiting (up to `BATCH_MAX`) and verifies them together (`trust::verify_checks`): under
//! load the batches grow and each signature costs about half; when quiet, a batch is the one
//! request that came, so nothing waits for company. When the queue is full, the request
//! verifies its own signature where it is.

use std::sync::mpsc;

use tokio::sync::oneshot;

/// The most signatures verified in one batch.
const BATCH_MAX: usize = 256;
/// Checks waiting for the thread before requests verify their own.
const QUEUE_MAX: usize = 16_384;

type Waiting = (trust::SignatureCheck, oneshot::Sender<bool>);

pub struct Signatures {
    queue: mpsc::SyncSender<Waiting>,
}

impl Signatures {
    /// Starts the verifying thread; it ends when this is dropped.
    pub fn start() -> Signatures {
        let (queue, waiting) = mpsc::sync_channel::<Waiting>(QUEUE_MAX);
        std::thread::Builder::new()
            .name("fallow-signatures".into())
            .spawn(move || verify_batches(&waiting))
            .expect("starting the signature thread");
        Signatures { queue }
    }

    /// Whether the signature is good.
    pub async fn verify(&self, check: trust::SignatureCheck) -> bool {
        let (answer, verdict) = oneshot::channel();
        match self.queue.try_send((check, answer)) {
            Ok(()) => verdict.await.unwrap_or(false),
            Err(mpsc::TrySendError::Full((check, _)) | mpsc::TrySendError::Disconnected((check, _))) => {
                check.verify().is_ok()
            }
        }
    }
}

fn verify_batches(waiting: &mpsc::Receiver<Waiting>) {
    let mut batch: Vec<Waiting> = Vec::with_capacity(BATCH_MAX);
    while let Ok(first) = waiting.recv() {
        batch.push(first);
        while batch.len() < BATCH_MAX
            && let Ok(next) = waiting.try_recv()
        {
            batch.push(next);
        }
        let checks: Vec<trust::SignatureCheck> = batch.iter().map(|(check, _)| check.clone()).collect();
        let verdicts = trust::verify_checks(&checks);
        for ((_, answer), good) in batch.drain(..).zip(verdicts) {
            // The request may have gone (its client hung up): nothing to tell.
            let _ = answer.send(good);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: &trust::NodeKey, node_id: i64, body: &[u8], seen: &[u8]) -> trust::SignatureCheck {
        let now_ms = 1_700_000_000_000;
        let headers = key.sign_request_now(node_id, "POST", "/v1/agent/heartbeat", body, now_ms);
        trust::prepare_request(
            &key.verifying_key(),
            node_id,
            "POST",
            "/v1/agent/heartbeat",
            seen,
            &headers,
            now_ms,
            trust::DEFAULT_MAX_SKEW_MS,
        )
        .expect("well-formed")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_requests_each_learn_their_own_verdict() {
        let signatures = std::sync::Arc::new(Signatures::start());
        let mut requests = tokio::task::JoinSet::new();
        for index in 0..500i64 {
            let signatures = signatures.clone();
            requests.spawn(async move {
                let key = trust::NodeKey::generate();
                let body = format!("{{\"beat\": {index}}}").into_bytes();
                let bad = index % 7 == 3;
                let seen = if bad { b"{}".to_vec() } else { body.clone() };
                (bad, signatures.verify(check(&key, index + 1, &body, &seen)).await)
            });
        }
        let mut bad_refused = 0;
        while let Some(joined) = requests.join_next().await {
            let (bad, good) = joined.expect("request");
            assert_eq!(good, !bad, "a bad signature is refused and a good one accepted");
            bad_refused += usize::from(bad);
        }
        assert_eq!(bad_refused, 71);
    }
}
