//! Time as a value: seconds since the Unix epoch (UTC). Decision code receives `now`; it never reads a clock.

/// Seconds since 1970-01-01T00:00:00Z.
pub type Timestamp = i64;

pub const SECONDS_PER_HOUR: i64 = 3600;
pub const SECONDS_PER_DAY: i64 = 86_400;
pub const SECONDS_PER_WEEK: i64 = 7 * SECONDS_PER_DAY;

/// Day of the week, 0 = Monday … 6 = Sunday (1970-01-01 was a Thursday).
pub fn weekday(at: Timestamp) -> u8 {
    ((at.div_euclid(SECONDS_PER_DAY) + 3).rem_euclid(7)) as u8
}

/// Minute of the day, 0..1440.
pub fn minute_of_day(at: Timestamp) -> u32 {
    (at.rem_euclid(SECONDS_PER_DAY) / 60) as u32
}

/// Start of the day (00:00 UTC) that contains `at`.
pub fn day_start(at: Timestamp) -> Timestamp {
    at - at.rem_euclid(SECONDS_PER_DAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weekdays() {
        assert_eq!(weekday(0), 3); // Thursday
        assert_eq!(weekday(4 * SECONDS_PER_DAY), 0); // Monday 1970-01-05
        assert_eq!(weekday(-1), 2); // Wednesday 1969-12-31
        assert_eq!(minute_of_day(SECONDS_PER_DAY + 3 * 3600 + 61), 181);
    }
}
