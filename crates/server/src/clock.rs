//! The coordinator's clock. Every time the coordinator stamps or decides on comes from the
//! `Clock` in its `AppState`: wall time is read in one place, `system_now_us`, and a test runs
//! the leader's decisions on a `ManualClock` that moves only when told.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where the coordinator's time comes from, in microseconds since 1970.
pub trait Clock: Send + Sync {
    fn now_us(&self) -> i64;
}

/// The system's clock (what a running coordinator uses).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> i64 {
        system_now_us()
    }
}

/// A clock that stands still until a test sets or advances it.
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(at_us: i64) -> ManualClock {
        ManualClock(AtomicI64::new(at_us))
    }

    /// Moves the clock forward by `by_us` (never back).
    pub fn advance(&self, by_us: i64) {
        self.0.fetch_add(by_us.max(0), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// How far the system clock runs ahead of the system's: zero but in a test that runs real
/// replicas and agents over hours of grace periods and timeouts in seconds (one per process,
/// shared by every replica in it, as one machine's clock is).
static CLOCK_AHEAD_US: AtomicI64 = AtomicI64::new(0);

/// Moves the system clock forward by `by_us` (tests only: see `CLOCK_AHEAD_US`).
#[doc(hidden)]
pub fn advance_clock_for_tests(by_us: i64) {
    CLOCK_AHEAD_US.fetch_add(by_us.max(0), Ordering::SeqCst);
}

/// Wall time, in microseconds since 1970: the one place the coordinator reads it.
pub fn system_now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_micros() as i64)
        + CLOCK_AHEAD_US.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_forward_and_only_when_told() {
        let clock = ManualClock::new(1_000);
        assert_eq!(clock.now_us(), 1_000);
        clock.advance(500);
        assert_eq!(clock.now_us(), 1_500);
        clock.advance(-10_000);
        assert_eq!(clock.now_us(), 1_500);
    }

    #[test]
    fn the_system_clock_reads_wall_time() {
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64;
        let read = SystemClock.now_us();
        assert!(read >= before, "{read} < {before}");
    }
}
