//! How the coordinator's clients wait between tries: exponential backoff with full jitter and a
//! ceiling (AWS's "Exponential Backoff and Jitter"), with the coordinator's `Retry-After` as a
//! floor. A coordinator that restarts is met by its agents spread over the backoff window, not
//! all in the same second: every client draws its wait at random from `[0, cap]`, where the cap
//! doubles with each failure up to the ceiling.

use std::time::Duration;

/// The longest `Retry-After` a client honours; a larger one is read as this.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(300);

/// Waits between tries of one request loop. `failed` says how long to wait before the next try,
/// `succeeded` starts over.
#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    ceiling: Duration,
    failures: u32,
    random: u64,
}

impl Backoff {
    /// The cap starts at `first` and doubles per failure up to `ceiling`; `seed` makes the
    /// jitter differ between clients (use [`seed_from_clock`] with something of the client's own).
    pub fn new(first: Duration, ceiling: Duration, seed: u64) -> Backoff {
        Backoff {
            first: first.max(Duration::from_millis(1)),
            ceiling: ceiling.max(first),
            failures: 0,
            random: seed ^ 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// The agent's loops: 0.5 s doubling to 30 s, so 10,000 agents that lost the coordinator
    /// together come back spread over up to 30 s.
    pub fn agent(seed: u64) -> Backoff {
        Backoff::new(Duration::from_millis(500), Duration::from_secs(30), seed)
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The most the next wait can be: `first · 2^failures`, at most the ceiling.
    pub fn cap(&self) -> Duration {
        let doublings = self.failures.min(31);
        self.first
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.ceiling)
            .min(self.ceiling)
    }

    /// Counts a failure and says how long to wait before the next try: a uniform draw from
    /// `[0, cap]` (full jitter), never less than the coordinator's `retry_after` (at most
    /// `RETRY_AFTER_MAX`), which itself gets jitter on top so that clients told the same
    /// second do not all come back in it.
    pub fn failed(&mut self, retry_after: Option<Duration>) -> Duration {
        let cap = self.cap();
        self.failures = self.failures.saturating_add(1);
        let drawn = self.draw(cap);
        match retry_after {
            Some(floor) => floor.min(RETRY_AFTER_MAX) + drawn.min(floor.max(self.first)),
            None => drawn,
        }
    }

    /// A try went through: the next failure starts from `first` again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    fn draw(&mut self, cap: Duration) -> Duration {
        // splitmix64: small, good enough to spread clients, no dependency.
        self.random = self.random.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.random;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let cap_ns = cap.as_nanos().min(u128::from(u64::MAX)) as u64;
        Duration::from_nanos(((u128::from(z) * (u128::from(cap_ns) + 1)) >> 64) as u64)
    }
}

/// A `Retry-After` header's value in delay-seconds (RFC 9110 §10.2.3). The HTTP-date form is not
/// read: the coordinator never sends it, and a client's clock may be wrong.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A seed that differs between processes and machines: the clock's nanoseconds mixed with
/// `salt` (a node id, a process id).
pub fn seed_from_clock(salt: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64);
    nanos ^ salt.rotate_left(32) ^ u64::from(std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_doubles_to_the_ceiling_and_a_success_starts_over() {
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30), 7);
        let mut caps = Vec::new();
        for _ in 0..10 {
            caps.push(backoff.cap().as_millis());
            let wait = backoff.failed(None);
            assert!(wait <= Duration::from_millis(*caps.last().unwrap() as u64));
        }
        assert_eq!(caps, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000]);
        backoff.succeeded();
        assert_eq!(backoff.cap(), Duration::from_millis(500));
        assert_eq!(backoff.failures(), 0);
    }

    #[test]
    fn retry_after_is_a_floor_with_jitter_above_it_and_a_ceiling() {
        let mut backoff = Backoff::agent(3);
        let waits: Vec<Duration> = (0..200).map(|_| backoff.failed(Some(Duration::from_secs(2)))).collect();
        assert!(
            waits
                .iter()
                .all(|wait| *wait >= Duration::from_secs(2) && *wait <= Duration::from_secs(4))
        );
        assert!(
            waits.iter().any(|wait| *wait > Duration::from_millis(2500)),
            "jitter spreads them"
        );
        let huge = Backoff::agent(3).failed(Some(Duration::from_secs(86_400)));
        assert!(huge <= RETRY_AFTER_MAX * 2);
    }

    #[test]
    fn retry_after_headers_are_read_in_seconds_and_dates_are_not() {
        assert_eq!(parse_retry_after("1"), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn two_seeds_draw_different_waits() {
        let mut one = Backoff::agent(1);
        let mut two = Backoff::agent(2);
        let a: Vec<Duration> = (0..5).map(|_| one.failed(None)).collect();
        let b: Vec<Duration> = (0..5).map(|_| two.failed(None)).collect();
        assert_ne!(a, b);
    }

    /// 10,000 agents lose the coordinator at the same instant and each tries again on its own
    /// backoff until it is back. With the old fixed 1 s beat every agent arrived in the same
    /// second; with full jitter the busiest second holds a small share.
    #[test]
    fn a_crowd_that_lost_the_coordinator_together_returns_spread_out() {
        const AGENTS: u64 = 10_000;
        for (down_s, busiest_max) in [(5.0, 3_000), (20.0, 1_000), (120.0, 800)] {
            let mut arrivals = std::collections::BTreeMap::<u64, u32>::new();
            let mut latest = 0.0f64;
            for agent in 0..AGENTS {
                let mut backoff = Backoff::agent(agent.wrapping_mul(0x2545_f491_4f6c_dd1d));
                let mut at = 0.0f64;
                while at < down_s {
                    at += backoff.failed(None).as_secs_f64();
                }
                latest = latest.max(at);
                *arrivals.entry(at as u64).or_default() += 1;
            }
            let busiest = *arrivals.values().max().unwrap();
            eprintln!("down {down_s} s: busiest second {busiest} of {AGENTS}, last back at {latest:.1} s");
            assert!(
                busiest <= busiest_max,
                "down {down_s} s: {busiest} of {AGENTS} agents came back in one second"
            );
            assert!(
                latest <= down_s + 30.0,
                "down {down_s} s: the last came back at {latest} s"
            );
        }
    }
}
