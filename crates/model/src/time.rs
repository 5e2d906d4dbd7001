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

/// Microseconds since 1970 as `2026-12-01 13:45:07 UTC`.
pub fn utc(at_us: i64) -> String {
    const DAY_US: i64 = 86_400_000_000;
    let (year, month, day) = civil_from_days(at_us.div_euclid(DAY_US));
    let seconds = at_us.rem_euclid(DAY_US) / 1_000_000;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// The civil date (year, month 1–12, day 1–31) of a day counted from 1970-01-01, in the
/// proleptic Gregorian calendar (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

/// Days from 1970-01-01 to a civil date (Howard Hinnant's `days_from_civil`).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
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

    #[test]
    fn civil_dates_round_trip() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        for days in (-800_000..800_000).step_by(997) {
            let (year, month, day) = civil_from_days(days);
            assert_eq!(days_from_civil(year, month, day), days);
        }
    }
}
