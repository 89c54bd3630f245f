//! `strftime_now` for chat templates: the current UTC time formatted with the common subset of
//! C `strftime` directives that templates use (dates in system prompts).

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Civil date of a day count since 1970-01-01 (proleptic Gregorian): (year, month 1-12, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Format `secs` since the Unix epoch (UTC). Unknown directives are kept as written.
pub(crate) fn strftime(fmt: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (sod / 3600, sod / 60 % 60, sod % 60);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[weekday];
    let doy = days - days_from_civil(year) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('-') => match chars.next() {
                Some('d') => out.push_str(&day.to_string()),
                Some('m') => out.push_str(&month.to_string()),
                Some(other) => {
                    out.push_str("%-");
                    out.push(other);
                }
                None => out.push_str("%-"),
            },
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{hour12:02}")),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(day_name),
            Some('a') => out.push_str(&day_name[..3]),
            Some('j') => out.push_str(&format!("{doy:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 of January 1st of `year`.
fn days_from_civil(year: i64) -> i64 {
    let y = year - 1;
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    // March-based day of year of Jan 1 is 306.
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + 306;
    era * 146_097 + doe - 719_468
}

/// The current UTC time formatted with `fmt`.
pub(crate) fn strftime_now(fmt: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime(fmt, secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        // 2024-02-29T13:05:09Z, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %a %A %b %B %j %I%p %-d %y %%", t),
            "2024-02-29 13:05:09 Thu Thursday Feb February 060 01PM 29 24 %"
        );
        assert_eq!(strftime("%d %B %Y", 0), "01 January 1970");
        assert_eq!(strftime("%j", 86_400 * 364), "365");
    }
}
