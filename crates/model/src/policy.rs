//! What a provider allows and asks: prices per tier with a time-of-day schedule, availability
//! windows, allowed tiers and workload classes, and the limits the agent enforces.

use crate::job::{Tier, WorkloadClass};
use crate::money::Micros;
use crate::time::{self, Timestamp};

/// A set of tiers as a bit mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TierSet(pub u8);

impl TierSet {
    pub const ALL: TierSet = TierSet(0b111);
    pub fn contains(self, tier: Tier) -> bool {
        self.0 & (1 << tier as u8) != 0
    }
    pub fn of(tiers: &[Tier]) -> TierSet {
        TierSet(tiers.iter().fold(0, |mask, tier| mask | (1 << *tier as u8)))
    }
}

/// A set of workload classes as a bit mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClassSet(pub u8);

impl ClassSet {
    pub const ALL: ClassSet = ClassSet(0b1111);
    pub fn contains(self, class: WorkloadClass) -> bool {
        self.0 & (1 << class as u8) != 0
    }
    pub fn of(classes: &[WorkloadClass]) -> ClassSet {
        ClassSet(classes.iter().fold(0, |mask, class| mask | (1 << *class as u8)))
    }
}

/// A slot of the week where the ask is scaled, e.g. weekday peak hours at 1.3×.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriceRule {
    /// Days the rule applies on, bit 0 = Monday … bit 6 = Sunday.
    pub days: u8,
    /// Minutes of the day, `start_minute..end_minute` (end ≤ 1440).
    pub start_minute: u32,
    pub end_minute: u32,
    /// The ask in this slot is the base ask × this / 1000.
    pub multiplier_permille: u32,
}

/// When a provider sells. Windows may chain (an evening window followed by the next morning's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AvailabilityWindow {
    /// One interval, `start..end`.
    Once { start: Timestamp, end: Timestamp },
    /// Every week on `days` (bit 0 = Monday), minutes `start_minute..end_minute` of the day.
    Weekly {
        days: u8,
        start_minute: u32,
        end_minute: u32,
    },
}

impl AvailabilityWindow {
    /// If `at` falls inside this window, the end of the window's interval that contains it.
    fn end_if_contains(&self, at: Timestamp) -> Option<Timestamp> {
        match *self {
            AvailabilityWindow::Once { start, end } => (start <= at && at < end).then_some(end),
            AvailabilityWindow::Weekly {
                days,
                start_minute,
                end_minute,
            } => {
                let on_day = days & (1 << time::weekday(at)) != 0;
                let minute = time::minute_of_day(at);
                (on_day && start_minute <= minute && minute < end_minute)
                    .then(|| time::day_start(at) + i64::from(end_minute) * 60)
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderPolicy {
    /// Base ask per GPU-hour for gold, silver, bronze; `None` where the tier is not sold.
    pub asks: [Option<Micros>; 3],
    /// Time-of-day scaling of the base asks; the first matching rule applies.
    pub price_rules: Vec<PriceRule>,
    /// Empty means always available.
    pub windows: Vec<AvailabilityWindow>,
    pub allowed_tiers: TierSet,
    pub allowed_classes: ClassSet,
    pub thermal_limit_c: Option<u16>,
    pub power_limit_w: Option<u32>,
}

/// How far `available_until` follows chained windows before it stops looking (a week of hourly windows).
pub const WINDOW_CHAIN_MAX: usize = 7 * 24;

impl ProviderPolicy {
    /// One ask for every tier, always available, everything allowed.
    pub fn flat(ask: Micros) -> ProviderPolicy {
        ProviderPolicy {
            asks: [Some(ask); 3],
            price_rules: Vec::new(),
            windows: Vec::new(),
            allowed_tiers: TierSet::ALL,
            allowed_classes: ClassSet::ALL,
            thermal_limit_c: None,
            power_limit_w: None,
        }
    }

    /// The ask per GPU-hour for `tier` at `at`, or `None` if the tier is not sold.
    pub fn ask_at(&self, tier: Tier, at: Timestamp) -> Option<Micros> {
        let base = self.asks[tier as usize]?;
        if !self.allowed_tiers.contains(tier) {
            return None;
        }
        match self.multiplier_at(at) {
            Some(multiplier_permille) => base.scale(u64::from(multiplier_permille), 1000),
            None => Some(base),
        }
    }

    /// The multiplier of the price rule in force at `at`, if one is.
    pub fn multiplier_at(&self, at: Timestamp) -> Option<u32> {
        let weekday = time::weekday(at);
        let minute = time::minute_of_day(at);
        self.price_rules
            .iter()
            .find(|rule| rule.days & (1 << weekday) != 0 && rule.start_minute <= minute && minute < rule.end_minute)
            .map(|rule| rule.multiplier_permille)
    }

    /// The end of the availability that contains `at`, following chained windows; `None` if the
    /// node is not available at `at`; `Timestamp::MAX` if always available.
    pub fn available_until(&self, at: Timestamp) -> Option<Timestamp> {
        if self.windows.is_empty() {
            return Some(Timestamp::MAX);
        }
        let mut end = at;
        for _ in 0..WINDOW_CHAIN_MAX {
            match self
                .windows
                .iter()
                .filter_map(|window| window.end_if_contains(end))
                .max()
            {
                Some(next_end) if next_end > end => end = next_end,
                _ => break,
            }
        }
        (end > at).then_some(end)
    }

    /// Seconds of availability from `at` (0 if unavailable), saturating.
    pub fn available_seconds(&self, at: Timestamp) -> i64 {
        self.available_until(at).map_or(0, |end| end.saturating_sub(at))
    }
}

/// A weekly window every day from `start_hour` to `end_hour` (end may be 24).
pub fn daily_window(start_hour: u32, end_hour: u32) -> AvailabilityWindow {
    AvailabilityWindow::Weekly {
        days: 0x7f,
        start_minute: start_hour * 60,
        end_minute: end_hour * 60,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::SECONDS_PER_DAY;

    const MONDAY: Timestamp = 4 * SECONDS_PER_DAY; // 1970-01-05, a Monday

    #[test]
    fn peak_rule_scales_the_ask() {
        let mut policy = ProviderPolicy::flat(Micros(2_000_000));
        policy.price_rules.push(PriceRule {
            days: 0b11111,
            start_minute: 9 * 60,
            end_minute: 17 * 60,
            multiplier_permille: 1300,
        });
        assert_eq!(policy.ask_at(Tier::Silver, MONDAY + 10 * 3600), Some(Micros(2_600_000)));
        assert_eq!(policy.ask_at(Tier::Silver, MONDAY + 20 * 3600), Some(Micros(2_000_000)));
        // Saturday is off-peak.
        assert_eq!(
            policy.ask_at(Tier::Silver, MONDAY + 5 * SECONDS_PER_DAY + 10 * 3600),
            Some(Micros(2_000_000))
        );
        policy.allowed_tiers = TierSet::of(&[Tier::Gold, Tier::Silver]);
        assert_eq!(policy.ask_at(Tier::Bronze, MONDAY), None);
    }

    #[test]
    fn windows_chain_over_midnight() {
        let mut policy = ProviderPolicy::flat(Micros(1));
        policy.windows = vec![daily_window(18, 24), daily_window(0, 8)];
        assert_eq!(policy.available_until(MONDAY + 12 * 3600), None);
        // Monday 20:00 → Tuesday 08:00, through the Monday 18–24 and Tuesday 0–8 windows.
        assert_eq!(
            policy.available_until(MONDAY + 20 * 3600),
            Some(MONDAY + SECONDS_PER_DAY + 8 * 3600)
        );
        assert_eq!(policy.available_seconds(MONDAY + 20 * 3600), 12 * 3600);
        policy.windows = vec![AvailabilityWindow::Once { start: 100, end: 200 }];
        assert_eq!(policy.available_until(150), Some(200));
        assert_eq!(policy.available_until(200), None);
        policy.windows.clear();
        assert_eq!(policy.available_until(5), Some(Timestamp::MAX));
    }
}
