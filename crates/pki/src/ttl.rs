//! TTLs for `expires-in` values such as `v1beta2.k8sd.io/refresh-certificates: 1y`.
//!
//! The grammar is Go's `time.ParseDuration` (`90m`, `1h30m`, `1.5h`, `300ms`) plus the
//! calendar units `y` (365 days), `mo` (30 days), `w` (7 days) and `d` (24 hours), in any
//! combination (`1y6mo`), with case-insensitive units. Unlike upstream, which accepts only
//! `<int><unit>` for y/mo/d and silently accepts negatives, zero, negative, empty,
//! overflowing and unknown-unit values are errors that name the value.
//!
//! A [`Ttl`] keeps whole years, months and days apart from the exact remainder so that
//! [`Ttl::expires_at`] can step the calendar the way upstream does (`1y` from 2025-03-01 is
//! 2026-03-01, not 365 days later in a leap year).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use time::{Date, Month, OffsetDateTime};

const NANOS_PER_MICRO: u128 = 1_000;
const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SECOND: u128 = 1_000_000_000;
const NANOS_PER_MINUTE: u128 = 60 * NANOS_PER_SECOND;
const NANOS_PER_HOUR: u128 = 60 * NANOS_PER_MINUTE;
const NANOS_PER_DAY: u128 = 24 * NANOS_PER_HOUR;
const NANOS_PER_WEEK: u128 = 7 * NANOS_PER_DAY;
const NANOS_PER_MONTH: u128 = 30 * NANOS_PER_DAY;
const NANOS_PER_YEAR: u128 = 365 * NANOS_PER_DAY;

/// The longest TTL accepted: Go's largest `time.Duration` (about 292 years), so that every
/// value caretaker accepts is also representable on the Go side of the fleet.
const MAX_NANOS: u128 = i64::MAX as u128;

/// What the error message lists as accepted.
pub const ACCEPTED_FORMS: &str = "expected a positive duration made of <number><unit> parts \
     such as 90m, 1h30m, 1.5h, 300ms, 30d, 2w, 6mo, 1y or 1y6mo \
     (units: ns, us, ms, s, m, h, d, w, mo, y; at most about 292 years)";

/// A positive time-to-live with calendar parts.
///
/// Weeks are stored as 7 calendar days. Fractional calendar values (`1.5d`) have no calendar
/// meaning and are stored as exact time (36h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ttl {
    years: u32,
    months: u32,
    days: u32,
    exact_nanos: u64,
}

/// Why a TTL was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid TTL {value:?}: {problem}; {ACCEPTED_FORMS}")]
pub struct TtlError {
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: TtlProblem,
}

/// The specific problem with a rejected TTL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TtlProblem {
    #[error("it is empty")]
    Empty,
    #[error("negative durations are not allowed")]
    Negative,
    #[error("it is zero")]
    Zero,
    #[error("expected a number at {0:?}")]
    MissingNumber(String),
    #[error("the number {0:?} has no unit")]
    MissingUnit(String),
    #[error("unknown unit {0:?}")]
    UnknownUnit(String),
    #[error("it is too long")]
    Overflow,
}

impl Ttl {
    /// A TTL of exactly `duration` (no calendar parts). Errors on zero or on more than
    /// about 292 years.
    pub fn from_duration(duration: Duration) -> Result<Self, TtlError> {
        let nanos = duration.as_nanos();
        let error = |problem| TtlError {
            value: format!("{duration:?}"),
            problem,
        };
        if nanos == 0 {
            return Err(error(TtlProblem::Zero));
        }
        if nanos > MAX_NANOS {
            return Err(error(TtlProblem::Overflow));
        }
        Ok(Self {
            years: 0,
            months: 0,
            days: 0,
            exact_nanos: nanos as u64,
        })
    }

    /// A TTL of whole calendar years, months and days.
    pub fn calendar(years: u32, months: u32, days: u32) -> Result<Self, TtlError> {
        Self::checked(years, months, days, 0).map_err(|problem| TtlError {
            value: format!("{years}y{months}mo{days}d"),
            problem,
        })
    }

    fn checked(years: u32, months: u32, days: u32, exact_nanos: u64) -> Result<Self, TtlProblem> {
        let ttl = Self {
            years,
            months,
            days,
            exact_nanos,
        };
        match ttl.approximate_nanos() {
            0 => Err(TtlProblem::Zero),
            n if n > MAX_NANOS => Err(TtlProblem::Overflow),
            _ => Ok(ttl),
        }
    }

    fn approximate_nanos(&self) -> u128 {
        self.years as u128 * NANOS_PER_YEAR
            + self.months as u128 * NANOS_PER_MONTH
            + self.days as u128 * NANOS_PER_DAY
            + self.exact_nanos as u128
    }

    /// Length with a year as 365 days and a month as 30 days, for comparisons and display.
    pub fn approximate(&self) -> Duration {
        let nanos = self.approximate_nanos();
        Duration::new(
            (nanos / NANOS_PER_SECOND) as u64,
            (nanos % NANOS_PER_SECOND) as u32,
        )
    }

    /// The expiry of something that starts at `start` and lives this long: whole years,
    /// months and days step the calendar (the day of month is clamped, so Jan 31 plus one
    /// month is the last day of February), then the exact remainder is added.
    ///
    /// Returns `None` past the year 9999.
    pub fn expires_at(&self, start: OffsetDateTime) -> Option<OffsetDateTime> {
        let date = add_months(start.date(), self.years as i64 * 12 + self.months as i64)?;
        let date = date.checked_add(time::Duration::days(self.days as i64))?;
        let stepped = start.replace_date(date);
        stepped.checked_add(time::Duration::nanoseconds(self.exact_nanos as i64))
    }
}

fn add_months(date: Date, months: i64) -> Option<Date> {
    let index = date.year() as i64 * 12 + (date.month() as i64 - 1) + months;
    let year = i32::try_from(index.div_euclid(12)).ok()?;
    let month = Month::try_from((index.rem_euclid(12) + 1) as u8).ok()?;
    let last_day = time::util::days_in_month(month, year);
    Date::from_calendar_date(year, month, date.day().min(last_day)).ok()
}

impl FromStr for Ttl {
    type Err = TtlError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        parse(value).map_err(|problem| TtlError {
            value: value.to_string(),
            problem,
        })
    }
}

/// The unit of one `<number><unit>` part.
#[derive(Clone, Copy)]
enum Unit {
    Exact(u128),
    Years,
    Months,
    Weeks,
    Days,
}

impl Unit {
    fn parse(unit: &str) -> Option<Self> {
        Some(match unit.to_lowercase().as_str() {
            "ns" => Unit::Exact(1),
            "us" | "µs" | "μs" => Unit::Exact(NANOS_PER_MICRO),
            "ms" => Unit::Exact(NANOS_PER_MILLI),
            "s" => Unit::Exact(NANOS_PER_SECOND),
            "m" => Unit::Exact(NANOS_PER_MINUTE),
            "h" => Unit::Exact(NANOS_PER_HOUR),
            "d" => Unit::Days,
            "w" => Unit::Weeks,
            "mo" => Unit::Months,
            "y" => Unit::Years,
            _ => return None,
        })
    }

    fn nanos(self) -> u128 {
        match self {
            Unit::Exact(n) => n,
            Unit::Years => NANOS_PER_YEAR,
            Unit::Months => NANOS_PER_MONTH,
            Unit::Weeks => NANOS_PER_WEEK,
            Unit::Days => NANOS_PER_DAY,
        }
    }
}

fn parse(value: &str) -> Result<Ttl, TtlProblem> {
    let text = value.trim();
    if text.is_empty() {
        return Err(TtlProblem::Empty);
    }
    let text = match text.as_bytes()[0] {
        b'-' => return Err(TtlProblem::Negative),
        b'+' => &text[1..],
        _ => text,
    };
    // Go accepts a bare "0"; it means no lifetime at all, which is never what a user wants.
    if text == "0" {
        return Err(TtlProblem::Zero);
    }

    let (mut years, mut months, mut days, mut exact) = (0u128, 0u128, 0u128, 0u128);
    let mut rest = text;
    while !rest.is_empty() {
        let (whole, fraction, after_number) = split_number(rest)?;
        let unit_len = after_number
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after_number.len());
        let (unit_text, after_unit) = after_number.split_at(unit_len);
        if unit_text.is_empty() {
            return Err(TtlProblem::MissingUnit(rest.to_string()));
        }
        let unit =
            Unit::parse(unit_text).ok_or_else(|| TtlProblem::UnknownUnit(unit_text.into()))?;

        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| TtlProblem::Overflow)?
        };
        let fraction_nanos = fraction_of(fraction, unit.nanos());
        if whole > MAX_NANOS {
            return Err(TtlProblem::Overflow);
        }
        match unit {
            Unit::Exact(n) => exact += whole * n + fraction_nanos,
            _ if fraction_nanos > 0 => exact += whole * unit.nanos() + fraction_nanos,
            Unit::Years => years += whole,
            Unit::Months => months += whole,
            Unit::Weeks => days += whole * 7,
            Unit::Days => days += whole,
        }
        let approximate =
            years * NANOS_PER_YEAR + months * NANOS_PER_MONTH + days * NANOS_PER_DAY + exact;
        if approximate > MAX_NANOS {
            return Err(TtlProblem::Overflow);
        }
        rest = after_unit;
    }
    // Every part fits below MAX_NANOS here, so these conversions cannot truncate.
    Ttl::checked(years as u32, months as u32, days as u32, exact as u64)
}

/// Splits `12.5h…` into ("12", "5", "h…"). At least one digit is required.
fn split_number(text: &str) -> Result<(&str, &str, &str), TtlProblem> {
    let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let whole_len = digits(text);
    let (whole, after) = text.split_at(whole_len);
    let (fraction, after) = match after.strip_prefix('.') {
        Some(tail) => tail.split_at(digits(tail)),
        None => ("", after),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(TtlProblem::MissingNumber(text.to_string()));
    }
    Ok((whole, fraction, after))
}

/// `0.<fraction>` of `unit` nanoseconds, truncated like Go does.
fn fraction_of(fraction: &str, unit: u128) -> u128 {
    let mut numerator = 0u128;
    let mut scale = 1u128;
    // Digits beyond nanosecond precision of the largest unit cannot change the result.
    for digit in fraction.bytes().take(18) {
        numerator = numerator * 10 + (digit - b'0') as u128;
        scale *= 10;
    }
    numerator * unit / scale
}

impl fmt::Display for Ttl {
    /// The canonical form, which parses back to the same value: `1y6mo`, `14d`, `1h30m`,
    /// `1s500ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (count, unit) in [(self.years, "y"), (self.months, "mo"), (self.days, "d")] {
            if count > 0 {
                parts.push(format!("{count}{unit}"));
            }
        }
        let mut nanos = self.exact_nanos as u128;
        for (size, unit) in [
            (NANOS_PER_HOUR, "h"),
            (NANOS_PER_MINUTE, "m"),
            (NANOS_PER_SECOND, "s"),
            (NANOS_PER_MILLI, "ms"),
            (NANOS_PER_MICRO, "us"),
            (1, "ns"),
        ] {
            if nanos >= size {
                parts.push(format!("{}{unit}", nanos / size));
                nanos %= size;
            }
        }
        f.write_str(&parts.concat())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use time::macros::datetime;

    fn ttl(s: &str) -> Ttl {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn problem(s: &str) -> TtlProblem {
        s.parse::<Ttl>().expect_err(s).problem
    }

    #[test]
    fn go_durations_parse_like_go() {
        assert_eq!(ttl("90m").approximate(), Duration::from_secs(90 * 60));
        assert_eq!(ttl("1h30m").approximate(), Duration::from_secs(90 * 60));
        assert_eq!(ttl("1.5h").approximate(), Duration::from_secs(90 * 60));
        assert_eq!(ttl("300ms").approximate(), Duration::from_millis(300));
        assert_eq!(ttl(".5s").approximate(), Duration::from_millis(500));
        assert_eq!(ttl("1.s").approximate(), Duration::from_secs(1));
        assert_eq!(ttl("+2h").approximate(), Duration::from_secs(7200));
        assert_eq!(ttl("1µs").approximate(), Duration::from_micros(1));
        assert_eq!(ttl("1μs2ns").approximate(), Duration::from_nanos(1002));
        assert_eq!(ttl("1h1h").approximate(), Duration::from_secs(7200));
    }

    #[test]
    fn calendar_units_and_compounds() {
        assert_eq!(ttl("1y"), Ttl::calendar(1, 0, 0).unwrap());
        assert_eq!(ttl("6mo"), Ttl::calendar(0, 6, 0).unwrap());
        assert_eq!(ttl("2w"), Ttl::calendar(0, 0, 14).unwrap());
        assert_eq!(ttl("30d"), Ttl::calendar(0, 0, 30).unwrap());
        assert_eq!(ttl("1y6mo"), Ttl::calendar(1, 6, 0).unwrap());
        assert_eq!(ttl("1y6mo").to_string(), "1y6mo");
        assert_eq!(ttl("1d12h").to_string(), "1d12h");
        assert_eq!(ttl("1.5d").to_string(), "36h");
    }

    #[test]
    fn units_are_case_insensitive_and_m_is_minutes() {
        assert_eq!(ttl("1Y"), ttl("1y"));
        assert_eq!(ttl("1MO"), ttl("1mo"));
        assert_eq!(ttl("5MS"), ttl("5ms"));
        assert_eq!(ttl("1M").approximate(), Duration::from_secs(60));
        assert_eq!(ttl("1H30M"), ttl("1h30m"));
    }

    #[test]
    fn rejects_bad_values_naming_them() {
        assert_eq!(problem(""), TtlProblem::Empty);
        assert_eq!(problem("   "), TtlProblem::Empty);
        assert_eq!(problem("-1y"), TtlProblem::Negative);
        assert_eq!(problem("-5m"), TtlProblem::Negative);
        assert_eq!(problem("0"), TtlProblem::Zero);
        assert_eq!(problem("0s"), TtlProblem::Zero);
        assert_eq!(problem("0y0d"), TtlProblem::Zero);
        assert_eq!(problem("10"), TtlProblem::MissingUnit("10".into()));
        assert_eq!(problem("1y5"), TtlProblem::MissingUnit("5".into()));
        assert_eq!(problem("1x"), TtlProblem::UnknownUnit("x".into()));
        assert_eq!(problem("1yr"), TtlProblem::UnknownUnit("yr".into()));
        assert_eq!(problem("1 y"), TtlProblem::UnknownUnit(" y".into()));
        assert_eq!(problem("y"), TtlProblem::MissingNumber("y".into()));
        assert_eq!(problem("."), TtlProblem::MissingNumber(".".into()));
        assert_eq!(problem("293y"), TtlProblem::Overflow);
        assert_eq!(problem("99999999999999999999999999h"), TtlProblem::Overflow);
        assert_eq!(problem("9223372036854775808ns"), TtlProblem::Overflow);

        let message = "1x".parse::<Ttl>().unwrap_err().to_string();
        assert!(message.contains("\"1x\""), "{message}");
        assert!(message.contains("1y6mo"), "{message}");
    }

    #[test]
    fn the_longest_go_duration_is_accepted() {
        assert!("9223372036854775807ns".parse::<Ttl>().is_ok());
        assert!("292y".parse::<Ttl>().is_ok());
    }

    #[test]
    fn expiry_steps_the_calendar() {
        let start = datetime!(2025-03-01 10:00 UTC);
        assert_eq!(
            ttl("1y").expires_at(start),
            Some(datetime!(2026-03-01 10:00 UTC))
        );
        // 2024 is a leap year: a year from 2023-03-01 is 366 days, still the same date.
        assert_eq!(
            ttl("1y").expires_at(datetime!(2023-03-01 0:00 UTC)),
            Some(datetime!(2024-03-01 0:00 UTC))
        );
        assert_eq!(
            ttl("1mo").expires_at(datetime!(2025-01-31 0:00 UTC)),
            Some(datetime!(2025-02-28 0:00 UTC))
        );
        assert_eq!(
            ttl("1y").expires_at(datetime!(2024-02-29 0:00 UTC)),
            Some(datetime!(2025-02-28 0:00 UTC))
        );
        assert_eq!(
            ttl("1y6mo2d3h").expires_at(start),
            Some(datetime!(2026-09-03 13:00 UTC))
        );
        assert_eq!(ttl("292y").expires_at(datetime!(9800-01-01 0:00 UTC)), None);
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(
            years in 0u32..=5, months in 0u32..=30, days in 0u32..=400,
            exact in 0u64..=(1u64 << 50),
        ) {
            prop_assume!(years + months + days > 0 || exact > 0);
            let original = Ttl::checked(years, months, days, exact).unwrap();
            let parsed: Ttl = original.to_string().parse().unwrap();
            prop_assert_eq!(parsed, original);
        }

        #[test]
        fn negatives_are_always_rejected(n in 1u64..1_000_000, unit in "(ns|us|ms|s|m|h|d|w|mo|y)") {
            let value = format!("-{n}{unit}");
            prop_assert_eq!(value.parse::<Ttl>().unwrap_err().problem, TtlProblem::Negative);
        }

        #[test]
        fn beyond_go_max_duration_is_overflow(extra in 1u64..u64::MAX / 2) {
            let value = format!("{}ns", i64::MAX as u64 + extra);
            prop_assert_eq!(value.parse::<Ttl>().unwrap_err().problem, TtlProblem::Overflow);
        }

        #[test]
        fn arbitrary_text_never_panics(value in "\\PC{0,24}") {
            let _ = value.parse::<Ttl>();
        }
    }
}
