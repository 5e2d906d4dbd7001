//! The dashboard's HTML pieces: escaping (every string that a tenant, a provider, a job or a
//! node chose goes through `escape` before it reaches a page), tables, and how money, times
//! and shares read.

use std::fmt::Write;

use model::Micros;
use model::time::civil_from_days;

/// `text` made safe as HTML element content and as a quoted attribute value.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(character),
        }
    }
    out
}

/// Micro-dollars as `$2.10` (whole cents) or `$0.001234`.
pub fn dollars(micros: i64) -> String {
    Micros(micros).to_string()
}

/// A price per GPU-hour: `$2.10/GPU-h`.
pub fn per_gpu_hour(micros: i64) -> String {
    format!("{}/GPU-h", dollars(micros))
}

/// GPU time (thousandths of a GPU × seconds) in units that keep it readable: `45 GPU-s`,
/// `12.5 GPU-min`, `3.25 GPU-h`.
pub fn gpu_time(gpu_milli_seconds: i64) -> String {
    let seconds = gpu_milli_seconds as f64 / 1000.0;
    if seconds < 60.0 {
        format!("{seconds:.1} GPU-s")
    } else if seconds < 3600.0 {
        format!("{:.1} GPU-min", seconds / 60.0)
    } else {
        format!("{:.2} GPU-h", seconds / 3600.0)
    }
}

/// A share (0–1) as a percentage with one decimal.
pub fn percent(share: f64) -> String {
    if share.is_finite() {
        format!("{:.1} %", share * 100.0)
    } else {
        "–".to_string()
    }
}

const DAY_US: i64 = 86_400_000_000;

pub use model::time::utc;

/// The time of day, `13:45` (or `12-01 13:45` when `with_date`), for chart axes.
pub fn clock(at_us: i64, with_date: bool) -> String {
    let (_, month, day) = civil_from_days(at_us.div_euclid(DAY_US));
    let minutes = at_us.rem_euclid(DAY_US) / 60_000_000;
    if with_date {
        format!("{month:02}-{day:02} {:02}:{:02}", minutes / 60, minutes % 60)
    } else {
        format!("{:02}:{:02}", minutes / 60, minutes % 60)
    }
}

/// A length of time in the largest units that keep it readable: `850 ms`, `12.5 s`, `4 min 10 s`,
/// `30 min`, `3 h 5 min`.
pub fn duration(us: i64) -> String {
    let us = us.max(0);
    match us {
        0..1_000_000 => format!("{} ms", us / 1000),
        1_000_000..60_000_000 => format!("{:.1} s", us as f64 / 1e6),
        60_000_000..3_600_000_000 if us % 60_000_000 < 1_000_000 => format!("{} min", us / 60_000_000),
        60_000_000..3_600_000_000 => format!("{} min {} s", us / 60_000_000, us / 1_000_000 % 60),
        _ if us % 3_600_000_000 < 60_000_000 => format!("{} h", us / 3_600_000_000),
        _ => format!("{} h {} min", us / 3_600_000_000, us / 60_000_000 % 60),
    }
}

/// A table: a header of plain words, and rows of cells that are already HTML (escape what goes
/// in them). An empty table says `empty` instead.
pub fn table(class: &str, head: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    if rows.is_empty() {
        return format!("<p class=\"empty\">{}</p>", escape(empty));
    }
    let mut out = format!("<table class=\"{class}\"><thead><tr>");
    for name in head {
        let _ = write!(out, "<th>{}</th>", escape(name));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            // Amounts, counts and times stay on one line.
            if cell.starts_with(|first: char| first == '$' || first.is_ascii_digit()) {
                let _ = write!(out, "<td class=\"nowrap\">{cell}</td>");
            } else {
                let _ = write!(out, "<td>{cell}</td>");
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A figure with a caption: a number that matters, and what it is.
pub fn stat(label: &str, value: &str) -> String {
    format!(
        "<div class=\"stat\"><div class=\"value\">{}</div><div class=\"label\">{}</div></div>",
        escape(value),
        escape(label)
    )
}

/// A small coloured label, e.g. a job's state or "simulated".
pub fn badge(kind: &str, text: &str) -> String {
    format!("<span class=\"badge {}\">{}</span>", escape(kind), escape(text))
}

/// The nearest-rank quantile `q` (0–1] of sorted values; None when there are none.
pub fn quantile(sorted: &[i64], q: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median of sorted values (the upper one of an even count, as the market index takes it).
pub fn median(sorted: &[i64]) -> Option<i64> {
    sorted.get(sorted.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_markup() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(escape("plain text, ünïcode"), "plain text, ünïcode");
    }

    #[test]
    fn times_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        // 2024-02-29 is day 19,782; 13:45:07 into it.
        let at = 19_782 * DAY_US + (13 * 3600 + 45 * 60 + 7) * 1_000_000 + 999_999;
        assert_eq!(utc(at), "2024-02-29 13:45:07 UTC");
        assert_eq!(clock(at, false), "13:45");
        assert_eq!(clock(at, true), "02-29 13:45");
        assert_eq!(utc(-1_000_000), "1969-12-31 23:59:59 UTC");
    }

    #[test]
    fn durations_pick_readable_units() {
        assert_eq!(duration(850_000), "850 ms");
        assert_eq!(duration(12_500_000), "12.5 s");
        assert_eq!(duration(250_000_000), "4 min 10 s");
        assert_eq!(duration(11_100_000_000), "3 h 5 min");
        assert_eq!(duration(-5), "0 ms");
        assert_eq!(duration(1_800_000_000), "30 min");
        assert_eq!(duration(7_200_000_000), "2 h");
    }

    #[test]
    fn gpu_time_picks_readable_units() {
        assert_eq!(gpu_time(1_500), "1.5 GPU-s");
        assert_eq!(gpu_time(750_000), "12.5 GPU-min");
        assert_eq!(gpu_time(11_700_000), "3.25 GPU-h");
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let values: Vec<i64> = (1..=100).collect();
        assert_eq!(quantile(&values, 0.95), Some(95));
        assert_eq!(quantile(&values, 1.0), Some(100));
        assert_eq!(quantile(&[7], 0.95), Some(7));
        assert_eq!(quantile(&[], 0.95), None);
        assert_eq!(median(&[1, 2, 3, 4]), Some(3));
    }

    #[test]
    fn tables_escape_their_head_and_say_when_empty() {
        assert_eq!(
            table("t", &["a<b"], &[], "no <rows>"),
            "<p class=\"empty\">no &lt;rows&gt;</p>"
        );
        let html = table("t", &["a<b"], &[vec!["<i>x</i>".into()]], "");
        assert!(
            html.contains("<th>a&lt;b</th>") && html.contains("<td><i>x</i></td>"),
            "{html}"
        );
    }
}
