//! Paces what the loop sends again after the coordinator failed it (usage records kept while it
//! was away, a replica's staging report, log chunks, progress): once a request fails the
//! others wait with it, on one exponential backoff with full jitter (`api::backoff`) that takes
//! the coordinator's `Retry-After` as its floor, instead of each asking again every tick. A
//! restarted coordinator is then met by its agents spread over the backoff window.

use std::time::Duration;

use api::backoff::Backoff;
use tokio::time::Instant;

use crate::client::ClientError;

pub(super) struct Pacer {
    backoff: Backoff,
    next_try: Option<Instant>,
}

impl Pacer {
    /// `seed` differs per node, so nodes that failed together ask again apart.
    pub(super) fn new(seed: u64) -> Pacer {
        Pacer {
            backoff: Backoff::agent(api::backoff::seed_from_clock(seed)),
            next_try: None,
        }
    }

    /// Whether the loop may send now: nothing failed, or the wait since has passed.
    pub(super) fn ready(&self) -> bool {
        self.next_try.is_none_or(|at| Instant::now() >= at)
    }

    /// Counts a failure worth trying again (unreachable, 429, 5xx) and returns the wait before
    /// the next try; `None` for a refusal that asking again would not change.
    pub(super) fn failed(&mut self, error: &ClientError) -> Option<Duration> {
        if !error.is_transient() {
            return None;
        }
        let wait = self.backoff.failed(error.retry_after());
        self.next_try = Some(Instant::now() + wait);
        Some(wait)
    }

    /// The coordinator answered: sending goes on at once.
    pub(super) fn succeeded(&mut self) {
        self.backoff.succeeded();
        self.next_try = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_transient_failure_holds_sending_back_and_a_refusal_does_not() {
        let mut pacer = Pacer::new(1);
        assert!(pacer.ready());
        let refused = ClientError::Refused {
            status: 400,
            message: "bad".into(),
            retry_after: None,
        };
        assert_eq!(pacer.failed(&refused), None);
        assert!(pacer.ready());
        let busy = ClientError::Refused {
            status: 429,
            message: "slow down".into(),
            retry_after: Some(Duration::from_secs(1)),
        };
        let wait = pacer.failed(&busy).expect("a 429 is tried again");
        assert!(wait >= Duration::from_secs(1), "Retry-After is the floor: {wait:?}");
        assert!(!pacer.ready());
        pacer.succeeded();
        assert!(pacer.ready());
        let away = ClientError::Unreachable("connection refused".into());
        assert!(pacer.failed(&away).expect("unreachable is tried again") <= Duration::from_millis(500));
    }
}
