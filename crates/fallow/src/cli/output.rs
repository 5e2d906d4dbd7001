//! What the CLI prints: aligned tables and `key: value` blocks for people, the API's JSON for
//! scripts, money and times in words, and a spinner on stderr while waiting (only on a terminal).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use model::Micros;
use serde_json::Value;

/// Whether a table column's cells line up on the left or on the right (numbers, money).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A table printed with its columns aligned, two spaces apart.
pub struct Table {
    headers: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[(&'static str, Align)]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.headers.len(), "a row has one cell per column");
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|(name, _)| name.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let headers: Vec<String> = self.headers.iter().map(|(name, _)| name.to_string()).collect();
        for row in std::iter::once(&headers).chain(&self.rows) {
            let mut line = String::new();
            for (column, cell) in row.iter().enumerate() {
                if column > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[column] - cell.chars().count());
                match self.headers[column].1 {
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&pad);
                    }
                    Align::Right => {
                        line.push_str(&pad);
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// `key: value` lines with the values aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(key, _)| key.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        let pad = " ".repeat(width - key.chars().count());
        out.push_str(format!("{key}:{pad} {value}").trim_end());
        out.push('\n');
    }
    out
}

pub fn print_fields(pairs: &[(&str, String)]) {
    print!("{}", fields(pairs));
}

/// The API's answer, pretty-printed, for `--json`.
pub fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("a JSON value serialises")
    );
}

/// `$2.10`, or `$2.104500` where cents do not say it all.
pub fn dollars(micros: i64) -> String {
    Micros(micros).to_string()
}

/// A time in microseconds since the Unix epoch as `2026-11-29 14:03:07Z` (UTC).
pub fn utc(at_us: i64) -> String {
    let seconds = at_us.div_euclid(1_000_000);
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    let of_day = seconds.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

pub fn utc_or_dash(at_us: Option<i64>) -> String {
    at_us.map_or_else(|| "-".to_string(), utc)
}

/// Now, in microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_micros() as i64)
}

/// The current month in UTC, `YYYY-MM`.
pub fn this_month() -> String {
    let (year, month, _) = civil_from_days(now_us().div_euclid(86_400_000_000));
    format!("{year:04}-{month:02}")
}

pub use model::time::{civil_from_days, days_from_civil};

/// A duration as `1h02m`, `3m05s` or `42s`.
pub fn duration(elapsed: Duration) -> String {
    let seconds = elapsed.as_secs();
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h{:02}m", seconds / 3600, seconds / 60 % 60),
    }
}

/// A one-line spinner on stderr while the CLI waits; silent unless stderr is a terminal and
/// the output is for people.
pub struct Spinner {
    enabled: bool,
    frame: usize,
    started: Instant,
    drawn: bool,
}

const SPINNER_FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

impl Spinner {
    pub fn new(json: bool) -> Spinner {
        Spinner {
            enabled: !json && std::io::stderr().is_terminal(),
            frame: 0,
            started: Instant::now(),
            drawn: false,
        }
    }

    /// Draws the next frame with `message` and the time waited so far.
    pub fn tick(&mut self, message: &str) {
        if !self.enabled {
            return;
        }
        let frame = SPINNER_FRAMES[self.frame % SPINNER_FRAMES.len()];
        self.frame += 1;
        let mut stderr = std::io::stderr().lock();
        let _ = write!(
            stderr,
            "\r{frame} {message} ({})\x1b[K",
            duration(self.started.elapsed())
        );
        let _ = stderr.flush();
        self.drawn = true;
    }

    /// Clears the spinner's line.
    pub fn clear(&mut self) {
        if self.drawn {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[K");
            let _ = stderr.flush();
            self.drawn = false;
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_text_left_and_numbers_right() {
        let mut table = Table::new(&[("ID", Align::Right), ("NAME", Align::Left), ("PRICE", Align::Right)]);
        table.row(vec!["7".into(), "train-llama".into(), "$2.10".into()]);
        table.row(vec!["12".into(), "x".into(), "$10.00".into()]);
        assert_eq!(
            table.render(),
            "ID  NAME          PRICE\n 7  train-llama   $2.10\n12  x            $10.00\n"
        );
    }

    #[test]
    fn fields_align_their_values() {
        assert_eq!(
            fields(&[("id", "7".into()), ("state", "queued".into())]),
            "id:    7\nstate: queued\n"
        );
    }

    #[test]
    fn times_and_money_read_as_words() {
        assert_eq!(utc(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc(1_764_424_987_000_000), "2025-11-29 14:03:07Z");
        assert_eq!(dollars(2_100_000), "$2.10");
        assert_eq!(duration(Duration::from_secs(3725)), "1h02m");
        for days in [-800_000, -1, 0, 59, 60, 10_957, 20_000, 2_000_000] {
            let (year, month, day) = civil_from_days(days);
            assert_eq!(days_from_civil(year, month, day), days);
        }
    }
}
